"""The fire's decisions over the in-memory guard: no database, every branch.

Runs are real (``/bin/true`` and ``/bin/false``, or the in-process entrypoints
of ``tests/jobs_fixture.py``); the guard answers as the lease table would, or
as a test scripts it, or, for the paths a guard's bug takes, as a small
subclass here breaks it (a claim, a keep-alive or a record that raises).
Subscribers of the fire's events (``Events``) see what it told the replica.

The decisions themselves are the decide table's (``tests/test_decide.py``
holds it to 100 % of its branches); here the fire carries them out.
"""

from __future__ import annotations

import asyncio
import contextlib
import uuid
from collections import deque
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
import structlog

from pgcrond.config.loader import load_config
from pgcrond.config.models import JobConfig
from pgcrond.core.keys import Identity
from pgcrond.core.outcome import RunResult
from pgcrond.core.schedule import run_key_for
from pgcrond.errors import PgcrondError
from pgcrond.events import FireEvents
from pgcrond.fire import Fire, Firing
from pgcrond.guard.base import (
    ClaimRequest,
    Held,
    Outcome,
    Recorded,
    RefusalReason,
    Refused,
    Verdict,
)
from pgcrond.guard.memory import MemoryGuard, Row
from pgcrond.run import leftovers
from tests import jobs_fixture
from tests.helpers.daemon_harness import until
from tests.helpers.fire import quick_job


def now_tick(offset: float = 0.0) -> tuple[datetime, Identity]:
    tick = datetime.now(UTC) + timedelta(seconds=offset)
    return tick, Identity.schedule("j", run_key_for(tick))


def request_identity() -> Identity:
    """A request's identity: its run key is no tick (``manual:...``), and no other test's."""
    return Identity.schedule("j", f"manual:{uuid.uuid4().hex}")


def firing(guard: MemoryGuard, events: FireEvents | None = None) -> Firing:
    return Firing(guards=lambda _: guard, replica="unit:1", events=events or FireEvents())


def logged(logs: list[structlog.typing.EventDict], event: str) -> list[structlog.typing.EventDict]:
    return [e for e in logs if e["event"] == event]


class Events(FireEvents):
    """A subscriber that notes what the fire told it; ``on[event]`` is called once, on its first."""

    def __init__(self) -> None:
        self.seen: list[tuple[str, object]] = []
        self.on: dict[str, Callable[[], None]] = {}

    def of(self, event: str) -> list[object]:
        return [detail for name, detail in self.seen if name == event]

    def _note(self, event: str, detail: object = None) -> None:
        self.seen.append((event, detail))
        action = self.on.pop(event, None)
        if action is not None:
            action()

    def claim_lost(self, job: JobConfig, reason: str) -> None:
        self._note("claim_lost", reason)

    def skipped(self, job: JobConfig, reason: str) -> None:
        self._note("skipped", reason)

    def paused(self, job: JobConfig, paused: bool) -> None:
        self._note("paused", paused)

    def missed(
        self, job: JobConfig, identity: Identity, tick: datetime, cause: str, recorded: bool
    ) -> None:
        self._note("missed", (cause, recorded))

    def run_started(self, job: JobConfig, lateness_s: float) -> None:
        self._note("run_started")

    def run_finished(self, job: JobConfig, outcome: str, duration_s: float) -> None:
        self._note("run_finished", outcome)

    def recorded(self, job: JobConfig, kind: Outcome, final: bool) -> None:
        self._note("recorded", (kind, final))

    def failed_for_good(self, job: JobConfig, held: Held, result: RunResult) -> None:
        self._note("failed_for_good", result.outcome)

    def database(self, operation: str, ok: bool) -> None:
        self._note("database", (operation, ok))


# -- guards with a bug or a lapse of their own (one method each) ---------------------------


@dataclass
class ClaimRaises(MemoryGuard):
    """Every claim raises ``error``."""

    error: Exception = field(
        default_factory=lambda: RuntimeError("a batch answered a request given up on")
    )

    async def claim(self, request: ClaimRequest) -> Held | Refused:
        self.calls.append("claim")
        raise self.error


@dataclass
class RecordRaises(MemoryGuard):
    """The first ``failures`` records raise an error that is no outage."""

    failures: int = 3

    async def record(self, held: Held, verdict: Verdict) -> Recorded:
        if self.failures > 0:
            self.failures -= 1
            self.calls.append(f"record:{verdict.outcome}")
            raise RuntimeError("record bug")
        return await super().record(held, verdict)


@dataclass
class HoldRaises(MemoryGuard):
    """The keep-alive cannot start: the run never begins."""

    def hold(self, held: Held) -> contextlib.AbstractAsyncContextManager[Held]:
        raise RuntimeError("keep-alive bug")


@dataclass
class LetGoRaises(MemoryGuard):
    """The keep-alive raises as it ends, after the run did."""

    def hold(self, held: Held) -> contextlib.AbstractAsyncContextManager[Held]:
        @contextlib.asynccontextmanager
        async def holding() -> AsyncIterator[Held]:
            yield held
            raise RuntimeError("keep-alive bug on the way out")

        return holding()


@dataclass
class CancelsFirstRun(MemoryGuard):
    """The first run's cancellation is set, with ``reason``, as its keep-alive begins."""

    reason: str = "lease_lost"
    _done: bool = False

    def hold(self, held: Held) -> contextlib.AbstractAsyncContextManager[Held]:
        if not self._done:
            self._done = True
            held.cancellation.cancel(self.reason)
        return super().hold(held)


@dataclass
class CancelsTheFire(MemoryGuard):
    """The fire's own task is cancelled (a shutdown) as the run begins: it is
    delivered at the run's first wait, before the job is under way."""

    def hold(self, held: Held) -> contextlib.AbstractAsyncContextManager[Held]:
        task = asyncio.current_task()
        assert task is not None
        task.cancel()
        return super().hold(held)


