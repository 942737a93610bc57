"""The lease guard's promises at their edges: forbid order, expiries, late answers, hung beats.

Against a real PostgreSQL; a TCP proxy from the fault suite holds bytes where
a partition is the fault.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
import uuid
from datetime import UTC, datetime, timedelta

import psycopg
import pytest

from pgcrond.core.keys import Identity
from pgcrond.core.overlap import FORBID
from pgcrond.core.timing import LeaseTiming
from pgcrond.guard.base import ClaimRequest, Held, Refused, Verdict
from pgcrond.guard.lease import LeaseGuard
from pgcrond.storage.claim_answers import PendingClaim
from pgcrond.storage.claims import Acquired, NotAcquired, Renewal
from pgcrond.storage.db import Database
from pgcrond.storage.keepalive import holding
from pgcrond.storage.leases import LeaseStore
from pgcrond.storage.migrate import migrate
from pgcrond.storage.sync_store import SyncLeaseStore
from pgcrond.tickplan import CLAIM_AHEAD_MAX
from tests.faults.proxy import proxied

TWO_S = LeaseTiming.build(timedelta(seconds=2), timedelta(0))


def row(pg_dsn: str, schema: str, identity: Identity) -> dict[str, object]:
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        cur = conn.execute(
            "SELECT status, reason, error, expires_at, attempt, fencing_token "
            f'FROM "{schema}".leases WHERE code = %s AND run_key IS NOT DISTINCT FROM %s',
            (identity.code, identity.run_key),
        )
        found = cur.fetchone()
        assert found is not None
        columns = ["status", "reason", "error", "expires_at", "attempt", "fencing_token"]
        return dict(zip(columns, found, strict=True))


def tick_identity(code: str, seconds: int) -> tuple[datetime, Identity]:
    tick = datetime(2026, 1, 1, tzinfo=UTC) + timedelta(seconds=seconds)
    return tick, Identity.schedule(code, tick.strftime("%Y-%m-%dT%H:%M:%SZ"))


async def test_two_ticks_of_a_forbid_job_in_one_batch_are_decided_in_order(
    store: LeaseStore, pg_dsn: str, schema: str
) -> None:
    """Claimed in one call (a stall hands over missed fires at once): one runs, one skips."""
    _, first = tick_identity("forbid", 1)
    _, second = tick_identity("forbid", 2)
    answers = await store.claim_many(
        [PendingClaim(tick, TWO_S, uuid.uuid4(), FORBID) for tick in (first, second)]
    )
    assert isinstance(answers[0], Acquired)
    assert isinstance(answers[1], NotAcquired) and "overlap" == answers[1].reason
    assert "SKIPPED" == row(pg_dsn, schema, second)["status"]


async def test_forbid_is_serialised_across_replicas(
    pg_dsn: str, schema: str, store: LeaseStore
) -> None:
    """A retry of tick N on one replica and tick N+1 on another never both run."""
    other_db = Database(pg_dsn)
    await other_db.open()
    other = LeaseStore(other_db, schema=schema, owner="test:2")
    both_ran = 0
    try:
        for n in range(20):
            _, older = tick_identity(f"f{n}", 1)
            _, newer = tick_identity(f"f{n}", 2)
            won = await store.claim(older, TWO_S, overlap=FORBID)
            assert isinstance(won, Acquired)
            assert await store.fail(won, "boom", retry_after=timedelta(0))
            retry, fresh = await asyncio.gather(
                store.claim(older, TWO_S, overlap=FORBID),
                other.claim(newer, TWO_S, overlap=FORBID),
            )
            both_ran += isinstance(retry, Acquired) and isinstance(fresh, Acquired)
            assert isinstance(retry, Acquired) or isinstance(fresh, Acquired)
    finally:
        await other_db.close()
    assert 0 == both_ran


async def test_a_retried_claim_keeps_the_expiry_of_the_try_that_committed(
    store: LeaseStore,
) -> None:
    """The stop deadline comes from expires_at - db_now, not from the retry's send."""
    token = uuid.uuid4()
    _, identity = tick_identity("lost-reply", 1)
    timing = LeaseTiming.build(timedelta(seconds=4), timedelta(0))
    first = await store.claim(identity, timing, owner_token=token)
    assert isinstance(first, Acquired)
    await asyncio.sleep(1.0)
    again = await store.claim(identity, timing, owner_token=token)
    assert isinstance(again, Acquired)
    assert again.remaining is not None
    assert again.remaining <= timedelta(seconds=3.05)
    # Surely valid no later than the first try's expiry, by the local clock:
    # counted from the retry's own send it would be a second later (the sleep).
    # Each try's figure is short of the expiry by its own round trip's send to
    # execution, so they differ by that much (59 ms on a loaded machine,
    # fresh-clone CI run 81): a quarter second tells the two apart.
    assert again.valid_until <= first.valid_until + 0.25


