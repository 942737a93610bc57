"""What the status page reads: bounded, indexed queries run only when someone asks.

Each function is one named statement of ``sql/queries.sql`` (``status_page_*``)
on one pooled connection. Nothing here runs on a timer: a page nobody looks at
costs the database nothing. Every statement carries a LIMIT and walks an index
of the lease table, so a request costs about the same with a month of history
as with an hour of it.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from pgcrond.core.timing import to_ms
from pgcrond.storage.leases import LeaseStore

# The tick strip: how many of a job's newest rows the jobs view shows.
STRIP_TICKS = 24
# Last success / last failure are looked for among this many newest rows, so a
# job that has failed ten thousand times in a row does not scan its history.
SCAN_TICKS = 200
RUNNING_LIMIT = 500
TICKS_LIMIT = 100
REQUESTS_LIMIT = 5
REPLICAS_WITHIN = timedelta(hours=1)
REPLICAS_LIMIT = 5000


@dataclass(frozen=True)
class StripTick:
    """One cell of a job's tick strip."""

    run_key: str | None
    status: str
    reason: str | None
    acquired_at: datetime


@dataclass(frozen=True)
class JobTicks:
    """A job's newest rows in brief, and its newest SUCCESS and FAIL among ``SCAN_TICKS``."""

    code: str
    # Newest first.
    strip: list[StripTick]
    last_success: dict[str, Any] | None
    last_failure: dict[str, Any] | None


async def _per_job(store: LeaseStore, name: str, params: dict[str, Any]) -> list[dict[str, Any]]:
    """A per-job statement (a lateral per code) with JIT off, still one round trip."""
    return list(
        await store.db.fetchall_after(
            store.queries.get("status_page_no_jit"), store.queries.get(name), params
        )
    )


async def job_status(store: LeaseStore, codes: list[str]) -> list[dict[str, Any]]:
    """The rows of ``pgcrond status`` (the ``job_status`` statement), one per code, in order."""
    return await _per_job(store, "job_status", {"codes": codes})


async def failing(store: LeaseStore, codes: list[str]) -> list[str]:
    """The codes whose newest finished run failed, in order."""
    return [row["code"] for row in await _per_job(store, "status_page_failing", {"codes": codes})]


async def job_ticks(
    store: LeaseStore, codes: list[str], *, strip: int = STRIP_TICKS, scan: int = SCAN_TICKS
) -> list[JobTicks]:
    """One :class:`JobTicks` per code, in order."""
    rows = await _per_job(store, "status_page_jobs", {"codes": codes, "strip": strip, "scan": scan})
    return [_job_ticks(row) for row in rows]


def _job_ticks(row: dict[str, Any]) -> JobTicks:
    statuses: list[str] = row["statuses"] or []
    cells = [
        StripTick(run_key, status, reason, claimed)
        for status, reason, run_key, claimed in zip(
            statuses, row["reasons"] or [], row["run_keys"] or [], row["claimed"] or [], strict=True
        )
    ]
    success = None
    if row["success_acquired_at"] is not None:
        success = {
            "run_key": row["success_run_key"],
            "owner": row["success_owner"],
            "acquired_at": row["success_acquired_at"],
            "finished_at": row["success_finished_at"],
            # `pgcrond status --json` names the instant of a last success "at".
            "at": row["success_finished_at"],
        }
    failure = None
    if row["failure_acquired_at"] is not None:
        failure = {
            "run_key": row["failure_run_key"],
            "owner": row["failure_owner"],
            "reason": row["failure_reason"],
            "acquired_at": row["failure_acquired_at"],
            "finished_at": row["failure_finished_at"],
            "at": row["failure_finished_at"],
            "error": row["failure_error"],
        }
    return JobTicks(row["code"], cells, success, failure)


async def running(store: LeaseStore, *, limit: int = RUNNING_LIMIT) -> list[dict[str, Any]]:
    """Every RUNNING row (live or stale), oldest first, at most ``limit``."""
    return list(await store.db.fetchall(store.queries.get("status_page_running"), {"limit": limit}))


async def ticks(
    store: LeaseStore,
    code: str,
    *,
    limit: int = TICKS_LIMIT,
    since: datetime | None = None,
    until: datetime | None = None,
) -> list[dict[str, Any]]:
    """One job's newest rows claimed in [``since``, ``until``), newest first, at most ``limit``."""
    params = {"code": code, "limit": limit, "since": since, "until": until}
    return list(await store.db.fetchall(store.queries.get("status_page_ticks"), params))


async def requests(
    store: LeaseStore, code: str, *, limit: int = REQUESTS_LIMIT
) -> list[dict[str, Any]]:
    """One job's newest requests (``trigger --detach``, the page's Run now), newest first."""
    return list(
        await store.db.fetchall(
            store.queries.get("status_page_requests"), {"code": code, "limit": limit}
        )
    )


@dataclass(frozen=True)
class ReplicaSeen:
    """A replica (its owner name) and what its rows in the window say about it."""

    owner: str
    first_seen: datetime
    last_seen: datetime
    runs: int
    running: int
    successes: int
    failures: int


async def replicas(
    store: LeaseStore, *, within: timedelta = REPLICAS_WITHIN, limit: int = REPLICAS_LIMIT
) -> list[ReplicaSeen]:
    """Owners of rows finished within ``within`` or RUNNING now, most recently seen first."""
    rows = await store.db.fetchall(
        store.queries.get("status_page_replicas"),
        {"within_ms": to_ms(within), "limit": limit},
    )
    return [
        ReplicaSeen(
            row["owner"],
            row["first_seen"],
            row["last_seen"],
            row["runs"],
            row["running"],
            row["successes"],
            row["failures"],
        )
        for row in rows
    ]
