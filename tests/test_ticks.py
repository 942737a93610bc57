"""Every tick accounted for, in the store: MISSED rows, pause in the claim, job truth.

Against a real PostgreSQL: the claim statement itself records a late tick
MISSED and a paused job's tick SKIPPED, in its one round trip.
"""

from __future__ import annotations

import uuid
from datetime import timedelta
from pathlib import Path

import pytest

from pgcrond.core.keys import Identity
from pgcrond.core.schedule import run_key_for, tick_of
from pgcrond.core.timing import LeaseTiming
from pgcrond.storage import jobstate, ticks
from pgcrond.storage.claim_answers import PendingClaim
from pgcrond.storage.claims import Acquired, NotAcquired
from tests.helpers.store import count_round_trips, open_store, rows, tick_ago

SHORT = LeaseTiming.build(timedelta(seconds=30), timedelta(seconds=5))


async def test_a_claim_past_its_window_records_the_tick_missed_late_in_its_own_statement(
    pg_dsn: str, schema: str
) -> None:
    tick = tick_ago(120)
    identity = Identity.schedule("late-job", run_key_for(tick))
    async with open_store(pg_dsn, schema, owner="late:1") as store:
        answer = await store.claim(
            identity, SHORT, fire_time=tick, late_after=tick + timedelta(seconds=30)
        )
        again = await store.claim(
            identity, SHORT, fire_time=tick, late_after=tick + timedelta(seconds=30)
        )
    assert isinstance(answer, NotAcquired) and isinstance(again, NotAcquired)
    assert ("late", "MISSED") == (answer.reason, answer.status)
    assert answer.detail is not None and answer.detail.startswith("replica too late: late:1")
    # The second late claim finds the row and touches nothing.
    assert ("late", None) == (again.reason, again.status)
    [row] = rows(pg_dsn, schema, "late-job")
    assert ("MISSED", "late", 0, tick) == (
        row["status"],
        row["reason"],
        row["attempt"],
        row["acquired_at"],
    )


async def test_a_late_claim_leaves_a_tick_that_ran_alone(pg_dsn: str, schema: str) -> None:
    tick = tick_ago(1)
    identity = Identity.schedule("ran", run_key_for(tick))
    async with open_store(pg_dsn, schema) as store:
        won = await store.claim(identity, SHORT, fire_time=tick)
        assert isinstance(won, Acquired)
        assert await store.complete(won)
        late = await store.claim(identity, SHORT, fire_time=tick, late_after=tick)
    assert isinstance(late, NotAcquired) and "late" == late.reason
    assert ["SUCCESS"] == [r["status"] for r in rows(pg_dsn, schema, "ran")]


async def test_a_paused_job_has_its_tick_recorded_skipped_with_who_when_why(
    pg_dsn: str, schema: str
) -> None:
    async with open_store(pg_dsn, schema) as store:
        [pause] = await jobstate.pause(store, ["nightly"], by="ops:42", reason="db upgrade")
        tick = tick_ago(0)
        identity = Identity.schedule("nightly", run_key_for(tick))
        answer = await store.claim(identity, SHORT, fire_time=tick)
        other = await store.claim(identity, SHORT, fire_time=tick)
        assert ["nightly"] == await jobstate.resume(store, ["nightly"])
        next_tick = tick - timedelta(seconds=1)
        resumed = await store.claim(
            Identity.schedule("nightly", run_key_for(next_tick)), SHORT, fire_time=next_tick
        )
    assert isinstance(answer, NotAcquired) and "paused" == answer.reason
    assert answer.detail is not None and "paused by ops:42" in answer.detail
    assert answer.detail.endswith(": db upgrade")
    # Every other replica finds the tick done: it was skipped once, for all.
    assert isinstance(other, NotAcquired) and "done" == other.reason
    assert isinstance(resumed, Acquired)
    by_key = {r["run_key"]: r for r in rows(pg_dsn, schema, "nightly")}
    skipped = by_key[run_key_for(tick)]
    assert ("SKIPPED", "paused") == (skipped["status"], skipped["reason"])
    assert "ops:42" == pause.paused_by


async def test_pausing_every_job_pauses_each_and_manual_runs_go_through(
    pg_dsn: str, schema: str
) -> None:
    async with open_store(pg_dsn, schema) as store:
        await jobstate.pause(store, [jobstate.ALL_JOBS], by="ops:1", reason=None)
        tick = tick_ago(0)
        scheduled = await store.claim(
            Identity.schedule("any", run_key_for(tick)), SHORT, fire_time=tick
        )
        manual = await store.claim(
            Identity.schedule("any", "manual:2026-01-01T00:00Z"), SHORT, fire_time=tick
        )
        # A run-once job is refused without a row, so that it runs once resumed.
        initial = await store.claim(Identity.initial("seed"), SHORT)
        paused = await jobstate.paused(store)
        assert ["*"] == await jobstate.resume(store, [], all_jobs=True)
        after = await store.claim(Identity.initial("seed"), SHORT)
    assert isinstance(scheduled, NotAcquired) and "paused" == scheduled.reason
    assert isinstance(manual, Acquired)
    assert isinstance(initial, NotAcquired) and "paused" == initial.reason
    assert ["*"] == list(paused)
    assert isinstance(after, Acquired)