@pytest.mark.usefixtures("subprocesses")
async def test_a_won_claim_runs_and_records_success(tmp_path: Path) -> None:
    guard = MemoryGuard()
    tick, identity = now_tick()
    outcome = await firing(guard).fire(Fire(quick_job(command=["true"]), tick, identity))
    assert "success" == outcome
    assert "SUCCESS" == guard.rows[identity].status
    assert ["claim", "record:success"] == guard.calls


@pytest.mark.usefixtures("subprocesses")
async def test_a_failure_with_retries_left_is_claimed_again_and_retried(tmp_path: Path) -> None:
    guard = MemoryGuard()
    tick, identity = now_tick()
    failing = quick_job(command=["false"], retries=1, retry_delay="50ms")
    with structlog.testing.capture_logs() as logs:
        outcome = await firing(guard).fire(Fire(failing, tick, identity))
    attempts = [e["attempt"] for e in logs if e["event"] == "run_finished"]
    assert "fail" == outcome
    assert [1, 2] == attempts
    assert ("FAIL", None) == (guard.rows[identity].status, guard.rows[identity].retry_at)


@pytest.mark.usefixtures("subprocesses")
async def test_a_tick_held_elsewhere_is_taken_over_once_its_lease_lapses(tmp_path: Path) -> None:
    guard = MemoryGuard()
    tick, identity = now_tick()
    # A dead winner's row: RUNNING, its lease lapsing 100 ms from now.
    guard.rows[identity] = Row("RUNNING", 1, 99, datetime.now(UTC) + timedelta(milliseconds=100))
    outcome = await firing(guard).fire(Fire(quick_job(command=["true"]), tick, identity))
    assert "success" == outcome
    assert (2, "SUCCESS") == (guard.rows[identity].attempt, guard.rows[identity].status)


@pytest.mark.usefixtures("subprocesses")
async def test_a_fenced_outcome_is_not_recorded_and_the_tick_is_still_followed(
    tmp_path: Path,
) -> None:
    """Losing its own attempt does not make a replica stop following the tick."""
    guard = MemoryGuard(script=deque([None, "fence"]))  # type: ignore[list-item]
    tick, identity = now_tick()
    with structlog.testing.capture_logs() as logs:
        outcome = await firing(guard).fire(Fire(quick_job(command=["true"]), tick, identity))
    assert any(e["event"] == "outcome_fenced" for e in logs)
    # Its own lapsed row was taken over by the next claim and run to the end.
    assert "success" == outcome
    assert (2, "SUCCESS") == (guard.rows[identity].attempt, guard.rows[identity].status)


@pytest.mark.usefixtures("subprocesses")
async def test_a_claim_is_retried_through_an_outage_within_the_misfire_window(
    tmp_path: Path,
) -> None:
    guard = MemoryGuard(script=deque(["unavailable", "unavailable"]))
    tick, identity = now_tick()
    outcome = await firing(guard).fire(Fire(quick_job(command=["true"]), tick, identity))
    assert "success" == outcome
    assert ["claim", "claim", "claim", "record:success"] == guard.calls


async def test_an_outage_longer_than_the_misfire_window_is_a_miss(tmp_path: Path) -> None:
    guard = MemoryGuard(script=deque(["unavailable"] * 50))
    tick, identity = now_tick(-0.5)
    with structlog.testing.capture_logs() as logs:
        outcome = await firing(guard).fire(Fire(quick_job(command=["true"]), tick, identity))
    missed = [e for e in logs if e["event"] == "tick_missed"]
    assert "misfire" == outcome
    assert ["database_unavailable"] == [e["cause"] for e in missed]


async def test_a_fire_later_than_the_misfire_grace_never_claims(tmp_path: Path) -> None:
    """Under a guard without history: the replica's clock is all there is to judge by."""
    guard = MemoryGuard(remembers=False)
    tick, identity = now_tick(-2)
    outcome = await firing(guard).fire(Fire(quick_job(command=["true"]), tick, identity))
    assert "misfire" == outcome
    assert [] == guard.calls


async def test_a_late_fire_under_a_guard_with_history_is_judged_by_its_claim(
    tmp_path: Path,
) -> None:
    """The guard's clock (the database's) decides, not the replica's."""
    guard = MemoryGuard()
    tick, identity = now_tick(-2)
    outcome = await firing(guard).fire(Fire(quick_job(command=["true"]), tick, identity))
    assert "misfire" == outcome
    assert ["claim"] == guard.calls


@pytest.mark.usefixtures("subprocesses")
async def test_a_tick_not_due_by_the_guards_clock_waits_and_then_runs(tmp_path: Path) -> None:
    """A replica whose clock runs ahead waits for the database's."""
    guard = MemoryGuard()
    tick, identity = now_tick(0.3)
    outcome = await firing(guard).fire(Fire(quick_job(command=["true"]), tick, identity))
    assert "success" == outcome
    assert ["claim", "claim", "record:success"] == guard.calls


@pytest.mark.parametrize("reason", ["overlap"])
async def test_an_overlap_refusal_is_a_skip(tmp_path: Path, reason: str) -> None:
    tick, identity = now_tick()
    guard = MemoryGuard(script=deque([Refused(identity, reason)]))  # type: ignore[arg-type]
    outcome = await firing(guard).fire(Fire(quick_job(command=["true"]), tick, identity))
    assert "skip" == outcome


@pytest.mark.usefixtures("subprocesses")
async def test_a_due_retry_blocked_by_a_newer_running_tick_waits_for_it(tmp_path: Path) -> None:
    """Forbid: a started tick's retry (FAIL, due) meets a newer tick's run: not dropped.

    Nobody else would ever claim it again (every follower gets the same
    answer): it is claimed again once the newer run could be over.
    """
    tick, identity = now_tick(-0.5)
    blocked = Refused(identity, "overlap", "FAIL", attempt=1)
    guard = MemoryGuard(script=deque([blocked]))
    forbid = quick_job(command=["true"], concurrency="forbid")
    outcome = await firing(guard).fire(Fire(forbid, tick, identity, started=True))
    assert "success" == outcome
    assert ["claim", "claim", "record:success"] == guard.calls


