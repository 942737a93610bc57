"""Spread: a tick's runs shared across replicas, learned from the claims, never a duplicate.

The ranking is pure (rendezvous hashing); the hold-back and the learning are
tested with real lease guards on a real PostgreSQL.
"""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from datetime import UTC, datetime, timedelta
from pathlib import Path

from pgcrond.core.keys import Identity
from pgcrond.core.schedule import run_key_for
from pgcrond.core.timing import LeaseTiming
from pgcrond.guard.base import ClaimRequest, Held, Refused
from pgcrond.guard.lease import LeaseGuard
from pgcrond.guard.spread import Spread
from tests.helpers.store import count_round_trips, open_store

TIMING = LeaseTiming.build(timedelta(seconds=30), timedelta(0))
REPLICAS = ["host-a:1", "host-b:2", "host-c:3"]
DELAY = timedelta(milliseconds=200)


def identities(count: int, run_key: str = "2026-01-01T00:00:00Z") -> list[Identity]:
    return [Identity.schedule(f"job-{n}", run_key) for n in range(count)]


def view(me: str, peers: list[str], delay: timedelta = DELAY) -> Spread:
    spread = Spread(me, delay)
    for peer in peers:
        spread.saw(peer)
    return spread


def test_every_replica_that_knows_the_same_peers_prefers_the_same_one() -> None:
    views = [view(me, REPLICAS) for me in REPLICAS]
    for identity in identities(200):
        assert len({v.preferred(identity) for v in views}) == 1


def test_the_runs_of_a_tick_are_shared_and_a_gone_replica_moves_only_its_own() -> None:
    spread = view(REPLICAS[0], REPLICAS)
    jobs = identities(300)
    shares = Counter(spread.preferred(identity) for identity in jobs)
    assert set(shares) == set(REPLICAS)
    assert max(shares.values()) <= 1.25 * len(jobs) / len(REPLICAS)
    # Each tick ranks afresh: one job is not pinned to one replica.
    ticks = [Identity.schedule("job-0", f"2026-01-01T00:00:{n:02d}Z") for n in range(30)]
    assert set(REPLICAS) == {spread.preferred(i) for i in ticks}
    two = view(REPLICAS[0], REPLICAS[:2])
    moved = [i for i in jobs if spread.preferred(i) != two.preferred(i)]
    assert moved and all(spread.preferred(i) == REPLICAS[2] for i in moved)


def test_a_peer_not_seen_for_forget_after_is_no_longer_ranked() -> None:
    now = [0.0]
    spread = Spread("me", DELAY, forget_after=timedelta(seconds=60), clock=lambda: now[0])
    spread.saw("peer")
    spread.saw("me")  # itself is never a peer
    spread.saw(None)
    assert ["peer"] == spread.peers()
    now[0] = 61.0
    assert [] == spread.peers()


async def test_peers_named_by_the_registry_are_ranked_before_any_claim_was_refused() -> None:
    me, *others = REPLICAS
    spread = Spread(me, DELAY)
    spread.members(REPLICAS)  # the registry names this replica too
    assert others == spread.peers()
    ids = identities(300)
    theirs = [i for i in ids if spread.preferred(i) != me]
    mine = [i for i in ids if spread.preferred(i) == me]
    assert 60 < len(mine) < 140, len(mine)  # about a third
    tick = datetime(2026, 1, 1, tzinfo=UTC)
    started = time.monotonic()
    assert await spread.hold_back(mine[0], tick)  # at once: this replica is preferred
    assert time.monotonic() - started < DELAY.total_seconds() / 2
    spread.answered(tick)
    assert not await spread.hold_back(theirs[0], tick)
    assert time.monotonic() - started >= DELAY.total_seconds() * 0.9
    spread.members([me])  # the others left the registry
    assert [] == spread.peers()


def test_a_delay_of_zero_turns_spreading_off() -> None:
    spread = view("me", ["peer"], timedelta(0))
    assert [] == spread.peers()


async def test_a_held_back_claim_waits_the_delay_and_a_preferred_one_does_not() -> None:
    spread = view(REPLICAS[0], REPLICAS)
    jobs = identities(30)
    mine = next(i for i in jobs if spread.preferred(i) == REPLICAS[0])
    theirs = next(i for i in jobs if spread.preferred(i) != REPLICAS[0])
    tick = datetime(2026, 1, 1, tzinfo=UTC)
    started = time.monotonic()
    assert await spread.hold_back(mine, tick)
    at_once = time.monotonic() - started
    spread.answered(tick)
    assert not await spread.hold_back(theirs, tick)
    held = time.monotonic() - started - at_once
    assert at_once < DELAY.total_seconds() / 4
    assert held >= DELAY.total_seconds() * 0.9