async def test_a_suspended_job_is_skipped_as_suspended(pg_dsn: str, schema: str) -> None:
    tick = tick_ago(0)
    async with open_store(pg_dsn, schema) as store:
        answer = await store.claim(
            Identity.schedule("off", run_key_for(tick)),
            SHORT,
            fire_time=tick,
            suspended="suspended: true in jobs.yaml:3",
        )
    assert isinstance(answer, NotAcquired) and "paused" == answer.reason
    [row] = rows(pg_dsn, schema, "off")
    assert ("SKIPPED", "suspended", "suspended: true in jobs.yaml:3") == (
        row["status"],
        row["reason"],
        row["error"],
    )


async def test_a_retry_due_while_paused_waits_for_resume(pg_dsn: str, schema: str) -> None:
    tick = tick_ago(0)
    identity = Identity.schedule("flaky", run_key_for(tick))
    async with open_store(pg_dsn, schema) as store:
        won = await store.claim(identity, SHORT, fire_time=tick)
        assert isinstance(won, Acquired)
        assert await store.fail(won, "boom", retry_after=timedelta(0))
        await jobstate.pause(store, ["flaky"], by="ops:1", reason=None)
        refused = await store.claim(identity, SHORT, fire_time=tick)
        await jobstate.resume(store, ["flaky"])
        retried = await store.claim(identity, SHORT, fire_time=tick)
    assert isinstance(refused, NotAcquired) and "paused" == refused.reason
    assert isinstance(retried, Acquired) and 2 == retried.attempt


async def test_a_paused_claim_is_still_one_round_trip(
    pg_dsn: str, schema: str, tmp_path: Path
) -> None:
    """Pause is read inside the claim: a chunk of paused, late and fresh claims is one trip."""
    tick = tick_ago(0)
    old = tick_ago(600)
    claims = [
        (Identity.schedule("traced", run_key_for(tick)), tick, None),
        (Identity.schedule("fresh", run_key_for(tick)), tick, None),
        (Identity.schedule("gone", run_key_for(old)), old, old + timedelta(seconds=30)),
    ]
    trace = tmp_path / "wire.trace"
    async with open_store(pg_dsn, schema, max_size=1) as store:
        await jobstate.pause(store, ["traced"], by="ops:1", reason=None)
        with trace.open("w") as wire:
            async with store.db.connection() as conn:
                conn.pgconn.trace(wire.fileno())
            answers = await store.claim_many(
                [
                    PendingClaim(identity, SHORT, uuid.uuid4(), None, at, late)
                    for identity, at, late in claims
                ]
            )
            async with store.db.connection() as conn:
                conn.pgconn.untrace()
    assert 1 == count_round_trips(trace.read_text())
    assert ["paused", None, "late"] == [
        a.reason if isinstance(a, NotAcquired) else None for a in answers
    ]


async def test_missed_ticks_are_recorded_once_and_never_over_a_run(
    pg_dsn: str, schema: str
) -> None:
    base = tick_ago(600).replace(second=0)
    async with open_store(pg_dsn, schema) as store:
        ran = Identity.schedule("job", run_key_for(base))
        won = await store.claim(ran, SHORT, fire_time=base)
        assert isinstance(won, Acquired) and await store.complete(won)
        misses = [
            ticks.Miss(
                "job",
                base + timedelta(minutes=n),
                "no_replica",
                "no replica was running",
                timedelta(seconds=30),
            )
            for n in range(3)
        ]
        first = await ticks.record_missed(store, misses)
        second = await ticks.record_missed(store, misses)
        last = await ticks.last_ticks(store, ["job", "never"], within=timedelta(hours=1))
        [truth] = await ticks.job_ticks(store, ["job"])
    assert [base + timedelta(minutes=n) for n in (1, 2)] == [m.tick for m in first]
    assert [] == second
    assert {"job": base + timedelta(minutes=2), "never": None} == last.last
    assert ["SUCCESS", "MISSED", "MISSED"] == [r["status"] for r in rows(pg_dsn, schema, "job")]
    assert (2, run_key_for(base)) == (truth["recent_misses"], truth["last_success_run_key"])


async def test_a_reason_the_table_does_not_know_is_refused(pg_dsn: str, schema: str) -> None:
    async with open_store(pg_dsn, schema) as store:
        with pytest.raises(ValueError, match="not a reason"):
            await ticks.record_missed(store, [ticks.Miss("j", tick_ago(0), "x", "y", timedelta(0))])


async def test_a_tick_claimed_after_the_boundary_does_not_hide_the_gap_before_it(
    pg_dsn: str, schema: str
) -> None:
    # The restart race: a replica's first fresh claim lands before its scan asks
    # where the record ends; asked with the start's boundary, the gap stays visible.
    base = tick_ago(600).replace(second=0)
    async with open_store(pg_dsn, schema) as store:
        old = await store.claim(Identity.schedule("job", run_key_for(base)), SHORT, fire_time=base)
        assert isinstance(old, Acquired) and await store.complete(old)
        began = await ticks.database_now(store)
        fresh_tick = tick_ago(0)
        fresh = await store.claim(
            Identity.schedule("job", run_key_for(fresh_tick)), SHORT, fire_time=fresh_tick
        )
        assert isinstance(fresh, Acquired)
        within = timedelta(hours=1)
        unbounded = await ticks.last_ticks(store, ["job"], within=within)
        bounded = await ticks.last_ticks(store, ["job"], within=within, before=began)
    assert {"job": tick_of(run_key_for(fresh_tick))} == unbounded.last
    assert {"job": base} == bounded.last
