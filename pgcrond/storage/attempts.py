"""Attempt records: what each attempt of a tick left behind (the ``_attempts`` table).

A record is started by the claim that wins (status ``running``) and closed by
the same finalize that records the tick's outcome, in one statement
(``finalize`` in ``sql/queries.sql``); a claim that takes a tick over closes
the dead owner's record as ``lost``. This module turns a run's ending into
the finalize's columns and reads the records back for ``pgcrond logs``,
``pgcrond history`` and the status page. Records go with their lease row
(``ON DELETE CASCADE``), so pruning the history prunes them.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from pgcrond.run.attempt import RunResult
from pgcrond.run.output import OutputTail, StreamTail

if TYPE_CHECKING:
    from pgcrond.storage.leases import LeaseStore

# How an attempt ended, in its record: a finalize's outcome, or "lost" (closed
# by whoever took its tick over, released or abandoned it), or still "running".
ATTEMPT_STATUSES = ("running", "success", "fail", "timeout", "released", "lost")


@dataclass(frozen=True)
class AttemptEnd:
    """What a finished attempt tells its record besides the outcome."""

    exit_code: int | None = None
    duration_s: float | None = None
    output: OutputTail = field(default_factory=OutputTail)

    @classmethod
    def of(cls, result: RunResult | None) -> AttemptEnd | None:
        if result is None:
            return None
        return cls(result.exit_code, result.duration_s, result.output)


def columns(end: AttemptEnd | None) -> dict[str, Any]:
    """One record's closing columns (``attempt_close``)."""
    output = OutputTail() if end is None else end.output
    return {
        "exit_code": None if end is None else end.exit_code,
        "duration_ms": None if end is None or end.duration_s is None else end.duration_s * 1000,
        "stdout_head": output.stdout.head,
        "stdout_tail": output.stdout.tail,
        "stdout_dropped": output.stdout.dropped,
        "stderr_head": output.stderr.head,
        "stderr_tail": output.stderr.tail,
        "stderr_dropped": output.stderr.dropped,
    }


def finalize_columns(ends: Sequence[AttemptEnd | None]) -> dict[str, list[Any]]:
    """The same columns as the finalize's arrays, one entry per outcome of its batch."""
    rows = [columns(end) for end in ends]
    arrays = {
        "exit_codes": "exit_code",
        "durations_ms": "duration_ms",
        "stdout_heads": "stdout_head",
        "stdout_tails": "stdout_tail",
        "stdout_dropped": "stdout_dropped",
        "stderr_heads": "stderr_head",
        "stderr_tails": "stderr_tail",
        "stderr_dropped": "stderr_dropped",
    }
    return {array: [row[name] for row in rows] for array, name in arrays.items()}


async def of_job(
    store: LeaseStore,
    code: str,
    *,
    run_key: str | None = None,
    attempt: int | None = None,
    limit: int = 1,
) -> list[dict[str, Any]]:
    """A job's attempt records with their output, newest first."""
    rows = await store.db.fetchall(
        store.queries.get("attempts"),
        {"code": code, "run_key": run_key, "attempt": attempt, "limit": limit},
    )
    return list(rows)


async def of_rows(
    store: LeaseStore, ids: Sequence[int], *, output: bool = False
) -> dict[int, list[dict[str, Any]]]:
    """The attempt records of these lease rows, by row id, oldest first."""
    found: dict[int, list[dict[str, Any]]] = {lease_id: [] for lease_id in ids}
    if not ids:
        return found
    rows = await store.db.fetchall(
        store.queries.get("attempts_of"), {"ids": list(ids), "output": output}
    )
    for row in rows:
        found[row["lease_id"]].append(row)
    return found


def output_of(row: Mapping[str, Any]) -> OutputTail:
    """A record's output as kept (empty streams where the record has none)."""

    def stream(name: str) -> StreamTail:
        return StreamTail(
            bytes(row.get(f"{name}_head") or b""),
            bytes(row.get(f"{name}_tail") or b""),
            int(row.get(f"{name}_dropped") or 0),
        )

    return OutputTail(stream("stdout"), stream("stderr"))