async def test_a_first_claim_after_the_next_tick_is_coalesced_by_the_guard(
    tmp_path: Path,
) -> None:
    """late_ticks: coalesce: a guard with history decides, in its claim."""
    guard = MemoryGuard()
    tick, identity = now_tick(-0.5)
    with structlog.testing.capture_logs() as logs:
        outcome = await firing(guard).fire(
            Fire(quick_job(command=["true"]), tick, identity, superseded_at=tick)
        )
    assert "misfire" == outcome
    assert ["claim"] == guard.calls
    assert ["coalesced"] == [e["cause"] for e in logs if e["event"] == "tick_missed"]


async def test_a_coalesced_tick_under_a_guard_without_history_never_claims(
    tmp_path: Path,
) -> None:
    guard = MemoryGuard(remembers=False)
    tick, identity = now_tick(-0.5)
    outcome = await firing(guard).fire(
        Fire(quick_job(command=["true"]), tick, identity, superseded_at=tick)
    )
    assert "misfire" == outcome
    assert [] == guard.calls


@pytest.mark.usefixtures("subprocesses")
async def test_a_retry_is_never_coalesced(tmp_path: Path) -> None:
    """Coalescing bounds a tick's first start only, like misfire_grace."""
    guard = MemoryGuard()
    tick, identity = now_tick(-0.5)
    # The retry waits at least 400 ms (half of retry_delay): past superseded_at.
    failing = quick_job(command=["false"], retries=1, retry_delay="800ms")
    superseded = datetime.now(UTC) + timedelta(milliseconds=300)
    with structlog.testing.capture_logs() as logs:
        outcome = await firing(guard).fire(Fire(failing, tick, identity, superseded_at=superseded))
    assert "fail" == outcome
    assert [1, 2] == [e["attempt"] for e in logs if e["event"] == "run_finished"]


async def test_a_late_answer_is_a_miss_not_a_run(tmp_path: Path) -> None:
    tick, identity = now_tick()
    guard = MemoryGuard(script=deque([Refused(identity, "late")]))
    outcome = await firing(guard).fire(Fire(quick_job(command=["true"]), tick, identity))
    assert "misfire" == outcome


@pytest.mark.usefixtures("subprocesses")
async def test_a_pending_retry_is_followed_past_the_misfire_window(tmp_path: Path) -> None:
    """A retry scheduled by another replica is taken by whoever follows the tick."""
    tick, identity = now_tick(-0.5)
    pending = Refused(
        identity, "retry_pending", "FAIL", wait=timedelta(seconds=0.7), attempt=1, cause="error"
    )
    guard = MemoryGuard(script=deque([pending]))
    outcome = await firing(guard).fire(Fire(quick_job(command=["true"]), tick, identity))
    assert "success" == outcome
    assert ["claim", "claim", "record:success"] == guard.calls


async def test_a_lost_tick_is_not_followed_by_trigger(tmp_path: Path) -> None:
    tick, identity = now_tick()
    held = Refused(identity, "held", "RUNNING", wait=timedelta(seconds=0.1), attempt=1)
    guard = MemoryGuard(script=deque([held]))
    outcome = await firing(guard).fire(
        Fire(quick_job(command=["true"]), tick, identity, follow=False)
    )
    assert "lose" == outcome
    assert ["claim"] == guard.calls


@pytest.mark.usefixtures("subprocesses")
async def test_a_started_tick_is_taken_over_past_the_misfire_window(tmp_path: Path) -> None:
    """misfire_grace bounds a first start: a tick some replica started is followed to its end."""
    tick, identity = now_tick(-0.5)
    held = Refused(identity, "held", "RUNNING", wait=timedelta(seconds=0.7), attempt=1)
    guard = MemoryGuard(script=deque([held]))
    outcome = await firing(guard).fire(Fire(quick_job(command=["true"]), tick, identity))
    assert "success" == outcome
    assert ["claim", "claim", "record:success"] == guard.calls


@pytest.mark.usefixtures("subprocesses")
async def test_a_forbid_claim_waits_while_an_abandoned_run_of_the_job_still_runs_here(
    tmp_path: Path,
) -> None:
    """Its lease may have lapsed at the database: the claim would be granted beside it."""
    guard = MemoryGuard(stop_grace=timedelta(milliseconds=200))
    path = tmp_path / "jobs.yaml"
    path.write_text(
        "database: {url: 'postgresql://unused@127.0.0.1/x'}\n"
        "jobs:\n"
        "  j: {cron: '* * * * *', lease: 200ms, heartbeat: 0s, misfire_grace: 30s,\n"
        "      entrypoint: 'tests.jobs_fixture:ignore_cancel', timeout: 100ms,\n"
        "      concurrency: forbid}\n"
    )
    stuck = load_config([path]).jobs["j"]
    first_tick, first = now_tick(-2)
    second_tick, second = now_tick(-1)
    jobs_fixture.RELEASE[second.run_key or ""].set()  # the next run returns at once
    try:
        with structlog.testing.capture_logs() as logs:
            assert "timeout" == await firing(guard).fire(Fire(stuck, first_tick, first))
            assert any(e["event"] == "entrypoint_thread_abandoned" for e in logs)
            following = asyncio.create_task(firing(guard).fire(Fire(stuck, second_tick, second)))
            await asyncio.sleep(0.3)
            # The abandoned thread still runs: no claim of the next tick yet.
            assert ["claim", "record:timeout"] == guard.calls
            jobs_fixture.RELEASE[first.run_key or ""].set()
            assert "success" == await asyncio.wait_for(following, 5)
    finally:
        jobs_fixture.RELEASE[first.run_key or ""].set()
    assert ["claim", "record:timeout", "claim", "record:success"] == guard.calls
    assert 1 == sum(e["event"] == "claim_waits" for e in logs)


