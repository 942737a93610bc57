"""Renamed jobs (``renamed_from``): their old codes' rows move to the new code.

Done by every replica at start and on reload, before its first fire, in one
transaction under a transaction-scoped advisory lock: replicas starting
together queue on the lock, and each after the first finds nothing left to
move. What moves, and what stays, is written at ``rename_job`` in
``sql/queries.sql``.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from pgcrond.core.keys import Identity, lock_id
from pgcrond.storage.leases import LeaseStore


@dataclass(frozen=True)
class Moved:
    """What one rename moved: tick rows, the run-once row (0/1), the pause (0/1)."""

    code: str
    old: tuple[str, ...]
    ticks: int
    initial: int
    paused: int


async def apply_renames(
    store: LeaseStore, renames: Iterable[tuple[str, tuple[str, ...]]]
) -> list[Moved]:
    """Move each ``(code, old codes)``'s rows; what moved, for the renames that moved any."""
    todo = [(code, old) for code, old in renames if old]
    if not todo:
        return []
    moved: list[Moved] = []
    async with store.db.connection() as conn, conn.transaction():
        await conn.execute(
            store.queries.get("rename_lock"),
            {"lock_id": lock_id(f"rename:{store.queries.schema}.{store.queries.table}")},
        )
        for code, old in todo:
            cursor = await conn.execute(
                store.queries.get("rename_job"),
                {
                    "code": code,
                    "old": list(old),
                    "initial_key": Identity.initial(code).idempotency_key,
                },
            )
            row = await cursor.fetchone()
            assert row is not None  # scalar subqueries always answer
            if row["ticks"] or row["initial"] or row["paused"]:
                moved.append(Moved(code, old, row["ticks"], row["initial"], row["paused"]))
    return moved
