"""Attempt records: what each attempt of a tick left behind (the ``_attempts`` table).

A record is started by the claim that wins (status ``running``) and closed by
the same finalize that records the tick's outcome, in one statement
(``finalize`` in ``sql/queries.sql``); a claim that takes a tick over closes
the dead owner's record as ``lost``. :mod:`pgcrond.storage.attempt_end` turns a run's
ending into the finalize's columns; this module reads the records back for
``pgcrond logs``, ``pgcrond history`` and the status page. Records go with their lease row
(``ON DELETE CASCADE``), so pruning the history prunes them.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from pgcrond.core.output import OutputTail, StreamTail
from pgcrond.storage.leases import LeaseStore


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
