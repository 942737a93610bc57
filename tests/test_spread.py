"""Spread: a tick's runs shared across replicas, learned from the claims, never a duplicate.

The ranking is pure (rendezvous hashing); the learning is tested with real
lease guards on a real PostgreSQL (the hold-back is the deferral's,
``tests/test_deferral.py``).
"""

from __future__ import annotations

from collections import Counter
from datetime import UTC, datetime, timedelta

from pgcrond.core.keys import Identity
from pgcrond.core.schedule import run_key_for
from pgcrond.core.timing import LeaseTiming
from pgcrond.guard.base import ClaimRequest, Held, Refused
from pgcrond.guard.lease import LeaseGuard
from pgcrond.guard.spread import Spread
from tests.helpers.store import open_store

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


def test_peers_named_by_the_registry_are_ranked_before_any_claim_was_refused() -> None:
    me, *others = REPLICAS
    spread = Spread(me, DELAY)
    spread.members(REPLICAS)  # the registry names this replica too
    assert others == spread.peers()
    ids = identities(300)
    theirs = [i for i in ids if spread.preferred(i) != me]
    mine = [i for i in ids if spread.preferred(i) == me]
    assert 60 < len(mine) < 140, len(mine)  # about a third
    assert not spread.defers(mine[0]) and spread.defers(theirs[0])
    spread.members([me])  # the others left the registry
    assert [] == spread.peers()


def test_a_delay_of_zero_turns_spreading_off() -> None:
    spread = view("me", ["peer"], timedelta(0))
    assert [] == spread.peers()


def request(identity: Identity, tick: datetime) -> ClaimRequest:
    return ClaimRequest(identity, tick, TIMING, deadline=tick + timedelta(seconds=30))


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