async def test_an_error_text_the_database_cannot_store_is_recorded_cleaned(
    store: LeaseStore, pg_dsn: str, schema: str
) -> None:
    _, identity = tick_identity("nul", 1)
    lease = await store.claim(identity, TWO_S)
    assert isinstance(lease, Acquired)
    assert await store.fail(lease, "bad\x00byte and a lone \udcff surrogate", retry_after=None)
    stored = row(pg_dsn, schema, identity)
    assert "FAIL" == stored["status"]
    assert "bad\\0byte and a lone \\udcff surrogate" == stored["error"]


async def test_a_late_heartbeat_does_not_revive_an_expired_lease(
    store: LeaseStore, pg_dsn: str, schema: str
) -> None:
    """Nor does anything once a claim came since; the owner's check after a stall does."""
    short = LeaseTiming.build(timedelta(milliseconds=200), timedelta(0))
    identity, lease = await won(store, "late-beat", short)
    expired_at = row(pg_dsn, schema, identity)["expires_at"]
    await asyncio.sleep(0.3)
    assert await store.heartbeat(lease) is None
    assert expired_at == row(pg_dsn, schema, identity)["expires_at"]
    # The wake check (keepalive, after the loop stood still): nobody claimed since.
    renewed = await store.heartbeat(lease, revive=True)
    assert renewed is not None and renewed > timedelta(0)
    revived = row(pg_dsn, schema, identity)
    assert "RUNNING" == revived["status"]
    assert expired_at < revived["expires_at"]  # type: ignore[operator]
    # A claim since rotates the owner token: then nothing revives it.
    await asyncio.sleep(0.3)
    taken = await store.claim(identity, short)
    assert isinstance(taken, Acquired)
    assert await store.heartbeat(lease, revive=True) is None
    assert taken.fencing_token == row(pg_dsn, schema, identity)["fencing_token"]


ONE_S = LeaseTiming.build(timedelta(seconds=1), timedelta(milliseconds=300))


async def won(store: LeaseStore, code: str, timing: LeaseTiming) -> tuple[Identity, Acquired]:
    """A claim of a tick of ``code``, won."""
    _, identity = tick_identity(code, 1)
    lease = await store.claim(identity, timing)
    assert isinstance(lease, Acquired)
    return identity, lease


def stand_still(seconds: float) -> None:
    """Hold the event loop's thread, as a SIGSTOP of the process or a long stall does."""
    time.sleep(seconds)


async def test_a_loop_that_stood_still_past_the_stop_deadline_asks_before_stopping_the_run(
    store: LeaseStore, pg_dsn: str, schema: str
) -> None:
    """The run went on while the loop stood still: unclaimed, its lease is renewed, not dropped."""
    identity, lease = await won(store, "stall", ONE_S)
    async with holding(lease, store.heartbeat):
        before = row(pg_dsn, schema, identity)["expires_at"]
        stand_still(1.3)  # past the lease
        with contextlib.suppress(TimeoutError):
            reason = await asyncio.wait_for(lease.cancellation.wait(), 0.6)
            raise AssertionError(f"the run was stopped ({reason}) although its lease was free")
        after = row(pg_dsn, schema, identity)
    assert "RUNNING" == after["status"]
    assert before < after["expires_at"]  # type: ignore[operator]
    assert await store.complete(lease)


