"""Rows for people and for programs: aligned text tables and JSON.

Every instant is shown in UTC with a ``Z``, the same spelling as run keys, so a
run key and the times next to it can be compared by eye.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime, timedelta
from typing import Any

from pgcrond.config.models import JobConfig
from pgcrond.core import params
from pgcrond.core.durations import format_duration
from pgcrond.core.output import safe
from pgcrond.core.schedule import AtSchedule, OnceSchedule, written
from pgcrond.storage import attempts
from pgcrond.storage.registry import Drift, LiveReplica

NONE = "-"


# Of a config hash, where a table shows it (enough to tell a handful apart).
CONFIG_HASH_SHOWN = 8


def iso(value: datetime | None, *, precise: bool = True) -> str | None:
    """``2026-03-29T03:00:12.345Z``; whole seconds when not ``precise`` (tables)."""
    if value is None:
        return None
    spec = "milliseconds" if precise else "seconds"
    return value.astimezone(UTC).isoformat(timespec=spec).replace("+00:00", "Z")


def when(value: datetime | None) -> str:
    return iso(value, precise=False) or NONE


def seconds(value: timedelta | None) -> float | None:
    return None if value is None else round(value.total_seconds(), 3)


def took(total: float | None) -> str:
    """A run's duration in seconds for a table: ``850ms``, ``12.3s``, ``4m5s``."""
    if total is None:
        return NONE
    if total < 1:
        return f"{round(total * 1000)}ms"
    if total < 60:
        return f"{total:.1f}s"
    return format_duration(timedelta(seconds=round(total)))


def span(delta: timedelta) -> str:
    """``5h12m`` / ``3m``: how long, either way, to whole seconds (minutes beyond an hour)."""
    total = round(abs(delta.total_seconds()))
    if total >= 3600:
        total -= total % 60
    return format_duration(timedelta(seconds=total))


def relative(delta: timedelta) -> str:
    """``in 5h12m`` / ``3m ago``, as :func:`span` rounds."""
    text = span(delta)
    return f"in {text}" if delta >= timedelta(0) else f"{text} ago"


def first_line(text: str | None, width: int) -> str:
    """The first line of an error, cut to ``width`` characters with an ellipsis."""
    lines = (text or "").strip().splitlines()
    if not lines:
        return NONE
    line = lines[0]
    return line if len(line) <= width else line[: width - 1] + "…"


