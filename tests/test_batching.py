"""Batched heartbeats and finalizes change no guarantee: each row keeps its own fence.

A statement shared by co-running leases must still refuse the one row whose
owner was fenced, and record or renew the others.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from datetime import timedelta

import psycopg

from pgcrond.core.keys import Identity
from pgcrond.core.timing import LeaseTiming
from pgcrond.storage.batch import TurnBatch
from pgcrond.storage.claims import Acquired, Standing
from pgcrond.storage.leases import FINALIZE_LINGER_S, LeaseStore
from tests.helpers.store import note_sends

TIMING = LeaseTiming.build(timedelta(seconds=30), timedelta(0))


async def claim_three(store: LeaseStore) -> list[Acquired]:
    identities = [Identity.schedule(f"job-{n}", "2026-01-01T00:00:00Z") for n in range(3)]
    won = await asyncio.gather(*(store.claim(i, TIMING) for i in identities))
    assert all(isinstance(lease, Acquired) for lease in won)
    return [lease for lease in won if isinstance(lease, Acquired)]


def fence(pg_dsn: str, schema: str, lease: Acquired) -> None:
    """Another owner took the row over: its token rotated away from ``lease``'s."""
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        conn.execute(
            f'UPDATE "{schema}".leases SET owner_token = gen_random_uuid() WHERE id = %s',
            (lease.id,),
        )


def statuses(pg_dsn: str, schema: str) -> dict[str, str]:
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        rows = conn.execute(f'SELECT code, status FROM "{schema}".leases').fetchall()
    return dict(rows)


async def test_a_finalize_batch_records_the_owned_rows_and_refuses_the_fenced_one(
    store: LeaseStore, pg_dsn: str, schema: str
) -> None:
    first, fenced, third = await claim_three(store)
    fence(pg_dsn, schema, fenced)
    recorded = await asyncio.gather(
        store.complete(first), store.complete(fenced), store.fail(third, "boom", retry_after=None)
    )
    assert [True, False, True] == list(recorded)
    assert {"job-0": "SUCCESS", "job-1": "RUNNING", "job-2": "FAIL"} == statuses(pg_dsn, schema)


async def test_a_heartbeat_batch_renews_the_owned_rows_and_refuses_the_fenced_one(
    store: LeaseStore, pg_dsn: str, schema: str
) -> None:
    first, fenced, third = await claim_three(store)
    fence(pg_dsn, schema, fenced)
    renewed = await asyncio.gather(*(store.heartbeat(lease) for lease in (first, fenced, third)))
    assert renewed[1] is None
    assert renewed[0] is not None and renewed[2] is not None
    assert timedelta(seconds=29) < renewed[0] <= TIMING.lease


async def test_co_finishing_runs_share_one_statement(
    store: LeaseStore, pg_dsn: str, schema: str
) -> None:
    """Three outcomes in one loop turn are one round trip, not three."""
    leases = await claim_three(store)
    sent: list[str] = []
    note_sends(store, sent, "fetchall")
    assert all(await asyncio.gather(*(store.complete(lease) for lease in leases)))
    assert ["fetchall"] == sent


async def test_runs_finishing_a_few_ms_apart_still_share_one_statement(
    store: LeaseStore, pg_dsn: str, schema: str
) -> None:
    """Co-fired runs end close together, not in one turn: the finalize waits for the rest."""
    leases = await claim_three(store)
    sent: list[str] = []
    note_sends(store, sent, "fetchall")

    async def finish(lease: Acquired, after: float) -> bool:
        await asyncio.sleep(after)
        return await store.complete(lease)

    spacing = FINALIZE_LINGER_S / 4
    recorded = await asyncio.gather(*(finish(lease, n * spacing) for n, lease in enumerate(leases)))
    assert [True, True, True] == recorded
    assert ["fetchall"] == sent
    assert {"job-0": "SUCCESS", "job-1": "SUCCESS", "job-2": "SUCCESS"} == statuses(pg_dsn, schema)


