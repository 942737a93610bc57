"""Backfills: a job's past ticks filed at once as requests, and where they stand.

``pgcrond backfill`` reads what each tick of its range has (:func:`tick_rows`),
files the ticks to run in one statement (:func:`file_backfill`: each gets a
lease row FAIL/backfill due now and a request under its own run key, taken
by the replicas at most ``max_parallel`` at a time; see ``take_requests`` in
``sql/queries.sql``), and follows them (:func:`progress`). The status page
shows the backfills with a tick still to run (:func:`running`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from psycopg.types.json import Jsonb

from pgcrond.core.keys import Identity
from pgcrond.core.schedule import run_key_for
from pgcrond.core.timing import to_ms
from pgcrond.errors import PgcrondError
from pgcrond.storage.leases import LeaseStore
from pgcrond.storage.requests import channel


@dataclass(frozen=True)
class TickRow:
    """What one tick of a backfill's range has: its lease row, a request not done."""

    run_key: str
    status: str | None
    reason: str | None
    owner: str | None
    retry_pending: bool
    pending_by: str | None


async def tick_rows(store: LeaseStore, code: str, run_keys: Sequence[str]) -> dict[str, TickRow]:
    """Each run key's lease row and pending request, by run key."""
    rows = await store.db.fetchall(
        store.queries.get("backfill_rows"), {"code": code, "run_keys": list(run_keys)}
    )
    return {
        row["run_key"]: TickRow(
            row["run_key"],
            row["status"],
            row["reason"],
            row["owner"],
            row["retry_at"] is not None,
            row["pending_by"],
        )
        for row in rows
    }


@dataclass(frozen=True)
class Filed:
    """A backfill as filed: its id, and the run keys it filed (the others were left alone)."""

    id: int
    requested_at: datetime
    run_keys: tuple[str, ...]


async def file_backfill(
    store: LeaseStore,
    code: str,
    ticks: Sequence[datetime],
    *,
    span: tuple[datetime, datetime],
    by: str,
    max_parallel: int,
    lease: timedelta,
    params: Mapping[str, str],
    concurrency: str | None = None,
) -> Filed:
    """File ``ticks`` of ``code`` as one backfill of ``span``, and wake every replica."""
    run_keys = [run_key_for(tick) for tick in ticks]
    row = await store.db.fetchone(
        store.queries.get("backfill_file"),
        {
            "code": code,
            "range_from": span[0],
            "range_to": span[1],
            "by": by,
            "max_parallel": max_parallel,
            "lock_keys": [Identity.schedule(code, key).idempotency_key for key in run_keys],
            "run_keys": run_keys,
            "ticks": list(ticks),
            "lease_ms": to_ms(lease),
            "params": Jsonb(dict(params)) if params else None,
            "concurrency": concurrency,
            "channel": channel(store),
        },
    )
    if row is None:  # pragma: no cover - the statement selects one row from `backfill`
        raise PgcrondError("the backfill statement returned no row")
    return Filed(int(row["id"]), row["requested_at"], tuple(row["filed"]))


async def progress(store: LeaseStore, backfill: int) -> list[dict[str, Any]]:
    """Each filed tick's request and lease row as they are now, in tick order."""
    return list(await store.db.fetchall(store.queries.get("backfill_progress"), {"id": backfill}))


async def running(store: LeaseStore, code: str | None = None) -> list[dict[str, Any]]:
    """The backfills (of ``code``, or all) with a tick still to run, with their counts."""
    return list(await store.db.fetchall(store.queries.get("running_backfills"), {"code": code}))