def table(headers: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    """Columns padded to their widest cell; the last column is not padded."""
    widths = [max(len(str(cell)) for cell in column) for column in zip(headers, *rows, strict=True)]
    lines = []
    for cells in (headers, *rows):
        padded = [cell.ljust(width) for cell, width in zip(cells, widths, strict=True)]
        lines.append("  ".join(padded).rstrip())
    return "\n".join(lines)


def to_json(value: Sequence[Mapping[str, Any]] | Mapping[str, Any]) -> str:
    """One JSON document, instants as ISO-8601 UTC with milliseconds."""
    return json.dumps(value, indent=2, ensure_ascii=False, default=_json_default)


def schedule_text(job: JobConfig) -> str:
    """The schedule as written, for narrow tables: ``0 3 * * *``, with its zone if not UTC."""
    schedule = job.schedule
    if isinstance(schedule, AtSchedule):
        return f"at {when(schedule.at)}"
    return written(schedule)


def _json_default(value: object) -> object:
    if isinstance(value, datetime):
        return iso(value)
    raise TypeError(f"{type(value).__name__} is not JSON serialisable")


def status_entry(job: JobConfig, row: Mapping[str, Any], now: datetime) -> dict[str, Any]:
    """A job as ``pgcrond status --json`` and the status page show it, from ``job_status``."""
    run_once = isinstance(job.schedule, OnceSchedule)
    last = None
    if row["last_status"] is not None:
        last = {
            "run_key": row["last_run_key"],
            "status": row["last_status"],
            "reason": row["last_reason"],
            "attempt": row["last_attempt"],
            "owner": row["last_owner"],
            "acquired_at": row["last_acquired_at"],
            "finished_at": row["last_finished_at"],
            "duration_s": seconds(row["last_finished_at"] - row["last_acquired_at"]),
            "retry_at": row["last_retry_at"],
            "error": row["last_error"],
        }
    running = None
    if row["running_owner"] is not None:
        running = {
            "run_key": row["running_run_key"],
            "owner": row["running_owner"],
            "attempt": row["running_attempt"],
            "since": row["running_acquired_at"],
            "expires_at": row["running_expires_at"],
            "stale": row["running_stale"],
        }
    # A run-once job is tried at every start until its INITIAL row is done.
    once_done = last is not None and (last["status"] == "SUCCESS" or last["retry_at"] is None)
    return {
        "job": job.code,
        "schedule": job.schedule.describe(),
        "guard": job.guard,
        "next_fire": None if run_once else job.schedule.next_after(now),
        "runs_at_start": run_once and not once_done,
        "last_run": last,
        "running": running,
        "consecutive_failures": row["consecutive_failures"],
    }


def history_entry(row: Mapping[str, Any]) -> dict[str, Any]:
    """A lease row as ``pgcrond history --json`` (and the status page) shows it."""
    finished = row["finished_at"]
    return {
        "id": row["id"],
        "job": row["code"],
        "type": row["type"],
        "run_key": row["run_key"],
        "status": row["status"],
        "reason": row["reason"],
        "attempt": row["attempt"],
        "owner": row["owner"],
        "fencing_token": row["fencing_token"],
        "acquired_at": row["acquired_at"],
        "finished_at": finished,
        "expires_at": row["expires_at"],
        "retry_at": row["retry_at"],
        "duration_s": None if finished is None else seconds(finished - row["acquired_at"]),
        "error": row["error"],
        "params": params_entry(row.get("params")),
    }


def params_entry(given: Mapping[str, str] | None) -> dict[str, str]:
    """A run's parameters fit to print: secret-looking ones as ``***``, the rest escaped."""
    return {safe(name): safe(value) for name, value in params.shown(given).items()}


def attempt_entry(row: Mapping[str, Any], *, output: bool = False) -> dict[str, Any]:
    """An attempt record as ``pgcrond logs`` / ``history --json`` and the status page show it.

    Its text is safe to print anywhere (control characters and invalid UTF-8
    escaped); ``output`` adds the kept head and tail of each stream.
    """
    started, finished = row["started_at"], row["finished_at"]
    duration_ms = row["duration_ms"]
    if duration_ms is not None:
        duration = round(duration_ms / 1000, 3)
    else:
        duration = None if finished is None else seconds(finished - started)
    entry = {
        "attempt": row["attempt"],
        "status": row["status"],
        "replica": safe(row["replica"]),
        "fencing_token": row["fencing_token"],
        "started_at": started,
        "finished_at": finished,
        "duration_s": duration,
        "exit_code": row["exit_code"],
        "error": None if row["error"] is None else safe(row["error"]),
        "trigger": row.get("trigger"),
    }
    if output:
        entry["output"] = attempts.output_of(row).as_json()
    return entry


def pause_entry(job: JobConfig, pause: Any | None) -> dict[str, Any] | None:
    """Whether ``job`` is paused, and by whom: ``suspended: true``, else a stored pause.

    ``pause`` is the job's :class:`~pgcrond.storage.jobstate.Pause`, or None.
    """
    if job.suspended:
        return {"source": "config", "detail": f"suspended: true in {job.source}"}
    if pause is None:
        return None
    return {
        "source": "database",
        "code": pause.code,
        "by": pause.paused_by,
        "at": pause.paused_at,
        "reason": pause.reason,
    }


def replica_entry(replica: LiveReplica) -> dict[str, Any]:
    """A live replica of the registry, as `status` and the status page show it."""
    return {
        "name": replica.name,
        "version": replica.version,
        "config_hash": replica.config_hash,
        "config_since": replica.config_at,
        "started_at": replica.started_at,
        "last_seen": replica.last_seen,
        "jobs": len(replica.job_hashes),
    }


def drift_entry(found: Drift | None) -> dict[str, Any] | None:
    """Drift as JSON: null when every live replica runs one config."""
    if found is None:
        return None
    return {"since": found.since, "configs": found.configs, "jobs": found.jobs}


def replicas_text(replicas: Sequence[LiveReplica], found: Drift | None, now: datetime) -> str:
    """The replicas section of `pgcrond status`: the registry's live rows and the drift."""
    if not replicas:
        return "no live replica in the registry (none running, or none since this version)"
    lines = [
        table(
            ["REPLICA", "VERSION", "CONFIG", "STARTED", "LAST SEEN"],
            [
                [
                    r.name,
                    r.version,
                    r.config_hash[:CONFIG_HASH_SHOWN],
                    when(r.started_at),
                    relative(r.last_seen - now),
                ]
                for r in replicas
            ],
        )
    ]
    if found is None:
        shown = replicas[0].config_hash[:CONFIG_HASH_SHOWN]
        lines.append(f"no drift: every live replica runs config {shown}")
        return "\n".join(lines)
    configs = "; ".join(
        f"{key[:CONFIG_HASH_SHOWN]} on {', '.join(names)}" for key, names in found.configs.items()
    )
    lines.append(
        f"DRIFT since {when(found.since)} ({relative(found.since - now)}): "
        f"{len(found.configs)} configs: {configs}"
    )
    for code, by_hash in found.jobs.items():
        differ = "; ".join(f"{key} on {', '.join(names)}" for key, names in by_hash.items())
        lines.append(f"  job {code}: {differ}")
    return "\n".join(lines)
