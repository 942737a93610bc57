"""A claim given back as possibly late keeps its window and its attempt.

The scenario, against a real PostgreSQL: the claim's answer is held up 1.6 s
by a table lock (a slow answer), its re-check is held past its 250 ms bound by
a second lock (no precise numbers), so the guard cannot tell whether the tick
is still inside its 3 s window and gives the claim back.
"""

from __future__ import annotations

import asyncio
import time
from datetime import UTC, datetime, timedelta

import psycopg

from pgcrond.core.keys import Identity
from pgcrond.core.schedule import run_key_for
from pgcrond.core.timing import LeaseTiming
from pgcrond.guard.base import ClaimRequest, Held, Refused
from pgcrond.guard.lease import LeaseGuard
from pgcrond.storage.claims import Acquired
from pgcrond.storage.leases import LeaseStore

TIMING = LeaseTiming.build(timedelta(seconds=30), timedelta(0))
WINDOW = timedelta(seconds=3)
ANSWER_HELD_S = 1.6


async def until_waiting(dsn: str, count: int) -> None:
    deadline = time.monotonic() + 20
    async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn:
        while time.monotonic() < deadline:
            cursor = await conn.execute(
                "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock'"
                " AND datname = current_database()"
            )
            found = await cursor.fetchone()
            if found and found[0] >= count:
                return
            await asyncio.sleep(0.01)
    raise AssertionError(f"never {count} statements waiting on a lock")


async def slow_claim(
    store: LeaseStore, pg_dsn: str, schema: str, *, give_back_after_window: bool
) -> tuple[Held | Refused, tuple[str, str | None, int]]:
    tick = datetime.now(UTC).replace(microsecond=0)
    identity = Identity.schedule("job", run_key_for(tick))
    # The window ends 3 s from now (not from the whole second of the tick).
    deadline = datetime.now(UTC) + WINDOW
    # A retryable FAIL row the claim reclaims, so a row lock can hold it up.
    first = await store.claim(identity, TIMING)
    assert isinstance(first, Acquired)
    assert await store.fail(first, "boom", retry_after=timedelta(0))
    table = f'"{schema}".leases'
    # A table lock: claims and heartbeats skip a locked row, they wait for this.
    lock = f"LOCK TABLE {table} IN SHARE MODE"
    guard = LeaseGuard(store)
    request = ClaimRequest(identity, tick, TIMING, deadline=deadline)
    first_lock = psycopg.connect(pg_dsn)
    second_lock = await psycopg.AsyncConnection.connect(pg_dsn)
    try:
        first_lock.execute(lock)
        claim = asyncio.ensure_future(guard.claim(request))
        await until_waiting(pg_dsn, 1)
        # Queued behind the claim: it takes the row as the claim commits, and
        # holds up the re-check and then the give-back.
        queued = asyncio.ensure_future(second_lock.execute(lock))
        await until_waiting(pg_dsn, 2)
        await asyncio.sleep(ANSWER_HELD_S)  # the slow answer itself
        first_lock.commit()
        await queued
        await until_waiting(pg_dsn, 1)  # the give-back waits on the row
        if give_back_after_window:
            left = (deadline - datetime.now(UTC)).total_seconds()
            await asyncio.sleep(left + 0.1)
        await second_lock.commit()
        answer = await claim
    finally:
        first_lock.close()
        await second_lock.close()
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        row = conn.execute(f"SELECT status, reason, attempt FROM {table}").fetchone()
    assert row is not None
    return answer, (row[0], row[1], row[2])


async def test_a_claim_given_back_inside_its_window_is_claimed_again_with_its_attempt(
    store: LeaseStore, pg_dsn: str, schema: str
) -> None:
    """Before: refused "held" (followed with no window) and the re-claim counted attempt 3."""
    answer, (status, _, attempt) = await slow_claim(
        store, pg_dsn, schema, give_back_after_window=False
    )
    assert isinstance(answer, Held)
    assert 2 == answer.attempt  # the retry of the FAIL row, counted once
    assert ("RUNNING", 2) == (status, attempt)


async def test_a_claim_given_back_after_its_window_is_closed_late(
    store: LeaseStore, pg_dsn: str, schema: str
) -> None:
    """Before: FAIL/released, reclaimable by anyone with no window: it ran after it."""
    answer, row = await slow_claim(store, pg_dsn, schema, give_back_after_window=True)
    assert isinstance(answer, Refused)
    assert "late" == answer.reason
    assert ("FAIL", "late", 2) == row
