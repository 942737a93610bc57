"""Renamed jobs (``renamed_from``): their old codes' rows move to the new code.

A run-once job's state moves too, and each of its old codes' INITIAL key is marked
(SKIPPED/renamed), so a run-once job that ran runs no more under either
code, and one that has not runs once, under the new code, even with replicas
of the old config still starting.

Done by every replica at start and on reload, before its first fire, in one
transaction under a transaction-scoped advisory lock: replicas starting
together queue on the lock, and each after the first finds nothing left to
move. What moves, and what stays, is written at ``rename_job`` in
``sql/queries.sql``.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable
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
    store: LeaseStore, renames: Iterable[tuple[str, tuple[str, ...]]], once: Collection[str] = ()
) -> list[Moved]:
    """Move each ``(code, old codes)``'s rows; what moved, for the renames that moved any.

    ``once``: the codes of run-once jobs, whose old codes' INITIAL keys are marked.
    """
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
            params = {
                "code": code,
                "old": list(old),
                "initial_key": Identity.initial(code).idempotency_key,
                "old_keys": [Identity.initial(o).idempotency_key for o in old],
                "owner": store.owner,
            }
            await conn.execute(store.queries.get("rename_reclaim_initial"), params)
            cursor = await conn.execute(store.queries.get("rename_job"), params)
            row = await cursor.fetchone()
            assert row is not None  # scalar subqueries always answer
            if code in once:
                await conn.execute(store.queries.get("rename_mark_initial"), params)
            if row["ticks"] or row["initial"] or row["paused"]:
                moved.append(Moved(code, old, row["ticks"], row["initial"], row["paused"]))
    return moved
