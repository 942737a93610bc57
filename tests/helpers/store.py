"""Shared helpers for lease-store tests: a migrated store, its rows, the database's clock."""

from __future__ import annotations

import asyncio
import multiprocessing
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from datetime import UTC, datetime, timedelta
from multiprocessing.context import ForkServerContext
from typing import Any

import psycopg
import psycopg.rows

from pgcrond.config.models import Config
from pgcrond.daemon.accounting import Accounting, FireNow
from pgcrond.daemon.metrics import Metrics
from pgcrond.fire import Firing
from pgcrond.storage.db import Database
from pgcrond.storage.leases import LeaseStore
from pgcrond.storage.migrate import migrate as migrate_store
from pgcrond.tickplan import CLAIM_AHEAD_MAX


@asynccontextmanager
async def open_store(
    dsn: str, schema: str, *, owner: str = "test:1", migrate: bool = True, max_size: int = 2
) -> AsyncIterator[LeaseStore]:
    db = Database(dsn, min_size=1, max_size=max_size)
    await db.open()
    try:
        store = LeaseStore(db, schema=schema, owner=owner, claim_ahead=CLAIM_AHEAD_MAX)
        if migrate:
            await migrate_store(store)
        yield store
    finally:
        await db.close()


def quick_processes(target: Callable[..., Any]) -> ForkServerContext:
    """A multiprocessing context whose processes are forked from a server that
    imported ``target``'s module once, so thirty of them start in milliseconds.

    Not "spawn": every child would import pgcrond again (half a second of CPU
    each, on two cores); not "fork": a child would copy the test process's
    open connections and threads.
    """
    context = multiprocessing.get_context("forkserver")
    # Read when the server starts: a server already running keeps its modules.
    context.set_forkserver_preload([target.__module__])
    return context


def count_round_trips(trace: str) -> int:
    """Round trips in a libpq protocol trace (``PGconn.trace``).

    Each message the client sends that makes the server answer and wait for
    the next one (Sync in the extended protocol, Query in the simple one)
    ends one round trip.
    """
    count = 0
    for line in trace.splitlines():
        fields = line.split("\t")
        # With timestamps the direction is the second field, without the first.
        direction = 1 if fields and fields[0] not in ("F", "B") else 0
        if len(fields) > direction + 2 and fields[direction] == "F":
            count += fields[direction + 2] in ("Sync", "Query")
    return count


def accounting(
    store: LeaseStore,
    config: Config,
    firing: Firing,
    tasks: set[asyncio.Task[object]],
    *,
    fire_now: FireNow = lambda *_, **__: None,
) -> Accounting:
    """The daemon's accounting over ``store``, its background work kept in ``tasks``."""
    return Accounting(
        store=store,
        config=lambda: config,
        firing=firing,
        metrics=Metrics(),
        spawn=lambda coro: tasks.add(asyncio.ensure_future(coro)),
        fire_now=fire_now,
        replica=firing.replica,
        clock=firing.clock,
    )


def database_now(dsn: str) -> datetime:
    with psycopg.connect(dsn, autocommit=True) as conn:
        row = conn.execute("SELECT clock_timestamp()").fetchone()
    assert row is not None
    now: datetime = row[0]
    return now


def rows(dsn: str, schema: str, code: str) -> list[dict[str, object]]:
    with psycopg.connect(dsn, autocommit=True, row_factory=psycopg.rows.dict_row) as conn:
        return conn.execute(
            f'SELECT * FROM "{schema}".leases WHERE code = %s ORDER BY run_key, id', (code,)
        ).fetchall()


def tick_ago(seconds: float) -> datetime:
    return (datetime.now(UTC) - timedelta(seconds=seconds)).replace(microsecond=0)


def note_sends(store: LeaseStore, sent: list[str], *names: str) -> None:
    """Note each call of the store's database methods ``names``, by name, as it is made."""
    for name in names:
        original = getattr(store.db, name)

        async def counting(
            *args: object, _original: object = original, _name: str = name, **kwargs: object
        ) -> object:
            sent.append(_name)
            return await _original(*args, **kwargs)  # type: ignore[operator]

        setattr(store.db, name, counting)
