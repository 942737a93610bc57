"""A request given up on never affects the others of its batch.

A batched statement answers every request it carried; one whose waiter was
cancelled meanwhile (its bound ran out, or its fire was stopped) is skipped,
and the rest get their own answers: a won claim is run and recorded.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Iterator, Sequence
from contextlib import contextmanager
from datetime import timedelta
from typing import Any

import psycopg

from pgcrond.core.keys import Identity
from pgcrond.core.timing import LeaseTiming
from pgcrond.storage.batch import TurnBatch
from pgcrond.storage.claims import Acquired
from pgcrond.storage.leases import LeaseStore

TIMING = LeaseTiming.build(timedelta(seconds=30), timedelta(0))
TICK = "2026-01-01T00:00:00Z"


@contextmanager
def table_locked(pg_dsn: str, schema: str) -> Iterator[Callable[[], None]]:
    """Hold the lease table in SHARE mode until released: every write to it waits.

    (A row lock would not do: claims and heartbeats skip a locked row.)
    """
    conn = psycopg.connect(pg_dsn)
    try:
        conn.execute(f'LOCK TABLE "{schema}".leases IN SHARE MODE')
        yield conn.commit
    finally:
        conn.close()


async def until_waiting_on_a_lock(pg_dsn: str, query_start: str) -> None:
    """Return once a statement containing ``query_start`` waits on a lock.

    pg_stat_activity keeps the first 1024 bytes of a query (track_activity_query_size):
    match text near its start.
    """
    deadline = time.monotonic() + 10
    async with await psycopg.AsyncConnection.connect(pg_dsn, autocommit=True) as conn:
        while time.monotonic() < deadline:
            cursor = await conn.execute(
                "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock'"
                " AND datname = current_database() AND query LIKE %s",
                ("%" + query_start + "%",),
            )
            found = await cursor.fetchone()
            if found and found[0]:
                return
            await asyncio.sleep(0.01)
    raise AssertionError("the batch statement never waited on the held row")


def statuses(pg_dsn: str, schema: str) -> dict[str, str]:
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        rows = conn.execute(f'SELECT code, status FROM "{schema}".leases').fetchall()
    return dict(rows)


async def given_up_while_in_flight(
    pg_dsn: str, schema: str, query_start: str, calls: Sequence[Awaitable[Any]]
) -> list[Any]:
    """Start ``calls`` in one turn; cancel the first while their statement waits."""
    with table_locked(pg_dsn, schema) as release:
        tasks = [asyncio.ensure_future(call) for call in calls]
        await until_waiting_on_a_lock(pg_dsn, query_start)
        tasks[0].cancel()
        release()
        return await asyncio.gather(*tasks[1:])


async def claim(store: LeaseStore, code: str) -> Acquired:
    lease = await store.claim(Identity.schedule(code, TICK), TIMING)
    assert isinstance(lease, Acquired)
    return lease


async def test_a_claim_given_up_on_in_flight_leaves_the_other_claims_their_wins(
    store: LeaseStore, pg_dsn: str, schema: str
) -> None:
    """The others win, are run and recorded; before the fix they raised InvalidStateError."""
    # A retryable FAIL row the claim reclaims.
    held = await claim(store, "held")
    assert await store.fail(held, "boom", retry_after=timedelta(0))
    claims = [store.claim(Identity.schedule(code, TICK), TIMING) for code in ("gone", "held", "c")]
    won = await given_up_while_in_flight(pg_dsn, schema, "Claim a batch of identities", claims)
    assert all(isinstance(lease, Acquired) for lease in won)
    recorded = [await store.complete(lease) for lease in won if isinstance(lease, Acquired)]
    assert [True, True] == recorded
    assert "SUCCESS" == statuses(pg_dsn, schema)["held"]
    assert "SUCCESS" == statuses(pg_dsn, schema)["c"]


async def test_a_finalize_given_up_on_in_flight_leaves_the_others_recorded(
    store: LeaseStore, pg_dsn: str, schema: str
) -> None:
    """The given-up finalize was sent, so it lands too; the caller's retry finds it recorded."""
    gone, held, third = [await claim(store, code) for code in ("gone", "held", "c")]
    finalizes = [store.complete(gone), store.complete(held), store.fail(third, "x")]
    recorded = await given_up_while_in_flight(pg_dsn, schema, "WITH outcome AS", finalizes)
    assert [True, True] == recorded
    assert {"gone": "SUCCESS", "held": "SUCCESS", "c": "FAIL"} == statuses(pg_dsn, schema)
    # What the guard's bounded retry sends again: the same outcome, recorded already.
    assert await store.complete(gone)


async def test_a_renew_given_up_on_in_flight_leaves_the_other_heartbeats_renewed(
    store: LeaseStore, pg_dsn: str, schema: str
) -> None:
    gone, held, third = [await claim(store, code) for code in ("gone", "held", "c")]
    beats = [store.renew(gone), store.renew(held), store.renew(third)]
    renewed = await given_up_while_in_flight(pg_dsn, schema, "WITH beat AS", beats)
    assert all(renewal is not None for renewal in renewed)


async def test_a_request_whose_answer_cannot_be_made_fails_alone() -> None:
    """An exception from one request's handling reaches that request only."""

    async def send(requests: list[int]) -> Callable[[int], int]:
        def answer(request: int) -> int:
            if request == 1:
                raise ValueError("no answer for 1")
            return request * 10

        return answer

    batch: TurnBatch[int] = TurnBatch(send)
    answers = await asyncio.gather(*(batch.submit(n) for n in range(3)), return_exceptions=True)
    assert 0 == answers[0] and 20 == answers[2]
    assert isinstance(answers[1], ValueError)


async def test_a_request_given_up_on_before_its_batch_is_sent_is_not_sent() -> None:
    """A claim nobody waits for any more must not win a row nobody runs."""
    sent: list[list[int]] = []

    async def send(requests: list[int]) -> Callable[[int], int]:
        sent.append(requests)
        return lambda request: request

    batch: TurnBatch[int] = TurnBatch(send)
    tasks = [asyncio.ensure_future(batch.submit(n)) for n in range(3)]
    await asyncio.sleep(0)  # submitted: queued for the next turn
    tasks[1].cancel()
    assert [0, 2] == list(await asyncio.gather(tasks[0], tasks[2]))
    assert [[0, 2]] == sent
