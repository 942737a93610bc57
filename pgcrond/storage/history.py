"""Pruning old history from the lease table, for ``pgcrond prune`` and the daemon.

Only finished SCHEDULE rows go: a RUNNING row is a live (or stale) lease that
someone may still reclaim, and an INITIAL row is the record that a run-once job
already ran, so deleting it would run the job again. Batches stay small so a
prune never holds many row locks or one long transaction on a busy table.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import timedelta

from pgcrond.core.timing import to_ms
from pgcrond.storage.leases import LeaseStore

DEFAULT_BATCH_SIZE = 500


async def abandon_stale(store: LeaseStore, after: timedelta) -> int:
    """Close SCHEDULE rows left RUNNING ``after`` past their lease expiry; returns how many."""
    return await store.db.execute(store.queries.get("abandon_stale"), {"after_ms": to_ms(after)})


async def prune(
    store: LeaseStore,
    older_than: timedelta,
    *,
    batch_size: int = DEFAULT_BATCH_SIZE,
    on_batch: Callable[[int], None] | None = None,
) -> int:
    """Delete finished SCHEDULE rows whose ``finished_at`` is older than ``older_than``.

    Loops until a batch deletes fewer than ``batch_size`` rows; returns the
    total. ``on_batch(deleted)`` is told after each batch (progress output).
    The caller logs the outcome: the CLI prints to a terminal, the daemon logs.
    """
    if batch_size < 1:
        raise ValueError(f"batch_size must be at least 1, got {batch_size}")
    params = {"older_than_ms": to_ms(older_than), "batch_size": batch_size}
    total = 0
    while True:
        deleted = await store.db.execute(store.queries.get("prune_batch"), params)
        total += deleted
        if on_batch is not None:
            on_batch(deleted)
        if deleted < batch_size:
            break
    return total
