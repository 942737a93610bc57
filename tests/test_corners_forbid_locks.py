"""concurrency: forbid claims take no slot of the shared lock table (issue 20, item 14).

At PostgreSQL's defaults the table holds max_locks_per_transaction (64) x
max_connections (100) = 6,400 locks for the whole server. One advisory lock
per forbid job in a claim chunk of 500, with 4 replicas sending 4 chunks at
once, needs 8,000: "out of shared memory", for every application there.
"""

from __future__ import annotations

import asyncio
import time
from datetime import timedelta

import psycopg

from pgcrond.core.keys import Identity
from pgcrond.core.timing import LeaseTiming
from pgcrond.storage.embedded import LocalServer
from pgcrond.storage.leases import Acquired, LeaseStore, NotAcquired
from tests.store_helpers import open_store

TIMING = LeaseTiming.build(timedelta(seconds=60), timedelta(0))
TICK = "2026-01-01T00:00:00Z"
REPLICAS, POOL, JOBS, CHUNK = 4, 4, 2500, 500


async def waiting_on_locks(dsn: str, count: int, claims: list[asyncio.Task[object]]) -> None:
    """Return once ``count`` statements wait on a lock, or a claim has ended."""
    deadline = time.monotonic() + 60
    async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn:
        while time.monotonic() < deadline and not any(task.done() for task in claims):
            cursor = await conn.execute(
                "SELECT count(*) FROM pg_stat_activity WHERE application_name = 'pgcrond'"
                " AND wait_event_type = 'Lock'"
            )
            found = await cursor.fetchone()
            if found and found[0] >= count:
                return
            await asyncio.sleep(0.05)


async def claim_all(store: LeaseStore, replica: int) -> list[Acquired | NotAcquired]:
    # Each chunk of 500 starts with a job whose row the test holds locked, so
    # every chunk keeps the locks it took while it waits: all at once.
    codes = [f"block-{n // CHUNK}" if n % CHUNK == 0 else f"r{replica}-{n}" for n in range(JOBS)]
    return list(
        await asyncio.gather(
            *(
                store.claim(Identity.schedule(code, TICK), TIMING, forbid_overlap=True)
                for code in codes
            )
        )
    )


async def test_four_replicas_claiming_2500_forbid_jobs_each_at_once_fit_default_lock_table(
    own_server: LocalServer,
) -> None:
    dsn = own_server.dsn
    with psycopg.connect(dsn, autocommit=True) as conn:
        assert "64" == conn.execute("SHOW max_locks_per_transaction").fetchone()[0]  # type: ignore[index]
        assert "100" == conn.execute("SHOW max_connections").fetchone()[0]  # type: ignore[index]
    async with open_store(dsn, "pgcrond") as setup:
        for chunk in range(JOBS // CHUNK):
            lease = await setup.claim(Identity.schedule(f"block-{chunk}", TICK), TIMING)
            assert isinstance(lease, Acquired)
            assert await setup.fail(lease, "to be retried", retry_after=timedelta(0))
    blocker = psycopg.connect(dsn)
    try:
        blocker.execute("SELECT id FROM pgcrond.leases WHERE code LIKE 'block-%' FOR UPDATE")
        stores = [
            await open_store(
                dsn, "pgcrond", owner=f"r{n}", migrate=False, max_size=POOL
            ).__aenter__()
            for n in range(REPLICAS)
        ]
        claims: list[asyncio.Task[object]] = [
            asyncio.ensure_future(claim_all(store, n)) for n, store in enumerate(stores)
        ]
        await waiting_on_locks(dsn, REPLICAS * POOL, claims)
        blocker.commit()
        answers = await asyncio.gather(*claims, return_exceptions=True)
        errors = [answer for answer in answers if isinstance(answer, BaseException)]
        assert [] == [str(error) for error in errors]
        won = [a for batch in answers if isinstance(batch, list) for a in batch]
        # Every job of its own replica won; each blocked tick by one replica only.
        assert REPLICAS * (JOBS - JOBS // CHUNK) + JOBS // CHUNK == sum(
            isinstance(answer, Acquired) for answer in won
        )
    finally:
        blocker.close()
        for store in stores:
            await store.db.close()


async def test_forbid_still_refuses_a_tick_while_another_tick_of_the_job_runs(
    store: LeaseStore,
) -> None:
    first = await store.claim(Identity.schedule("nightly", TICK), TIMING, forbid_overlap=True)
    assert isinstance(first, Acquired)
    again = await store.claim(
        Identity.schedule("nightly", "2026-01-01T00:01:00Z"), TIMING, forbid_overlap=True
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
                store.claim(Identity.schedule(code, TICK), TIMING, forbid_overlap=True),
                other.claim(
                    Identity.schedule(code, "2026-01-01T00:01:00Z"), TIMING, forbid_overlap=True
                ),
            )
        assert 1 == sum(isinstance(answer, Acquired) for answer in answers)
