"""The views' JSON: rows as ``pgcrond status --json`` / ``history --json`` name their fields.

Pure: rows in, dicts out (the HTML is drawn from these same dicts).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from datetime import datetime
from typing import Any

from pgcrond import report
from pgcrond.config.models import JobConfig
from pgcrond.daemon.page.memo import ScheduleMemo
from pgcrond.storage import status as reads


def running_entry(row: Mapping[str, Any]) -> dict[str, Any]:
    """A RUNNING row: the ``running`` fields of ``status --json``, and the job's own."""
    return {
        "job": row["code"],
        "type": row["type"],
        "run_key": row["run_key"],
        "owner": row["owner"],
        "attempt": row["attempt"],
        "since": row["acquired_at"],
        "heartbeat_at": row["heartbeat_at"],
        "expires_at": row["expires_at"],
        "stale": row["stale"],
        "fencing_token": row["fencing_token"],
        "idempotency_key": row["lock_key"],
        "trigger": row["trigger"],
    }


def backfill_entry(row: Mapping[str, Any]) -> dict[str, Any]:
    """A backfill with a tick still to run: its range, who filed it, where its ticks stand."""
    return {
        "backfill": row["id"],
        "job": row["code"],
        "from": row["range_from"],
        "to": row["range_to"],
        "requested_by": row["requested_by"],
        "requested_at": row["requested_at"],
        "max_parallel": row["max_parallel"],
        "done": row["done"],
        "running": row["running"],
        "left": row["left_"],
    }


def request_entry(row: Mapping[str, Any]) -> dict[str, Any]:
    """A request: who asked for which run key, when, who took it and how it ended."""
    return {
        "run_key": row["run_key"],
        "requested_by": row["requested_by"],
        "requested_at": row["requested_at"],
        "taken_by": row["taken_by"],
        "taken_at": row["taken_at"],
        "done_at": row["done_at"],
        "outcome": row["outcome"],
        "trigger": row["trigger"],
        "params": report.params_entry(row["params"]),
    }


def attempt_entry(row: Mapping[str, Any]) -> dict[str, Any]:
    """An attempt record with its output: ``pgcrond logs --json``'s fields."""
    return {"run_key": row["run_key"], **report.attempt_entry(row, output=True)}


def tick_entry(row: Mapping[str, Any]) -> dict[str, Any]:
    """A row as ``pgcrond history --json`` prints it, with its idempotency key."""
    return {**report.history_entry(row), "idempotency_key": row["lock_key"], "stale": row["stale"]}


def job_entry(
    job: JobConfig,
    row: Mapping[str, Any],
    ticks: reads.JobTicks,
    now: datetime,
    next_fires: int,
    *,
    memo: ScheduleMemo,
) -> dict[str, Any]:
    entry = report.status_entry(job, row, now)
    fires = memo.next_fires(job, now, next_fires)
    entry.update(
        {
            "description": job.description,
            "timezone": job.timezone.key,
            "next_fires": [{"at": fire, "local": _local(fire, job)} for fire in fires[:next_fires]],
            "last_success": ticks.last_success,
            "last_failure": ticks.last_failure,
            "stale": _stale(job, ticks.last_success, now),
            "ticks": strip_cells(job, ticks.strip, now, memo),
        }
    )
    return entry


def strip_cells(
    job: JobConfig, strip: list[reads.StripTick], now: datetime, memo: ScheduleMemo
) -> list[dict[str, Any]]:
    """The strip in tick order, oldest first, with a ``NO_ROW`` cell where ticks left no row.

    A tick that no replica claimed leaves no row: by the schedule, the tick
    after one row's should be the next row's. Ticks after the newest row count
    once their ``misfire_grace`` is over (until then a replica may still claim
    them). A manual run (``manual:…``) sits where it was claimed.
    """
    # Run keys of ticks spell UTC instants in one fixed width, so they sort as
    # strings; a manual run sorts by when it was claimed, in the same spelling.
    placed = sorted(
        ((memo.tick(t.run_key), t) for t in strip),
        key=lambda pair: (
            pair[1].run_key
            if pair[0] is not None and pair[1].run_key is not None
            else report.iso(pair[1].acquired_at) or ""
        ),
    )
    ticks = [at for at, _ in placed if at is not None]
    cells: list[dict[str, Any]] = []
    seen = 0
    for at, row in placed:
        cells.append({"run_key": row.run_key, "status": row.status, "reason": row.reason})
        if at is None or row.run_key is None:
            continue
        seen += 1
        expected = memo.tick_after(job, row.run_key)
        if expected is None:
            continue
        following = ticks[seen] if seen < len(ticks) else None
        if following is not None and expected < following:
            cells.append(_no_row(expected, following))
        elif following is None and expected + job.misfire_grace < now:
            cells.append(_no_row(expected, None))
    return cells[-reads.STRIP_TICKS :]


def _no_row(first: datetime, until: datetime | None) -> dict[str, Any]:
    return {
        "run_key": report.iso(first, precise=False),
        "status": "NO_ROW",
        "reason": "missed",
        "until": report.iso(until, precise=False),
    }


def _stale(job: JobConfig, last_success: Mapping[str, Any] | None, now: datetime) -> bool | None:
    """Whether the job has not succeeded for its ``alert_after``; None without one.

    Judged from the newest SUCCESS the page scans; a job with none in view is
    stale once it has an ``alert_after`` (the daemon's gauge counts from its
    own start instead: the page has no start to count from).
    """
    if job.alert_after is None:
        return None
    if last_success is None or last_success.get("finished_at") is None:
        return True
    finished: datetime = last_success["finished_at"]
    return now - finished > job.alert_after


def _local(fire: datetime, job: JobConfig) -> str:
    return fire.astimezone(job.timezone).strftime("%Y-%m-%d %H:%M:%S %Z")


def to_json(value: Mapping[str, Any]) -> str:
    """The JSON of a view: instants as ``report.iso`` spells them (UTC, ``Z``)."""
    return json.dumps(value, ensure_ascii=False, default=_json_default) + "\n"


def _json_default(value: object) -> object:
    if isinstance(value, datetime):
        return report.iso(value)
    raise TypeError(f"{type(value).__name__} is not JSON serialisable")