async def test_a_loop_that_stood_still_while_its_tick_was_taken_over_stops_the_run(
    store: LeaseStore, pg_dsn: str, schema: str
) -> None:
    identity, lease = await won(store, "stall-taken", ONE_S)
    with SyncLeaseStore(pg_dsn, schema=schema, owner="test:2") as other:
        async with holding(lease, store.heartbeat):
            stand_still(1.3)  # meanwhile another replica takes the tick over:
            assert isinstance(other.claim(identity, ONE_S), Acquired)
            reason = await asyncio.wait_for(lease.cancellation.wait(), 2)
    assert "lease_lost" == reason
    assert not await store.complete(lease)


async def test_a_run_is_told_to_stop_a_grace_and_a_margin_before_expiry(
    store: LeaseStore,
) -> None:
    """SIGKILL (at stop + grace) lands a margin before the lease can expire."""
    _, identity = tick_identity("margin", 1)
    lease = await store.claim(identity, TWO_S)
    assert isinstance(lease, Acquired)
    assert TWO_S.stop_margin > timedelta(0)
    async with holding(lease, store.heartbeat):
        reason = await asyncio.wait_for(lease.cancellation.wait(), 5)
    told_at = time.monotonic()
    kill_at = told_at + TWO_S.stop_grace.total_seconds()
    assert "lease_expired" == reason
    assert kill_at <= lease.valid_until - TWO_S.stop_margin.total_seconds() + 0.05


async def test_a_claim_answered_after_its_lease_is_going_is_given_back(
    store: LeaseStore, pg_dsn: str, schema: str
) -> None:
    """The answer's age is judged on arrival: no run starts on a lease that is going."""
    tick, identity = tick_identity("late-answer", 1)
    # The answer "arrives" 10 s after it was sent: as a partition that heals would deliver it.
    guard = LeaseGuard(store, clock=lambda: time.monotonic() + 10)
    answer = await guard.claim(ClaimRequest(identity, tick, TWO_S, deadline=None))
    assert isinstance(answer, Refused) and "retry_pending" == answer.reason
    stored = row(pg_dsn, schema, identity)
    assert ("FAIL", "released") == (stored["status"], stored["reason"])
    # Reclaimable at once, by this replica or any other.
    assert isinstance(await store.claim(identity, TWO_S), Acquired)


async def test_a_claim_past_the_misfire_window_by_the_database_clock_touches_nothing(
    store: LeaseStore, pg_dsn: str, schema: str
) -> None:
    _, identity = tick_identity("too-late", 1)
    late = await store.claim(identity, TWO_S, late_after=datetime.now(UTC) - timedelta(seconds=1))
    assert isinstance(late, NotAcquired) and "late" == late.reason
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        count = conn.execute(f'SELECT count(*) FROM "{schema}".leases').fetchone()
    assert (0,) == count


async def test_a_hung_heartbeat_does_not_hold_the_run_past_its_stop_deadline(
    pg_dsn: str, schema: str
) -> None:
    """Only the owner is cut off: the run is stopped by its own deadline, not the driver's."""
    with proxied(pg_dsn) as (proxy, dsn):
        db = Database(dsn)
        await db.open()
        try:
            leases = LeaseStore(db, schema=schema, owner="test:cut")
            await migrate(leases)
            _, identity = tick_identity("hung", 1)
            timing = LeaseTiming.build(timedelta(seconds=2), timedelta(milliseconds=300))
            lease = await leases.claim(identity, timing)
            assert isinstance(lease, Acquired)
            proxy.partition(6)
            async with holding(lease, leases.heartbeat):
                reason = await asyncio.wait_for(lease.cancellation.wait(), 5)
            stopped = time.monotonic()
        finally:
            proxy.heal()
            await db.close()
    assert "lease_expired" == reason
    assert stopped <= lease.stop_at + 0.3