# -- one identity at a time; a fire cancelled; a replica stopping ---------------------------


async def test_a_second_fire_of_one_identity_joins_the_first_and_claims_nothing(
    tmp_path: Path,
) -> None:
    """A request's run key is no tick: its run says nothing about a pause of the job."""
    guard, events = MemoryGuard(), Events()
    fire = firing(guard, events)
    identity = request_identity()
    key = identity.run_key or ""
    gated = quick_job(entrypoint="tests.jobs_fixture:ignore_cancel")
    tick = datetime.now(UTC)
    try:
        with structlog.testing.capture_logs() as logs:
            first = asyncio.create_task(fire.fire(Fire(gated, tick, identity)))
            await until(jobs_fixture.STARTED[key].is_set)
            assert fire.in_flight(identity)
            second = asyncio.create_task(fire.fire(Fire(gated, tick, identity)))
            await until(lambda: bool(logged(logs, "fire_joined")))
            jobs_fixture.RELEASE[key].set()
            outcomes = await asyncio.wait_for(asyncio.gather(first, second), 5)
    finally:
        jobs_fixture.RELEASE[key].set()
    assert ["success", "success"] == list(outcomes)
    assert not fire.in_flight(identity)
    assert ["claim", "record:success"] == guard.calls
    assert 1 == len(events.of("run_started"))
    assert [] == events.of("paused")


async def test_a_fire_cancelled_while_it_runs_ends_its_run_and_every_joiner(
    tmp_path: Path,
) -> None:
    guard, events = MemoryGuard(), Events()
    fire = firing(guard, events)
    identity = request_identity()
    waiting = quick_job(entrypoint="tests.jobs_fixture:wait_then_return_async")
    tick = datetime.now(UTC)
    with structlog.testing.capture_logs() as logs:
        first = asyncio.create_task(fire.fire(Fire(waiting, tick, identity)))
        await until(jobs_fixture.STARTED[identity.run_key or ""].is_set)
        joiner = asyncio.create_task(fire.fire(Fire(waiting, tick, identity)))
        await until(lambda: bool(logged(logs, "fire_joined")))
        first.cancel()
        with pytest.raises(asyncio.CancelledError):
            await asyncio.wait_for(first, 5)
        with pytest.raises(asyncio.CancelledError):
            await asyncio.wait_for(joiner, 5)
    assert not fire.in_flight(identity)
    assert {} == fire.running
    # Nothing recorded: the row stays RUNNING until its lease lapses, then is taken over.
    assert ["claim"] == guard.calls
    assert "RUNNING" == guard.rows[identity].status
    assert ["fail"] == events.of("run_finished")


@pytest.mark.usefixtures("subprocesses")
async def test_a_fire_cancelled_before_its_run_is_under_way_reports_no_run(
    tmp_path: Path,
) -> None:
    guard, events = CancelsTheFire(), Events()
    fire = firing(guard, events)
    tick, identity = now_tick()
    with pytest.raises(asyncio.CancelledError):
        await asyncio.wait_for(fire.fire(Fire(quick_job(command=["true"]), tick, identity)), 5)
    assert ["claim"] == guard.calls
    assert {} == fire.running
    assert not fire.in_flight(identity)
    # Never started, so never finished either: the running gauge stays even.
    assert ([], []) == (events.of("run_started"), events.of("run_finished"))


async def test_stop_wakes_every_follower_asleep_on_the_wheel(tmp_path: Path) -> None:
    """Three dead winners' leases lapse at one instant: their followers sleep on the
    wheel until then, and stop() wakes them, passing over a follower cancelled meanwhile."""
    guard, events = MemoryGuard(), Events()
    fire = Firing(guards=lambda _: guard, replica="unit:1", events=events)
    lapse = datetime.now(UTC) + timedelta(seconds=30)  # stop() comes long before
    identities = [request_identity() for _ in range(3)]
    for identity in identities:
        guard.rows[identity] = Row("RUNNING", 1, 99, lapse)
    ok = quick_job(command=["true"])
    followers = [asyncio.create_task(fire.fire(Fire(ok, datetime.now(UTC), i))) for i in identities]
    # Lost, then asleep: nothing between the two lets another task run.
    await until(lambda: 3 == len(events.of("claim_lost")))
    assert 3 == len(fire._asleep)
    followers[2].cancel()
    with pytest.raises(asyncio.CancelledError):
        await followers[2]
    fire.stop()
    assert ["lose", "lose"] == await asyncio.wait_for(asyncio.gather(*followers[:2]), 5)
    assert set() == fire._asleep
    assert ["claim"] * 3 == guard.calls


async def test_a_follower_stopped_before_it_goes_to_sleep_claims_no_more(tmp_path: Path) -> None:
    """stop() came as the claim's loss was told: no sleep until a lease lapses a minute away."""
    tick, identity = now_tick()
    held = Refused(identity, "held", "RUNNING", wait=timedelta(minutes=1), attempt=1)
    guard, events = MemoryGuard(script=deque([held])), Events()
    fire = firing(guard, events)
    events.on["claim_lost"] = fire.stop
    ok = quick_job(command=["true"])
    assert "lose" == await asyncio.wait_for(fire.fire(Fire(ok, tick, identity)), 5)
    assert ["claim"] == guard.calls
    assert set() == fire._asleep


async def test_a_fire_after_stop_claims_nothing(tmp_path: Path) -> None:
    guard = MemoryGuard()
    fire = firing(guard)
    fire.stop()
    tick, identity = now_tick()
    assert "lose" == await fire.fire(Fire(quick_job(command=["true"]), tick, identity))
    assert [] == guard.calls
    assert not fire.in_flight(identity)