async def test_held_back_claims_wait_for_this_replicas_own_claims_of_the_tick_to_be_answered() -> (
    None
):
    """A big tick takes this replica long to claim its own share; so it does the others'."""
    spread = view(REPLICAS[0], REPLICAS)
    jobs = identities(30)
    mine = next(i for i in jobs if spread.preferred(i) == REPLICAS[0])
    theirs = next(i for i in jobs if spread.preferred(i) != REPLICAS[0])
    tick = datetime(2026, 1, 1, tzinfo=UTC)
    assert await spread.hold_back(mine, tick)  # sent; its answer is slow to come
    held = asyncio.ensure_future(spread.hold_back(theirs, tick))
    await asyncio.sleep(DELAY.total_seconds() * 2)
    assert not held.done()  # the delay is over, but the own claim is unanswered
    answered = time.monotonic()
    spread.answered(tick)
    assert not await held
    assert time.monotonic() - answered >= DELAY.total_seconds() * 0.9


def request(identity: Identity, tick: datetime) -> ClaimRequest:
    return ClaimRequest(
        identity, tick, TIMING, deadline=tick + timedelta(seconds=30), spreadable=True
    )


async def test_replicas_share_a_tick_and_the_held_back_claims_share_one_statement(
    pg_dsn: str, schema: str, tmp_path: Path
) -> None:
    tick = datetime.now(UTC).replace(microsecond=0)
    jobs = [Identity.schedule(f"job-{n}", run_key_for(tick)) for n in range(12)]
    a, b = REPLICAS[:2]
    trace = tmp_path / "b.trace"
    async with (
        open_store(pg_dsn, schema, owner=a) as store_a,
        open_store(pg_dsn, schema, owner=b, migrate=False, max_size=1) as store_b,
    ):
        guard_a = LeaseGuard(store_a, spread=view(a, [b]))
        guard_b = LeaseGuard(store_b, spread=view(b, [a]))
        with trace.open("w") as wire:
            async with store_b.db.connection() as conn:
                conn.pgconn.trace(wire.fileno())
            answers = await asyncio.gather(
                *(guard.claim(request(i, tick)) for i in jobs for guard in (guard_a, guard_b))
            )
            async with store_b.db.connection() as conn:
                conn.pgconn.untrace()
    won = Counter(
        (guard.store.owner, answer.identity.code)
        for answer, guard in zip(answers, [guard_a, guard_b] * len(jobs), strict=True)
        if isinstance(answer, Held)
    )
    # Exactly one winner per job, and each job went to the replica it prefers.
    assert sorted(code for _, code in won) == sorted(i.code for i in jobs)
    spread = view(a, [b])
    assert {(spread.preferred(i), i.code) for i in jobs} == set(won)
    assert {a, b} == {owner for owner, _ in won}
    # b: its preferred claims at once, the held-back rest together: two statements.
    assert 2 == count_round_trips(trace.read_text())


async def test_a_tick_whose_preferred_replica_is_dead_runs_after_the_delay_only(
    pg_dsn: str, schema: str
) -> None:
    tick = datetime.now(UTC).replace(microsecond=0)
    me, dead = REPLICAS[:2]
    spread = view(me, [dead])
    jobs = [Identity.schedule(f"job-{n}", run_key_for(tick)) for n in range(20)]
    orphans = [i for i in jobs if spread.preferred(i) == dead]
    async with open_store(pg_dsn, schema, owner=me) as store:
        guard = LeaseGuard(store, spread=spread)
        started = time.monotonic()
        answers = await asyncio.gather(*(guard.claim(request(i, tick)) for i in orphans))
        took = time.monotonic() - started
    assert orphans and all(isinstance(answer, Held) for answer in answers)
    assert took >= DELAY.total_seconds() * 0.9


async def test_a_refused_claim_teaches_who_holds_the_tick(pg_dsn: str, schema: str) -> None:
    tick = datetime.now(UTC).replace(microsecond=0)
    identity = Identity.schedule("job", run_key_for(tick))
    async with (
        open_store(pg_dsn, schema, owner="winner:1") as winner,
        open_store(pg_dsn, schema, owner="late:2", migrate=False) as late,
    ):
        assert isinstance(await LeaseGuard(winner).claim(request(identity, tick)), Held)
        spread = Spread("late:2", DELAY)
        answer = await LeaseGuard(late, spread=spread).claim(request(identity, tick))
    assert isinstance(answer, Refused)
    assert ["winner:1"] == spread.peers()
