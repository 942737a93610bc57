"""Claims and heartbeats never wait on another job's sql: transaction.

An sql: job holds its lease row FOR UPDATE while its statements run. A claim
of that row (another replica's takeover or follow-up) or a heartbeat batch
that includes it must neither wait for that transaction nor make the other
rows of its statement wait.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import datetime, timedelta

import psycopg

from pgcrond.core.keys import Identity
from pgcrond.core.timing import LeaseTiming
from pgcrond.storage.claims import Acquired, NotAcquired
from pgcrond.storage.leases import LeaseStore
from tests.helpers.store import open_store

TIMING = LeaseTiming.build(timedelta(seconds=30), timedelta(0))
TICK = "2026-01-01T00:00:00Z"
# Far below the lock's hold (the test's whole run) and above any loaded round trip.
PROMPT_S = 2.0


@contextmanager
def held_like_an_sql_job(pg_dsn: str, schema: str, code: str) -> Iterator[None]:
    """The lease row locked FOR UPDATE by an open transaction, as sql_job_lock does."""
    conn = psycopg.connect(pg_dsn)
    try:
        conn.execute(f'SELECT id FROM "{schema}".leases WHERE code = %s FOR UPDATE', (code,))
        yield
    finally:
        conn.close()


async def claim(store: LeaseStore, code: str) -> Acquired:
    lease = await store.claim(Identity.schedule(code, TICK), TIMING)
    assert isinstance(lease, Acquired)
    return lease


async def test_a_claim_batched_with_an_sql_jobs_locked_row_answers_at_once(
    store: LeaseStore, pg_dsn: str, schema: str
) -> None:
    await claim(store, "sql-job")
    async with open_store(pg_dsn, schema, owner="other", migrate=False) as other:
        with held_like_an_sql_job(pg_dsn, schema, "sql-job"):
            answers = await asyncio.wait_for(
                asyncio.gather(
                    *(
                        other.claim(Identity.schedule(code, TICK), TIMING)
                        for code in ("sql-job", "b", "c")
                    )
                ),
                PROMPT_S,
            )
    locked, *others = answers
    assert isinstance(locked, NotAcquired)
    assert ("held", "test:1") == (locked.reason, locked.owner)
    assert locked.wait is not None and locked.wait > timedelta(seconds=25)
    assert all(isinstance(answer, Acquired) for answer in others)


async def test_a_locked_expired_row_is_refused_held_not_taken_over(
    store: LeaseStore, pg_dsn: str, schema: str
) -> None:
    """The lock holder owns the row until its transaction ends: no takeover past it."""
    lease = await claim(store, "sql-job")
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        conn.execute(
            f"UPDATE \"{schema}\".leases SET expires_at = now() - interval '1 s' WHERE id = %s",
            (lease.id,),
        )
    async with open_store(pg_dsn, schema, owner="other", migrate=False) as other:
        with held_like_an_sql_job(pg_dsn, schema, "sql-job"):
            answer = await asyncio.wait_for(
                other.claim(Identity.schedule("sql-job", TICK), TIMING), PROMPT_S
            )
    assert isinstance(answer, NotAcquired)
    assert ("held", timedelta(0)) == (answer.reason, answer.wait)


async def test_a_heartbeat_batched_with_an_sql_jobs_locked_row_renews_the_others_at_once(
    store: LeaseStore, pg_dsn: str, schema: str
) -> None:
    sql_job, other = await claim(store, "sql-job"), await claim(store, "other")
    before = expiries(pg_dsn, schema)
    with held_like_an_sql_job(pg_dsn, schema, "sql-job"):
        locked, renewed = await asyncio.wait_for(
            asyncio.gather(store.renew(sql_job), store.renew(other)), PROMPT_S
        )
    # The locked row is live and keeps the expiry it has; the other is renewed.
    assert locked is not None and renewed is not None
    after = expiries(pg_dsn, schema)
    assert before["sql-job"] == after["sql-job"]
    assert before["other"] < after["other"]


def expiries(pg_dsn: str, schema: str) -> dict[str, datetime]:
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        rows = conn.execute(f'SELECT code, expires_at FROM "{schema}".leases').fetchall()
    return {code: expires_at for code, expires_at in rows}