async def test_a_claim_in_an_outage_gives_up_once_the_replica_stops(tmp_path: Path) -> None:
    """After its own failed run: what it ran is the fire's outcome, not a miss."""
    tick, identity = now_tick()
    guard = MemoryGuard(script=deque([None, None, *["unavailable"] * 20]))  # type: ignore[list-item]
    events = Events()
    fire = firing(guard, events)
    failing = quick_job(
        entrypoint="tests.jobs_fixture:raise_value_error_async", retries=1, retry_delay="50ms"
    )
    following = asyncio.create_task(fire.fire(Fire(failing, tick, identity)))
    await until(lambda: len(guard.calls) >= 3)  # the retry's claim meets the outage
    fire.stop()
    assert "fail" == await asyncio.wait_for(following, 5)
    assert ["claim", "record:fail", "claim"] == guard.calls[:3]
    assert {"claim"} == set(guard.calls[2:])
    assert ["fail"] == events.of("run_finished")
    assert [] == events.of("missed")


async def test_a_first_claim_in_an_outage_when_the_replica_stops_is_no_miss(
    tmp_path: Path,
) -> None:
    """The tick's window has not ended: it is the live replicas' to run or to record missed."""
    tick, identity = now_tick()
    guard = MemoryGuard(script=deque(["unavailable"] * 20))
    events = Events()
    fire = firing(guard, events)
    with structlog.testing.capture_logs() as logs:
        following = asyncio.create_task(
            fire.fire(Fire(quick_job(command=["true"]), tick, identity))
        )
        await until(lambda: len(guard.calls) >= 1)
        fire.stop()
        assert "lose" == await asyncio.wait_for(following, 5)
    assert [] == events.of("missed")
    assert [] == logged(logs, "tick_missed")
    assert {"claim"} == set(guard.calls)


async def test_a_forbid_claim_waiting_for_an_abandoned_run_claims_nothing_once_stopping(
    tmp_path: Path,
) -> None:
    """No claim at shutdown, and none beside the abandoned run (concurrency: forbid)."""
    guard = MemoryGuard(stop_grace=timedelta(milliseconds=200))
    fire = firing(guard)
    stuck = quick_job(
        entrypoint="tests.jobs_fixture:ignore_cancel", concurrency="forbid", timeout="100ms"
    )
    abandoned = request_identity()
    await until(lambda: not leftovers.still_running("j"))  # none of another test's
    try:
        with structlog.testing.capture_logs() as logs:
            assert "timeout" == await fire.fire(Fire(stuck, datetime.now(UTC), abandoned))
            tick, identity = now_tick()
            waiting = asyncio.create_task(fire.fire(Fire(stuck, tick, identity)))
            await until(lambda: bool(logged(logs, "claim_waits")))
            fire.stop()
            assert "lose" == await asyncio.wait_for(waiting, 5)
            assert leftovers.still_running("j")  # it was still running when the fire gave up
    finally:
        jobs_fixture.RELEASE[abandoned.run_key or ""].set()
        await until(lambda: not leftovers.still_running("j"))
    assert ["claim", "record:timeout"] == guard.calls
    assert [] == logged(logs, "tick_missed")


# -- pauses ----------------------------------------------------------------------------------


@pytest.mark.parametrize("ending", ["resumed", "stopped"])
@pytest.mark.usefixtures("subprocesses")
async def test_a_paused_run_once_job_waits_for_a_resume(tmp_path: Path, ending: str) -> None:
    """Not for a replica's restart: ``pgcrond resume`` (or the replica's stop) ends the wait."""
    identity = Identity.initial("j")
    paused = Refused(identity, "paused", detail="paused by ops: migration")
    guard, events = MemoryGuard(script=deque([paused])), Events()
    fire = firing(guard, events)
    ok = quick_job(command=["true"])
    with structlog.testing.capture_logs() as logs:
        waiting = asyncio.create_task(fire.fire(Fire(ok, datetime.now(UTC), identity)))
        await until(lambda: bool(logged(logs, "waiting_for_resume")))
        assert ["claim"] == guard.calls
        if ending == "resumed":
            fire.resumed()
        else:
            fire.stop()
        outcome = await asyncio.wait_for(waiting, 5)
    if ending == "resumed":
        assert "success" == outcome
        assert ["claim", "claim", "record:success"] == guard.calls
        assert [True, False] == events.of("paused")  # a run-once job ran: not paused
    else:
        assert "lose" == outcome
        assert ["claim"] == guard.calls
    assert ["paused by ops: migration"] == [e["detail"] for e in logged(logs, "waiting_for_resume")]


@pytest.mark.usefixtures("subprocesses")
async def test_a_resume_while_the_paused_answer_was_on_its_way_is_not_waited_for(
    tmp_path: Path,
) -> None:
    """A started tick's retry refused paused: the resume rang before the wait began."""
    tick, identity = now_tick(-0.5)
    paused = Refused(identity, "paused", "FAIL", attempt=1, detail="paused by ops")
    guard, events = MemoryGuard(script=deque([paused])), Events()
    fire = firing(guard, events)
    events.on["database"] = fire.resumed  # as the claim's answer arrives
    ok = quick_job(command=["true"])
    with structlog.testing.capture_logs() as logs:
        outcome = await asyncio.wait_for(fire.fire(Fire(ok, tick, identity, started=True)), 5)
    assert "success" == outcome
    assert ["claim", "claim", "record:success"] == guard.calls
    assert [] == logged(logs, "waiting_for_resume")


async def test_a_new_tick_of_a_paused_job_is_skipped(tmp_path: Path) -> None:
    """Recorded SKIPPED by the claim: nothing to wait for."""
    tick, identity = now_tick()
    paused = Refused(identity, "paused", "SKIPPED", detail="paused by ops")
    guard, events = MemoryGuard(script=deque([paused])), Events()
    with structlog.testing.capture_logs() as logs:
        outcome = await firing(guard, events).fire(
            Fire(quick_job(command=["true"]), tick, identity)
        )
    assert "skip" == outcome
    assert ["claim"] == guard.calls
    assert (["paused"], [True]) == (events.of("skipped"), events.of("paused"))
    assert ["paused by ops"] == [e["detail"] for e in logged(logs, "tick_skipped")]


