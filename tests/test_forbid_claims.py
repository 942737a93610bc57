"""concurrency: forbid claims take no slot of the shared lock table.

At PostgreSQL's defaults the table holds max_locks_per_transaction (64) x
max_connections (100) = 6,400 locks for the whole server. One advisory lock
per forbid job in a claim chunk of 500, with 4 replicas sending 4 chunks at
once, needs 8,000: "out of shared memory", for every application there.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
import uuid
from datetime import timedelta

import psycopg

from pgcrond.core.keys import Identity
from pgcrond.core.overlap import FORBID
from pgcrond.core.timing import LeaseTiming
from pgcrond.core.wheel import PER_TURN
from pgcrond.storage.claim_answers import PendingClaim
from pgcrond.storage.claims import Acquired, NotAcquired
from pgcrond.storage.embedded import LocalServer
from pgcrond.storage.leases import LeaseStore
from tests.helpers.store import open_store

TIMING = LeaseTiming.build(timedelta(seconds=60), timedelta(0))
TICK = "2026-01-01T00:00:00Z"
# 48 statements holding 250 locks each: 12,000, against 6,400 slots and the
# few hundred more its spare shared memory makes room for.
REPLICAS, POOL, JOBS = 4, 6, 3000


async def waiting_on_locks(dsn: str, count: int, claims: list[asyncio.Task[object]]) -> None:
    """Return once ``count`` statements wait on a lock, or a claim has ended."""
    deadline = time.monotonic() + 60
    async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn:
        while time.monotonic() < deadline and not any(task.done() for task in claims):
            cursor = await conn.execute(
                "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock'"
                " AND datname = current_database()"
            )
            found = await cursor.fetchone()
            if found and found[0] >= count:
                return
            await asyncio.sleep(0.05)


async def claim_all(store: LeaseStore, replica: int) -> list[Acquired | NotAcquired]:
    """A replica's tick of ``JOBS`` forbid jobs, claimed a chunk (``PER_TURN``) a statement."""
    claims = [
        PendingClaim(Identity.schedule(f"r{replica}-{n}", TICK), TIMING, uuid.uuid4(), FORBID)
        for n in range(JOBS)
    ]
    chunks = await asyncio.gather(
        *(store.claim_many(claims[at : at + PER_TURN]) for at in range(0, JOBS, PER_TURN))
    )
    return [answer for chunk in chunks for answer in chunk]


async def test_four_replicas_claiming_3000_forbid_jobs_each_at_once_fit_default_lock_table(
    own_server: LocalServer,
) -> None:
    dsn = own_server.dsn
    with psycopg.connect(dsn, autocommit=True) as conn:
        assert "64" == conn.execute("SHOW max_locks_per_transaction").fetchone()[0]  # type: ignore[index]
        assert "100" == conn.execute("SHOW max_connections").fetchone()[0]  # type: ignore[index]
    async with open_store(dsn, "pgcrond"):
        pass
    # The claim statement reads the job-state table after the forbid locks are
    # taken: holding that table makes every chunk keep its locks, all at once
    # (4 replicas x 6 pooled connections x 500 jobs).
    blocker = psycopg.connect(dsn)
    try:
        blocker.execute("LOCK TABLE pgcrond.leases_job_state IN ACCESS EXCLUSIVE MODE")
        async with contextlib.AsyncExitStack() as stack:
            stores = [
                await stack.enter_async_context(
                    open_store(dsn, "pgcrond", owner=f"r{n}", migrate=False, max_size=POOL)
                )
                for n in range(REPLICAS)
            ]
            claims: list[asyncio.Task[object]] = [
                asyncio.ensure_future(claim_all(store, n)) for n, store in enumerate(stores)
            ]
            await waiting_on_locks(dsn, REPLICAS * POOL, claims)
            blocker.commit()
            answers = await asyncio.gather(*claims, return_exceptions=True)
    finally:
        blocker.close()
    errors = [answer for answer in answers if isinstance(answer, BaseException)]
    assert [] == [str(error) for error in errors]
    won = [a for batch in answers if isinstance(batch, list) for a in batch]
    assert REPLICAS * JOBS == sum(isinstance(answer, Acquired) for answer in won)


async def test_forbid_still_refuses_a_tick_while_another_tick_of_the_job_runs(
    store: LeaseStore,
) -> None:
    first = await store.claim(Identity.schedule("nightly", TICK), TIMING, overlap=FORBID)
    assert isinstance(first, Acquired)
    again = await store.claim(
        Identity.schedule("nightly", "2026-01-01T00:01:00Z"), TIMING, overlap=FORBID
    )
    assert isinstance(again, NotAcquired) and "overlap" == again.reason


async def test_forbid_claims_of_two_ticks_racing_on_two_replicas_run_one(
    pg_dsn: str, schema: str, store: LeaseStore
) -> None:
    """The row lock serialises them: the second claim sees the first's RUNNING row."""
    for attempt in range(20):
        async with open_store(pg_dsn, schema, owner="other", migrate=False) as other:
            code = f"job-{attempt}"
            answers = await asyncio.gather(
                store.claim(Identity.schedule(code, TICK), TIMING, overlap=FORBID),
                other.claim(
                    Identity.schedule(code, "2026-01-01T00:01:00Z"), TIMING, overlap=FORBID
                ),
            )
        assert 1 == sum(isinstance(answer, Acquired) for answer in answers)