async def test_a_tick_is_not_due_before_its_time_by_the_database_clock(
    store: LeaseStore, pg_dsn: str, schema: str
) -> None:
    """A replica whose clock runs fast past any lead is told how long to wait; nothing written."""
    fast = CLAIM_AHEAD_MAX + timedelta(seconds=2)
    fire_time = datetime.now(UTC) + fast
    identity = Identity.schedule("early", fire_time.strftime("%Y-%m-%dT%H:%M:%SZ"))
    early = await store.claim(identity, TWO_S, fire_time=fire_time)
    assert isinstance(early, NotAcquired) and "not_due" == early.reason
    assert early.wait is not None and fast - timedelta(seconds=0.5) < early.wait <= fast
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        count = conn.execute(f'SELECT count(*) FROM "{schema}".leases').fetchone()
    assert (0,) == count


async def test_a_won_claim_through_the_guard_is_held_with_its_fencing_token(
    store: LeaseStore,
) -> None:
    tick, identity = tick_identity("held", 1)
    guard = LeaseGuard(store)
    answer = await guard.claim(ClaimRequest(identity, tick, TWO_S, deadline=None))
    assert isinstance(answer, Held)
    assert answer.fencing_token is not None and 1 == answer.attempt
    assert "done" == await guard.record(answer, Verdict("success"))


async def test_a_dead_owners_tick_overlapped_by_a_newer_one_is_closed_skipped(
    store: LeaseStore, pg_dsn: str, schema: str
) -> None:
    """Under forbid, a lapsed tick that may not be taken over is closed, not left RUNNING."""
    _, older = tick_identity("closed", 1)
    _, newer = tick_identity("closed", 2)
    short = LeaseTiming.build(timedelta(milliseconds=200), timedelta(0))
    dead = await store.claim(older, short, overlap=FORBID)
    assert isinstance(dead, Acquired)
    await asyncio.sleep(0.3)  # its owner is gone: the lease lapses
    running = await store.claim(newer, TWO_S, overlap=FORBID)
    assert isinstance(running, Acquired)
    takeover = await store.claim(older, TWO_S, overlap=FORBID)
    assert isinstance(takeover, NotAcquired) and "overlap" == takeover.reason
    assert ("SKIPPED", "overlap") == (
        row(pg_dsn, schema, older)["status"],
        row(pg_dsn, schema, older)["reason"],
    )
    # The dead owner, should it come back, is fenced.
    assert not await store.complete(dead)


class CountingRenewals(LeaseStore):
    """The real store, counting the heartbeats that re-check a claim's answer."""

    renewals = 0

    def renew(self, lease: Acquired, *, revive: bool = False) -> asyncio.Future[Renewal | None]:
        self.renewals += 1
        return super().renew(lease, revive=revive)


@pytest.mark.parametrize(
    ("lease", "rechecks"),
    [(timedelta(minutes=1), 0), (timedelta(seconds=2), 1)],
    ids=["a-minute-lease-runs-at-once", "a-2s-lease-is-rechecked"],
)
async def test_a_slow_answer_whose_bounds_decide_runs_without_a_recheck(
    store: LeaseStore, pg_dsn: str, schema: str, lease: timedelta, rechecks: int
) -> None:
    """Live for half its lease and more, inside its window: no heartbeat before the run.

    The answer is slow because the server takes half a second over the claim
    (a trigger on the table sleeps before each insert). Half a second of a 2 s
    lease leaves less than half of it before the stop deadline: that answer
    is re-checked, which renews the lease before the run starts.
    """
    tick, identity = tick_identity("slow-clear", 1)
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        conn.execute(
            f'CREATE FUNCTION "{schema}".slow() RETURNS trigger LANGUAGE plpgsql '
            "AS $$ BEGIN PERFORM pg_sleep(0.5); RETURN NEW; END $$"
        )
        conn.execute(
            f'CREATE TRIGGER slow BEFORE INSERT ON "{schema}".leases '
            f'FOR EACH ROW EXECUTE FUNCTION "{schema}".slow()'
        )
    counting = CountingRenewals(store.db, schema=schema, owner="test:slow")
    timing = LeaseTiming.build(lease)
    answer = await LeaseGuard(counting).claim(ClaimRequest(identity, tick, timing, deadline=None))
    assert isinstance(answer, Held) and 1 == answer.attempt
    assert rechecks == counting.renewals
    assert "RUNNING" == row(pg_dsn, schema, identity)["status"]