async def test_a_suspended_job_is_skipped_not_waited_for(tmp_path: Path) -> None:
    """suspended: true in the YAML ends with a reload, not with `pgcrond resume`."""
    tick, identity = now_tick()
    guard, events = MemoryGuard(), Events()
    suspended = quick_job(command=["true"], suspended=True)
    with structlog.testing.capture_logs() as logs:
        outcome = await firing(guard, events).fire(Fire(suspended, tick, identity))
    assert "skip" == outcome
    assert ["paused"] == events.of("skipped")
    [skipped] = logged(logs, "tick_skipped")
    assert skipped["detail"].startswith("suspended: true in ")


# -- a calendar's day ------------------------------------------------------------------------


async def test_a_tick_on_a_calendar_day_is_recorded_skipped_once_and_never_run(
    tmp_path: Path,
) -> None:
    """Past its misfire window too: a tick that never runs is never missed.

    Two replicas fire it; the first records SKIPPED/calendar:holidays, the
    second finds that row.
    """
    tick, identity = now_tick(-2)
    guard, events = MemoryGuard(), Events()
    holiday = quick_job(command=["true"])
    with structlog.testing.capture_logs() as logs:
        first = await firing(guard, events).fire(
            Fire(holiday, tick, identity, skip_reason="calendar:holidays")
        )
        second = await firing(guard, events).fire(
            Fire(holiday, tick, identity, skip_reason="calendar:holidays")
        )
    row = guard.rows[identity]
    assert ("skip", "lose") == (first, second)
    assert ("SKIPPED", "calendar:holidays", 0) == (row.status, row.reason, row.attempt)
    assert ["calendar:holidays"] == events.of("skipped")
    assert ["done"] == events.of("claim_lost")
    assert ([], []) == (events.of("missed"), events.of("run_started"))
    assert [("calendar:holidays", True)] == [
        (e["reason"], e["recorded"]) for e in logged(logs, "tick_skipped")
    ]


async def test_a_calendar_day_under_a_guard_without_history_is_skipped_not_late(
    tmp_path: Path,
) -> None:
    """The guard says skipped (advisory: no table), however late the fire."""
    tick, identity = now_tick(-2)
    skipped = Refused(identity, "skipped", cause="calendar:freeze")
    guard, events = MemoryGuard(remembers=False, script=deque([skipped])), Events()
    with structlog.testing.capture_logs() as logs:
        outcome = await firing(guard, events).fire(
            Fire(quick_job(command=["true"]), tick, identity, skip_reason="calendar:freeze")
        )
    assert "skip" == outcome
    assert ["claim"] == guard.calls
    assert (["calendar:freeze"], []) == (events.of("skipped"), events.of("missed"))
    assert [False] == [e["recorded"] for e in logged(logs, "tick_skipped")]


async def test_a_calendar_day_tick_in_an_outage_past_its_window_is_no_miss(
    tmp_path: Path,
) -> None:
    """Left unrecorded: said skipped, never reported missed."""
    guard, events = MemoryGuard(script=deque(["unavailable"] * 50)), Events()
    tick, identity = now_tick(-0.5)
    with structlog.testing.capture_logs() as logs:
        outcome = await firing(guard, events).fire(
            Fire(quick_job(command=["true"]), tick, identity, skip_reason="calendar:h")
        )
    assert "skip" == outcome
    assert (["calendar:h"], []) == (events.of("skipped"), events.of("missed"))
    assert [("calendar:h", False)] == [
        (e["reason"], e["recorded"]) for e in logged(logs, "tick_skipped")
    ]
    assert identity not in guard.rows


# -- refusals --------------------------------------------------------------------------------


@pytest.mark.parametrize(("reason", "status"), [("done", "SUCCESS"), ("failed", "FAIL")])
async def test_a_finished_tick_is_lost_and_not_followed(
    tmp_path: Path, reason: RefusalReason, status: str
) -> None:
    tick, identity = now_tick()
    refusal = Refused(identity, reason, status, attempt=1)
    guard, events = MemoryGuard(script=deque([refusal])), Events()
    outcome = await firing(guard, events).fire(Fire(quick_job(command=["true"]), tick, identity))
    assert "lose" == outcome
    assert ["claim"] == guard.calls
    assert [reason] == events.of("claim_lost")


@pytest.mark.parametrize("reason", ["late", "coalesced"])
async def test_a_late_answer_after_this_replica_ran_the_tick_is_no_miss(
    tmp_path: Path, reason: RefusalReason
) -> None:
    """Its retry's claim answered late: the fire comes to what it ran."""
    tick, identity = now_tick()
    guard = MemoryGuard(script=deque([None, None, Refused(identity, reason)]))  # type: ignore[list-item]
    events = Events()
    failing = quick_job(
        entrypoint="tests.jobs_fixture:raise_value_error_async", retries=1, retry_delay="50ms"
    )
    outcome = await firing(guard, events).fire(Fire(failing, tick, identity))
    assert "fail" == outcome
    assert ["claim", "record:fail", "claim"] == guard.calls
    assert [] == events.of("missed")


async def test_a_run_once_job_out_of_retries_is_left_to_the_next_start(tmp_path: Path) -> None:
    """Under a guard that remembers, its row keeps a retry time, for the next start of
    any replica; another replica following it now does not take it."""
    identity = Identity.initial("j")
    guard, events = MemoryGuard(), Events()
    failing = quick_job(
        entrypoint="tests.jobs_fixture:raise_value_error_async", retries=0, retry_delay="30s"
    )
    outcome = await firing(guard, events).fire(Fire(failing, datetime.now(UTC), identity))
    assert "fail" == outcome
    row = guard.rows[identity]
    assert ("FAIL", 1) == (row.status, row.attempt)
    assert row.retry_at is not None
    assert [("fail", False)] == events.of("recorded")
    assert ["fail"] == events.of("failed_for_good")
    other = Events()
    assert "lose" == await firing(guard, other).fire(Fire(failing, datetime.now(UTC), identity))
    assert ["retry_pending"] == other.of("claim_lost")
    assert ["claim", "record:fail", "claim"] == guard.calls


