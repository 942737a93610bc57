"""What the lease table says, for people: status, history, unlock, prune, readiness.

The operator commands and the daemon's probes read and change the table only
through these functions; the statements are named blocks of ``sql/queries.sql``.

Pruning: only finished SCHEDULE rows go: a RUNNING row is a live (or stale) lease that
someone may still reclaim, and an INITIAL row is the record that a run-once job
already ran, so deleting it would run the job again. Batches stay small so a
prune never holds many row locks or one long transaction on a busy table.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from pgcrond.core.keys import Identity
from pgcrond.core.timing import to_ms
from pgcrond.storage.leases import LeaseStore

DEFAULT_BATCH_SIZE = 500


@dataclass(frozen=True)
class OpenTick:
    """A tick some replica started and nobody finished: a takeover or retry may be due."""

    code: str
    run_key: str
    # RUNNING (its owner may be dead) or FAIL (a retry is pending).
    status: str
    # A FAIL row's reason: "error", "timeout", "released", ...
    reason: str | None
    # The code its key came from, when claimed before a rename (else None).
    key_code: str | None = None


async def open_ticks(
    store: LeaseStore, codes: list[str], *, within: timedelta, limit: int = 1000
) -> list[OpenTick]:
    """Unfinished ticks of ``codes`` claimed within ``within``, oldest first, at most ``limit``."""
    rows = await store.db.fetchall(
        store.queries.get("open_ticks"),
        {"codes": codes, "within_ms": to_ms(within), "limit": limit},
    )
    return [
        OpenTick(row["code"], row["run_key"], row["status"], row["reason"], row["key_code"])
        for row in rows
    ]


async def codes_with_history(store: LeaseStore, codes: list[str]) -> list[str]:
    """Which of ``codes`` have any row in the lease table."""
    rows = await store.db.fetchall(store.queries.get("codes_with_history"), {"codes": codes})
    return [row["code"] for row in rows]


async def abandon_stale(store: LeaseStore, after: timedelta) -> int:
    """Close SCHEDULE rows left RUNNING ``after`` past their lease expiry; returns how many."""
    return await store.db.execute(store.queries.get("abandon_stale"), {"after_ms": to_ms(after)})


async def prune(
    store: LeaseStore,
    older_than: timedelta,
    *,
    batch_size: int = DEFAULT_BATCH_SIZE,
    on_batch: Callable[[int], None] | None = None,
    only: Sequence[str] | None = None,
    excluding: Sequence[str] = (),
) -> int:
    """Delete finished SCHEDULE rows whose ``finished_at`` is older than ``older_than``.

    Of the jobs ``only`` (None: every job) except those ``excluding``.

    Loops until a batch deletes fewer than ``batch_size`` rows; returns the
    total. ``on_batch(deleted)`` is told after each batch (progress output).
    The caller logs the outcome: the CLI prints to a terminal, the daemon logs.
    """
    if batch_size < 1:
        raise ValueError(f"batch_size must be at least 1, got {batch_size}")
    params = {
        "older_than_ms": to_ms(older_than),
        "batch_size": batch_size,
        "only_codes": None if only is None else list(only),
        "except_codes": list(excluding),
    }
    total = 0
    while True:
        deleted = await store.db.execute(store.queries.get("prune_batch"), params)
        total += deleted
        if on_batch is not None:
            on_batch(deleted)
        if deleted < batch_size:
            break
    return total


async def table_exists(store: LeaseStore) -> bool:
    """Whether the lease table was migrated (so a command can say "run migrate")."""
    found = await store.db.fetchone(
        store.queries.get("table_exists"), {"name": store.queries.table_name}
    )
    return bool(found and found["present"])


async def ping(store: LeaseStore) -> None:
    """Readiness: raises :class:`~pgcrond.errors.PgcrondError` unless the database answers."""
    await store.db.fetchone(store.queries.get("ping"))


async def job_status(store: LeaseStore, codes: list[str]) -> list[dict[str, Any]]:
    """One row per code, in order: last finished run, live or stale RUNNING row, failures."""
    return list(await store.db.fetchall(store.queries.get("job_status"), {"codes": codes}))


async def history(
    store: LeaseStore,
    *,
    code: str | None = None,
    since: datetime | None = None,
    status: str | None = None,
    limit: int = 50,
    internal: bool = True,
) -> list[dict[str, Any]]:
    """Past runs, newest first; every filter optional.

    ``internal=False`` leaves out pgcrond's own rows (codes ``pgcrond:…``).
    """
    rows = await store.db.fetchall(
        store.queries.get("history"),
        {"code": code, "since": since, "status": status, "limit": limit, "internal": internal},
    )
    return list(rows)


async def unlock_row(store: LeaseStore, identity: Identity) -> dict[str, Any] | None:
    """The row of ``identity`` as ``pgcrond unlock`` shows it, or None."""
    return await store.db.fetchone(
        store.queries.get("unlock_show"),
        {"lock_key": identity.idempotency_key, "code": identity.code},
    )


async def unlock_release(
    store: LeaseStore, identity: Identity, *, status: str, owner_token: uuid.UUID, note: str
) -> bool:
    """Release the row as shown (same status and token); False if it moved on meanwhile."""
    released = await store.db.fetchone(
        store.queries.get("unlock_release"),
        {
            "lock_key": identity.idempotency_key,
            "code": identity.code,
            "status": status,
            "owner_token": owner_token,
            "error": note,
        },
    )
    return released is not None
