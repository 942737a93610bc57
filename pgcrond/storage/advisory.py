"""Advisory-lock guard: mutual exclusion between replicas with no table.

The lock is ``pg_try_advisory_xact_lock`` inside an explicit transaction that
stays open, on one connection, for the whole run: it cannot leak past the run
(ending the transaction or losing the session releases it) and it works behind
PgBouncer in transaction pooling, which pins one server connection for as long
as the transaction lasts.

What it guarantees is narrower than lease mode (docs/guards.md): no two
replicas run a job at once. Nothing remembers a finished tick, so ``min_hold``
keeps the lock a little after a short run for replicas that fire late; a
replica firing later than that runs the tick again.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any, ParamSpec, TypeVar

import psycopg
import structlog
from psycopg.rows import DictRow, dict_row
from psycopg_pool import AsyncConnectionPool

from pgcrond.core.cancel import Cancellation
from pgcrond.core.keys import KeyHash, lock_id
from pgcrond.errors import LeaseLost, ValidationError
from pgcrond.storage.db import Database, connection_settings, translate
from pgcrond.storage.sql import Queries

P = ParamSpec("P")
R = TypeVar("R")
log = structlog.get_logger("pgcrond.storage.advisory")

# The advisory statements name no table; Queries only needs some valid names
# to format them like every other named query.
_QUERIES = Queries("pgcrond", "leases")
# A probe that has not answered by then no longer shows that the lock holds. A
# cut network would otherwise leave it waiting on TCP retransmissions
# (keepalives only cover an idle connection), for many minutes.
PROBE_TIMEOUT_S = 5.0
# Ending the transaction is one short statement; past this the session is
# treated as gone.
RELEASE_TIMEOUT_S = 5.0

Source = psycopg.AsyncConnection[Any] | Database | AsyncConnectionPool[Any] | str


@dataclass(eq=False)
class AdvisoryLease:
    """One attempt at an advisory lock, and what became of it.

    ``lost`` is set when the guard could not show that the lock held until the
    job finished (its connection died, or a probe went unanswered);
    ``cancellation`` is then cancelled with "lock_lost" so that the job stops.
    """

    key: str | int
    lock_id: int
    acquired: bool
    acquired_at: datetime | None = None
    lost: bool = False
    cancellation: Cancellation = field(default_factory=Cancellation, repr=False)


def advisory_lock_id(key: object, key_hash: KeyHash = "pgcrond") -> int:
    """The lock id of a configured ``lock_key``; blank keys are refused for both hashes.

    The nestjs hash maps "" to a valid id, but an empty key is always a
    configuration slip, and every job with one would share a lock.
    """
    if isinstance(key, str) and not key.strip():
        raise ValidationError("lock_key", "must not be empty")
    return lock_id(key, key_hash)  # type: ignore[arg-type]  # lock_id validates the type


@contextlib.asynccontextmanager
async def advisory_lock(
    source: Source,
    key: str | int,
    *,
    key_hash: KeyHash = "pgcrond",
    min_hold: timedelta = timedelta(seconds=5),
    tick: datetime | None = None,
    probe_interval: timedelta = timedelta(seconds=1),
) -> AsyncIterator[AdvisoryLease]:
    """Try the lock without waiting; yield an :class:`AdvisoryLease` either way.

    When ``lease.acquired`` the caller runs the job in the block; the lock is
    probed every ``probe_interval`` meanwhile and held until ``min_hold``
    after ``tick`` (default: when it was taken). A loser's transaction has
    already ended when the block starts. ``source`` is a connection the caller
    owns (idle, used as is), a :class:`Database`, a psycopg pool, or a conninfo
    string (a connection of its own, closed afterwards).
    """
    lease = AdvisoryLease(key, advisory_lock_id(key, key_hash), acquired=False)
    _check_timing(min_hold, tick, probe_interval)
    async with contextlib.AsyncExitStack() as stack:
        conn = await stack.enter_async_context(_connection(source))
        if conn.info.transaction_status != psycopg.pq.TransactionStatus.IDLE:
            raise ValidationError(
                "connection",
                "must not be inside a transaction: the advisory lock would belong to it",
            )
        if not conn.autocommit:
            # In psycopg's non-autocommit mode its own BEGIN would cost a
            # round trip of its own; ours travels with the try-lock.
            await conn.set_autocommit(True)
            stack.push_async_callback(_leave_autocommit, conn)
        # Simple protocol, never prepared: behind PgBouncer a prepared
        # statement would be missing on the next server connection.
        cursor = psycopg.AsyncClientCursor(conn, row_factory=dict_row)
        if await _try_lock(cursor, lease):
            async with _holding(cursor, lease, min_hold, tick, probe_interval):
                yield lease
            return
        await _release(cursor, lease)
    # The loser's transaction has ended and its connection is back.
    yield lease


def with_advisory_lock(
    source: Source,
    key: str | int,
    *,
    key_hash: KeyHash = "pgcrond",
    min_hold: timedelta = timedelta(seconds=5),
    probe_interval: timedelta = timedelta(seconds=1),
) -> Callable[[Callable[P, Awaitable[R]]], Callable[P, Awaitable[R | None]]]:
    """Decorate an async function to run only where the lock is won.

    The loser returns None without running it. When the lock was lost while
    it ran, :class:`LeaseLost` is raised instead of returning its value: the
    run cannot be shown to have been exclusive. Code that must stop when the
    lock is lost uses :func:`advisory_lock` and its ``cancellation``.
    """
    advisory_lock_id(key, key_hash)  # a bad key fails at decoration, not at the first tick

    def decorate(fn: Callable[P, Awaitable[R]]) -> Callable[P, Awaitable[R | None]]:
        @functools.wraps(fn)
        async def guarded(*args: P.args, **kwargs: P.kwargs) -> R | None:
            async with advisory_lock(
                source, key, key_hash=key_hash, min_hold=min_hold, probe_interval=probe_interval
            ) as lease:
                if not lease.acquired:
                    return None
                value = await fn(*args, **kwargs)
            if lease.lost:
                raise LeaseLost(f"advisory lock {key!r} lost while {fn.__name__} ran")
            return value

        return guarded

    return decorate


def _check_timing(min_hold: timedelta, tick: datetime | None, probe_interval: timedelta) -> None:
    if min_hold < timedelta(0):
        raise ValidationError("min_hold", f"must not be negative, got {min_hold}")
    if probe_interval <= timedelta(0):
        raise ValidationError("probe_interval", f"must be positive, got {probe_interval}")
    if tick is not None and tick.utcoffset() is None:
        raise ValidationError("tick", "must be an aware datetime (with a time zone)")


@contextlib.asynccontextmanager
async def _connection(source: Source) -> AsyncIterator[psycopg.AsyncConnection[Any]]:
    if isinstance(source, psycopg.AsyncConnection):
        yield source
    elif isinstance(source, Database | AsyncConnectionPool):
        async with source.connection() as conn:
            yield conn
    elif isinstance(source, str):
        try:
            conn = await psycopg.AsyncConnection.connect(source, **connection_settings(source))
        except psycopg.Error as exc:
            raise translate(exc) from exc
        try:
            yield conn
        finally:
            await conn.close()
    else:
        raise ValidationError(
            "connection",
            "must be a psycopg AsyncConnection, a pgcrond Database, an AsyncConnectionPool "
            f"or a conninfo string, got {type(source).__name__}",
        )


async def _leave_autocommit(conn: psycopg.AsyncConnection[Any]) -> None:
    if not conn.closed:
        with contextlib.suppress(psycopg.Error):
            await conn.set_autocommit(False)


async def _try_lock(cursor: psycopg.AsyncClientCursor[DictRow], lease: AdvisoryLease) -> bool:
    try:
        await cursor.execute(_QUERIES.get("advisory_try_lock"), {"lock_id": lease.lock_id})
        cursor.nextset()  # past BEGIN's result, to the SELECT's
        row = await cursor.fetchone()
    except psycopg.Error as exc:
        raise translate(exc) from exc
    assert row is not None
    lease.acquired = bool(row["acquired"])
    return lease.acquired


@contextlib.asynccontextmanager
async def _holding(
    cursor: psycopg.AsyncClientCursor[DictRow],
    lease: AdvisoryLease,
    min_hold: timedelta,
    tick: datetime | None,
    probe_interval: timedelta,
) -> AsyncIterator[None]:
    lease.acquired_at = datetime.now(UTC)
    # The wall clock is read once, here; the hold is then timed monotonically.
    hold_until = (
        time.monotonic()
        + ((tick or lease.acquired_at) + min_hold - lease.acquired_at).total_seconds()
    )
    probing = asyncio.create_task(_probe_until_lost(cursor, lease, probe_interval))
    try:
        yield
    except BaseException as exc:
        await _stop(probing)
        if isinstance(exc, Exception):
            await _hold_then_release(cursor, lease, hold_until)
        else:
            # Shutdown or interrupt: release at once rather than hold.
            await _release(cursor, lease)
        raise
    await _stop(probing)
    await _hold_then_release(cursor, lease, hold_until)


async def _stop(task: asyncio.Task[None]) -> None:
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await task


async def _probe(cursor: psycopg.AsyncClientCursor[DictRow]) -> None:
    await asyncio.wait_for(cursor.execute(_QUERIES.get("advisory_probe")), PROBE_TIMEOUT_S)


async def _probe_until_lost(
    cursor: psycopg.AsyncClientCursor[DictRow], lease: AdvisoryLease, interval: timedelta
) -> None:
    while True:
        await asyncio.sleep(interval.total_seconds())
        try:
            await _probe(cursor)
        except (psycopg.Error, TimeoutError) as exc:
            _mark_lost(lease, exc)
            return


def _mark_lost(lease: AdvisoryLease, exc: BaseException) -> None:
    lease.lost = True
    lease.cancellation.cancel("lock_lost")
    log.warning(
        "advisory_lock_lost",
        lock_key=lease.key,
        lock_id=lease.lock_id,
        error=str(exc) or type(exc).__name__,
    )


async def _hold_then_release(
    cursor: psycopg.AsyncClientCursor[DictRow], lease: AdvisoryLease, hold_until: float
) -> None:
    remaining = hold_until - time.monotonic()
    if lease.lost or remaining <= 0:
        # The release itself proves (or disproves) that the lock held to the end.
        if not await _release(cursor, lease) and not lease.lost:
            _mark_lost(lease, ConnectionError("the lock's connection failed at release"))
        return
    # The run is over: one probe proves it ended under the lock, so that
    # trouble during the hold that follows only shortens the hold.
    try:
        await _probe(cursor)
    except (psycopg.Error, TimeoutError) as exc:
        _mark_lost(lease, exc)
        await _release(cursor, lease)
        return
    await asyncio.sleep(remaining)
    if not await _release(cursor, lease):
        log.warning("advisory_hold_cut_short", lock_key=lease.key, lock_id=lease.lock_id)


async def _release(cursor: psycopg.AsyncClientCursor[DictRow], lease: AdvisoryLease) -> bool:
    """End the transaction; False when the session was already gone (and the lock with it)."""
    try:
        await asyncio.wait_for(cursor.execute(_QUERIES.get("advisory_release")), RELEASE_TIMEOUT_S)
    except (psycopg.Error, TimeoutError) as exc:
        log.info(
            "advisory_release_failed",
            lock_key=lease.key,
            lock_id=lease.lock_id,
            error=str(exc) or type(exc).__name__,
        )
        # A pool must not get this connection back half-broken.
        with contextlib.suppress(psycopg.Error):
            await cursor.connection.close()
        return False
    return True