# -- a run's end: lost, given back, crashed, not recorded -------------------------------------


async def test_a_run_that_lost_its_lease_records_nothing_and_follows_the_tick(
    tmp_path: Path,
) -> None:
    """Its own row lapses, and the follower takes it over: attempt 2 runs."""
    tick, identity = now_tick()
    guard, events = CancelsFirstRun(reason="lease_lost"), Events()
    ok = quick_job(entrypoint="tests.jobs_fixture:raise_value_error_async")
    outcome = await asyncio.wait_for(firing(guard, events).fire(Fire(ok, tick, identity)), 5)
    assert "fail" == outcome
    # Nothing recorded for attempt 1; claimed again until its lease lapsed.
    assert ["record:fail"] == [call for call in guard.calls if call != "claim"]
    assert "record:fail" == guard.calls[-1]
    assert ["lease_lost", "fail"] == events.of("run_finished")
    assert (2, "FAIL") == (guard.rows[identity].attempt, guard.rows[identity].status)


async def test_a_run_stopped_by_a_shutdown_is_given_back(tmp_path: Path) -> None:
    """Recorded released (claimable at once), so that a survivor takes it over."""
    tick, identity = now_tick()
    guard, events = CancelsFirstRun(reason="shutdown"), Events()
    ok = quick_job(entrypoint="tests.jobs_fixture:raise_value_error_async")
    outcome = await firing(guard, events).fire(Fire(ok, tick, identity))
    assert "cancelled" == outcome
    assert ["claim", "record:released"] == guard.calls
    row = guard.rows[identity]
    assert ("FAIL", "released") == (row.status, row.reason)
    assert [("released", True)] == events.of("recorded")
    assert [] == events.of("failed_for_good")


async def test_a_keep_alive_that_cannot_start_is_the_runs_failure(tmp_path: Path) -> None:
    """Recorded as this run's failure, never left RUNNING with nobody running it."""
    tick, identity = now_tick()
    guard, events = HoldRaises(), Events()
    with structlog.testing.capture_logs() as logs:
        outcome = await firing(guard, events).fire(
            Fire(quick_job(command=["true"]), tick, identity)
        )
    assert "fail" == outcome
    assert ["claim", "record:fail"] == guard.calls
    assert "RuntimeError: keep-alive bug" == guard.rows[identity].error
    assert ["RuntimeError: keep-alive bug"] == [e["error"] for e in logged(logs, "run_crashed")]
    assert ([], ["fail"]) == (events.of("run_started"), events.of("failed_for_good"))


@pytest.mark.usefixtures("subprocesses")
async def test_a_keep_alive_failing_after_the_run_keeps_the_runs_own_outcome(
    tmp_path: Path,
) -> None:
    tick, identity = now_tick()
    guard = LetGoRaises()
    with structlog.testing.capture_logs() as logs:
        outcome = await firing(guard).fire(Fire(quick_job(command=["true"]), tick, identity))
    assert "success" == outcome
    assert ["claim", "record:success"] == guard.calls
    assert 1 == len(logged(logs, "run_crashed"))


async def test_a_failure_hook_that_raises_does_not_end_the_fire(tmp_path: Path) -> None:
    tick, identity = now_tick()
    guard, events = MemoryGuard(), Events()

    def hook_bug() -> None:
        raise RuntimeError("hook bug")

    events.on["failed_for_good"] = hook_bug
    failing = quick_job(entrypoint="tests.jobs_fixture:raise_value_error_async")
    with structlog.testing.capture_logs() as logs:
        outcome = await firing(guard, events).fire(Fire(failing, tick, identity))
    assert "fail" == outcome
    assert "FAIL" == guard.rows[identity].status
    assert ["RuntimeError: hook bug"] == [e["error"] for e in logged(logs, "failure_hook_crashed")]


async def test_an_outcome_still_in_an_outage_when_the_fire_is_cancelled_is_said_not_recorded(
    tmp_path: Path,
) -> None:
    tick, identity = now_tick()
    guard = MemoryGuard(script=deque([None, *["unavailable"] * 50]))  # type: ignore[list-item]
    failing = quick_job(entrypoint="tests.jobs_fixture:raise_value_error_async")
    with structlog.testing.capture_logs() as logs:
        fire = asyncio.create_task(firing(guard).fire(Fire(failing, tick, identity)))
        await until(lambda: guard.calls.count("record:fail") >= 2)
        fire.cancel()
        with pytest.raises(asyncio.CancelledError):
            await asyncio.wait_for(fire, 5)
    assert "RUNNING" == guard.rows[identity].status
    [said] = logged(logs, "outcome_not_recorded")
    assert "fail" == said["outcome"]


@pytest.mark.usefixtures("subprocesses")
async def test_a_record_that_keeps_failing_is_followed_like_a_lost_lease(tmp_path: Path) -> None:
    """Unexpected errors, not an outage: after a few the row is left to lapse, and the
    replica follows the tick; here it takes its own lapsed row over and records."""
    tick, identity = now_tick()
    guard = RecordRaises(failures=3)
    with structlog.testing.capture_logs() as logs:
        outcome = await asyncio.wait_for(
            firing(guard).fire(Fire(quick_job(command=["true"]), tick, identity)), 5
        )
    assert "success" == outcome
    assert ["claim", *["record:success"] * 3, "claim", "record:success"] == guard.calls
    assert (2, "SUCCESS") == (guard.rows[identity].attempt, guard.rows[identity].status)
    assert 2 == len(logged(logs, "guard_failed"))
    [said] = logged(logs, "outcome_not_recorded")
    assert "RuntimeError: record bug" == said["error"]


