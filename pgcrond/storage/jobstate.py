"""Cluster-wide job state: pause and resume (the job-state table), and failures in a row.

A row is a paused job (code ``'*'``: every job). Nothing polls it: the claim
statement reads it in its own round trip (``claim`` in ``sql/queries.sql``),
so every replica honours a pause at the job's next tick, with no reload. A
resume NOTIFYs the resumed channel, so that the takeovers, retries and
run-once jobs that wait for it claim again at once. A job's failures in a row
(:func:`failure_streak`) tell a success that it is a recovery, and pause a job
with ``pause_after_failures`` (paused by ``pgcrond``, saying why).
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime

from pgcrond.core.keys import Identity
from pgcrond.storage.leases import LeaseStore
from pgcrond.storage.requests import channel

ALL_JOBS = "*"


@dataclass(frozen=True)
class Pause:
    """One pause in force: the job (or ``*``), who paused it, when, and why."""

    code: str
    paused_by: str
    paused_at: datetime
    reason: str | None

    def describe(self) -> str:
        why = f": {self.reason}" if self.reason else ""
        # ISO-8601 UTC to the second, as the SKIPPED row's detail spells it.
        at = self.paused_at.astimezone(UTC).isoformat(timespec="seconds").replace("+00:00", "Z")
        return f"paused by {self.paused_by} at {at}{why}"


async def pause(store: LeaseStore, codes: list[str], *, by: str, reason: str | None) -> list[Pause]:
    """Pause ``codes`` (``[ALL_JOBS]`` for every job); the pauses now in force for them."""
    rows = await store.db.fetchall(
        store.queries.get("pause_jobs"), {"codes": codes, "by": by, "reason": reason}
    )
    return [_pause(row) for row in rows]


async def resume(store: LeaseStore, codes: list[str], *, all_jobs: bool = False) -> list[str]:
    """Resume ``codes`` (every pause with ``all_jobs``); the codes whose pause was lifted."""
    rows = await store.db.fetchall(
        store.queries.get("resume_jobs"),
        {"codes": codes, "all_jobs": all_jobs, "channel": channel(store, "resumed")},
    )
    return sorted(row["code"] for row in rows)


async def paused(store: LeaseStore) -> dict[str, Pause]:
    """Every pause in force, by code (``*`` when every job is paused)."""
    rows = await store.db.fetchall(store.queries.get("paused_jobs"))
    return {row["code"]: _pause(row) for row in rows}


async def failure_streak(store: LeaseStore, identity: Identity) -> int:
    """The job's failed ticks in a row since its newest SUCCESS other than ``identity``'s."""
    row = await store.db.fetchone(
        store.queries.get("failure_streak"),
        {"code": identity.code, "type": identity.type, "run_key": identity.run_key},
    )
    return 0 if row is None else int(row["failures"])


def pause_of(pauses: dict[str, Pause], code: str) -> Pause | None:
    """The pause that holds ``code``: its own, else the one of every job."""
    return pauses.get(code) or pauses.get(ALL_JOBS)


def _pause(row: dict[str, object]) -> Pause:
    return Pause(
        str(row["code"]),
        str(row["paused_by"]),
        row["paused_at"],  # type: ignore[arg-type]
        None if row["reason"] is None else str(row["reason"]),
    )