async def test_a_finalize_is_sent_after_the_linger_while_another_run_is_still_going(
    store: LeaseStore,
) -> None:
    """A long run still open does not hold the others' records back past the linger."""
    first, second, long_running = await claim_three(store)
    sent: list[str] = []
    note_sends(store, sent, "fetchall")
    assert all(await asyncio.gather(store.complete(first), store.complete(second)))
    assert ["fetchall"] == sent  # sent by the linger's timer: the third is still running
    assert await store.complete(long_running)
    assert ["fetchall"] * 2 == sent


async def test_a_turn_of_more_requests_than_a_batch_holds_goes_as_several_bounded_statements() -> (
    None
):
    sizes: list[int] = []

    async def send(batch: list[int]) -> Callable[[int], int]:
        sizes.append(len(batch))
        return lambda request: request

    batch: TurnBatch[int] = TurnBatch(send, max_size=500)
    answers = await asyncio.gather(*(batch.submit(n) for n in range(1200)))
    assert list(range(1200)) == answers
    assert [500, 500, 200] == sizes


async def test_a_look_due_while_runs_end_shares_their_outcomes_transaction(
    store: LeaseStore, pg_dsn: str, schema: str
) -> None:
    """A tick's look and its runs' outcomes are one round trip and one transaction, not two."""
    first, second, still_running = await claim_three(store)
    unrecorded = Identity.schedule("job-9", "2026-01-01T00:00:00Z")
    sent: list[str] = []
    note_sends(store, sent, "fetchall", "fetchall_each")
    done_first, standings, done_second = await asyncio.gather(
        store.complete(first),
        store.standings([still_running.identity, first.identity, unrecorded]),
        store.complete(second),
    )
    assert (True, True) == (done_first, done_second)
    assert ["fetchall_each"] == sent
    # The look reads after the outcomes in its transaction: first is SUCCESS already.
    assert {still_running.identity, first.identity} == set(standings)
    recorded = standings[first.identity]
    assert ("SUCCESS", True) == (recorded.status, recorded.settled)
    running = standings[still_running.identity]
    assert ("RUNNING", False) == (running.status, running.settled)
    assert running.wait is not None and timedelta(seconds=25) < running.wait <= TIMING.lease
    assert {"job-0": "SUCCESS", "job-1": "SUCCESS", "job-2": "RUNNING"} == statuses(pg_dsn, schema)


async def test_outcomes_recorded_just_before_a_look_told_of_wait_for_it(
    store: LeaseStore,
) -> None:
    """The last run of a tick ends a few ms before the tick's look: one transaction for both."""
    leases = await claim_three(store)
    sent: list[str] = []
    note_sends(store, sent, "fetchall", "fetchall_each")
    soon = FINALIZE_LINGER_S / 4
    store.look_due(asyncio.get_running_loop().time() + soon)

    async def look() -> dict[Identity, Standing]:
        await asyncio.sleep(soon)
        return await store.standings([leases[0].identity])

    recorded, standings = await asyncio.gather(asyncio.gather(*map(store.complete, leases)), look())
    assert [True, True, True] == recorded
    assert ["fetchall_each"] == sent
    assert "SUCCESS" == standings[leases[0].identity].status


async def test_a_look_told_of_beyond_the_linger_holds_no_outcome(store: LeaseStore) -> None:
    """Outcomes wait for a look only if it is due within the linger: never longer."""
    leases = await claim_three(store)
    sent: list[str] = []
    note_sends(store, sent, "fetchall", "fetchall_each")
    look_at = asyncio.get_running_loop().time() + 50 * FINALIZE_LINGER_S
    store.look_due(look_at)
    assert all(await asyncio.gather(*map(store.complete, leases)))
    assert ["fetchall"] == sent
    assert asyncio.get_running_loop().time() < look_at  # recorded before the look was due