async def test_a_guard_that_keeps_raising_crashes_the_fire(tmp_path: Path) -> None:
    """An error that is no outage is retried like one, a few times, then the fire ends."""
    tick, identity = now_tick()
    guard = ClaimRaises()
    fire = firing(guard)
    with structlog.testing.capture_logs() as logs:
        outcome = await fire.fire(Fire(quick_job(command=["true"]), tick, identity, started=True))
    assert "crashed" == outcome
    assert ["claim"] * 3 == guard.calls
    assert 2 == len(logged(logs, "guard_failed"))
    [crashed] = logged(logs, "fire_crashed")
    assert "RuntimeError: a batch answered a request given up on" == crashed["error"]
    assert not fire.in_flight(identity)


async def test_a_guard_error_that_is_no_outage_is_not_retried(tmp_path: Path) -> None:
    tick, identity = now_tick()
    guard = ClaimRaises(error=PgcrondError("the claim statement is wrong"))
    with structlog.testing.capture_logs() as logs:
        outcome = await firing(guard).fire(Fire(quick_job(command=["true"]), tick, identity))
    assert "crashed" == outcome
    assert ["claim"] == guard.calls
    assert [] == logged(logs, "guard_failed")
    assert ["PgcrondError: the claim statement is wrong"] == [
        e["error"] for e in logged(logs, "fire_crashed")
    ]


# -- the rest of a fire's options ---------------------------------------------------------------


async def test_on_start_is_awaited_once_before_the_first_attempt(tmp_path: Path) -> None:
    """A request's own record that its run started: once, however many attempts follow."""
    tick, identity = now_tick()
    guard, events = MemoryGuard(), Events()

    async def on_start() -> None:
        events.seen.append(("on_start", None))

    failing = quick_job(
        entrypoint="tests.jobs_fixture:raise_value_error_async",
        retries=1,
        retry_delay="50ms",
        concurrency="allow",
    )
    outcome = await firing(guard, events).fire(Fire(failing, tick, identity, on_start=on_start))
    assert "fail" == outcome
    started = [name for name, _ in events.seen if name in ("on_start", "run_started")]
    assert ["on_start", "run_started", "run_started"] == started


async def test_a_forbid_claim_waiting_for_an_abandoned_run_gives_up_at_its_window_end(
    tmp_path: Path,
) -> None:
    """Past the misfire window the claim records the miss; a job that allows overlap
    claims beside the abandoned run at once."""
    guard = MemoryGuard(stop_grace=timedelta(milliseconds=200))
    fire = firing(guard)
    entrypoint = "tests.jobs_fixture:ignore_cancel"
    stuck = quick_job(entrypoint=entrypoint, concurrency="forbid", timeout="100ms")
    allowing = quick_job(entrypoint=entrypoint, concurrency="allow")
    abandoned = request_identity()
    free = request_identity()
    jobs_fixture.RELEASE[free.run_key or ""].set()  # this run returns at once
    await until(lambda: not leftovers.still_running("j"))  # none of another test's
    try:
        with structlog.testing.capture_logs() as logs:
            assert "timeout" == await fire.fire(Fire(stuck, datetime.now(UTC), abandoned))
            assert 1 == len(logged(logs, "entrypoint_thread_abandoned"))
            tick, identity = now_tick(-0.8)  # its window ends 200 ms from now
            outcome = await asyncio.wait_for(fire.fire(Fire(stuck, tick, identity)), 5)
            assert "misfire" == outcome
            assert ["late"] == [e["cause"] for e in logged(logs, "tick_missed")]
            assert leftovers.still_running("j")  # the claim did not wait for it to end
            assert "success" == await fire.fire(Fire(allowing, datetime.now(UTC), free))
    finally:
        jobs_fixture.RELEASE[abandoned.run_key or ""].set()
        await until(lambda: not leftovers.still_running("j"))
    assert 1 == len(logged(logs, "claim_waits"))
    assert ["claim", "record:timeout", "claim", "claim", "record:success"] == guard.calls


@dataclass
class StopsWhileWon(MemoryGuard):
    """The replica is halted while a won claim waits for its tick (a claim won ahead)."""

    firing: Firing | None = None

    async def claim(self, request: ClaimRequest) -> Held | Refused:
        answer = await super().claim(request)
        assert self.firing is not None
        self.firing.halt()
        return answer


@pytest.mark.usefixtures("subprocesses")
async def test_a_claim_won_as_the_replica_is_halted_is_released_never_run(tmp_path: Path) -> None:
    guard = StopsWhileWon()
    fire = guard.firing = firing(guard)
    tick, identity = now_tick()
    with structlog.testing.capture_logs() as logs:
        outcome = await fire.fire(Fire(quick_job(command=["true"]), tick, identity))
    assert "lose" == outcome
    assert ["claim", "record:released"] == guard.calls
    assert [("stopping", 1)] == [
        (e["reason"], e["attempt"]) for e in logged(logs, "claim_released")
    ]
    assert [] == logged(logs, "run_started")


@pytest.mark.usefixtures("subprocesses")
async def test_a_won_tick_of_a_job_a_reload_removed_is_released_never_run(tmp_path: Path) -> None:
    guard = MemoryGuard()
    fire = Firing(guards=lambda _: guard, replica="unit:1", jobs=lambda _: None)
    tick, identity = now_tick()
    outcome = await fire.fire(Fire(quick_job(command=["true"]), tick, identity))
    assert "skip" == outcome
    assert ["claim", "record:released"] == guard.calls
    assert ("FAIL", "released") == (guard.rows[identity].status, guard.rows[identity].reason)


@pytest.mark.usefixtures("subprocesses")
async def test_a_won_tick_runs_the_job_as_the_config_in_force_defines_it(tmp_path: Path) -> None:
    guard = MemoryGuard()
    now = quick_job(command=["true"])
    fire = Firing(guards=lambda _: guard, replica="unit:1", jobs=lambda _: now)
    tick, identity = now_tick()
    outcome = await fire.fire(Fire(quick_job(command=["false"]), tick, identity))
    assert "success" == outcome
    assert ["claim", "record:success"] == guard.calls
