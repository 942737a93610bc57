"""An unexpected error in one fire, and a fire that finds its job paused.

Over the in-memory guard (``pgcrond/guard/memory.py``) with real runs: a guard
double raises an error that is not a :class:`~pgcrond.errors.PgcrondError`
(a bug, like the batch's ``InvalidStateError``) at each point of a won fire,
and the run is recorded as failed, or the call retried, never left RUNNING.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections import deque
from collections.abc import AsyncIterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
import structlog

from pgcrond.config.models import JobConfig
from pgcrond.core.keys import Identity
from pgcrond.core.schedule import run_key_for
from pgcrond.events import FireEvents
from pgcrond.fire import Fire, Firing
from pgcrond.guard.base import ClaimRequest, Held, Recorded, Refused, Verdict
from pgcrond.guard.memory import MemoryGuard, Row
from tests.helpers.fire import quick_job

# Runs commands: the integration tier.
pytestmark = pytest.mark.usefixtures("subprocesses")


def now_tick() -> tuple[datetime, Identity]:
    tick = datetime.now(UTC)
    return tick, Identity.schedule("j", run_key_for(tick))


@dataclass
class Breaking(MemoryGuard):
    """A guard whose named operation raises an unexpected error ``times`` times."""

    breaks: str = ""
    times: int = 1

    def _break(self, operation: str) -> None:
        if operation == self.breaks and self.times > 0:
            self.times -= 1
            raise asyncio.InvalidStateError(f"invalid state (injected into {operation})")

    async def claim(self, request: ClaimRequest) -> Held | Refused:
        self._break("claim")
        return await super().claim(request)

    def hold(self, held: Held) -> contextlib.AbstractAsyncContextManager[Held]:
        return self._breaking_hold(held)

    @contextlib.asynccontextmanager
    async def _breaking_hold(self, held: Held) -> AsyncIterator[Held]:
        self._break("hold")
        yield held

    async def record(self, held: Held, verdict: Verdict) -> Recorded:
        self._break("record")
        return await super().record(held, verdict)


async def test_an_unexpected_error_after_a_win_is_recorded_as_that_runs_failure(
    tmp_path: Path,
) -> None:
    guard = Breaking(breaks="hold")
    tick, identity = now_tick()
    firing = Firing(guards=lambda _: guard, replica="unit:1")
    with structlog.testing.capture_logs() as logs:
        outcome = await firing.fire(Fire(quick_job(command=["true"]), tick, identity))
    row = guard.rows[identity]
    crashed = [e for e in logs if e["event"] == "run_crashed"]
    assert "fail" == outcome
    assert ("FAIL", "error") == (row.status, row.reason)
    assert row.error is not None and "InvalidStateError" in row.error, row.error
    assert 1 == len(crashed) and "injected into hold" in crashed[0]["error"], crashed
    assert {} == firing.running


async def test_an_unexpected_error_from_a_finalize_is_retried_until_the_outcome_lands(
    tmp_path: Path,
) -> None:
    guard = Breaking(breaks="record", times=2)
    tick, identity = now_tick()
    firing = Firing(guards=lambda _: guard, replica="unit:1")
    with structlog.testing.capture_logs() as logs:
        outcome = await firing.fire(Fire(quick_job(command=["true"]), tick, identity))
    assert "success" == outcome
    assert "SUCCESS" == guard.rows[identity].status
    failed = [e["operation"] for e in logs if e["event"] == "guard_failed"]
    assert ["finalize", "finalize"] == failed


async def test_an_unexpected_error_from_a_claim_is_retried_not_a_crashed_fire(
    tmp_path: Path,
) -> None:
    """The claim may have won before its answer was lost: claimed again, with the same token."""
    guard = Breaking(breaks="claim")
    tick, identity = now_tick()
    firing = Firing(guards=lambda _: guard, replica="unit:1")
    outcome = await firing.fire(Fire(quick_job(command=["true"]), tick, identity))
    assert "success" == outcome
    assert ["claim", "record:success"] == guard.calls  # the broken call never reached it


async def test_a_guard_that_keeps_failing_ends_the_fire_as_crashed_and_says_so(
    tmp_path: Path,
) -> None:
    guard = Breaking(breaks="claim", times=100)
    tick, identity = now_tick()
    firing = Firing(guards=lambda _: guard, replica="unit:1")
    with structlog.testing.capture_logs() as logs:
        outcome = await firing.fire(Fire(quick_job(command=["true"]), tick, identity))
    crashed = [e for e in logs if e["event"] == "fire_crashed"]
    assert "crashed" == outcome
    assert 1 == len(crashed) and "InvalidStateError" in crashed[0]["error"], crashed


async def test_a_failing_on_failure_hook_does_not_crash_the_recorded_fire(tmp_path: Path) -> None:
    guard = MemoryGuard()
    tick, identity = now_tick()

    class Hook(FireEvents):
        def failed_for_good(self, *_: object) -> None:
            raise KeyError("hook bug")

    firing = Firing(guards=lambda _: guard, replica="unit:1", events=Hook())
    with structlog.testing.capture_logs() as logs:
        outcome = await firing.fire(Fire(quick_job(command=["false"]), tick, identity))
    assert "fail" == outcome
    assert "FAIL" == guard.rows[identity].status
    assert any(e["event"] == "failure_hook_crashed" for e in logs), logs


# -- a pause does not drop a started tick -----------------------------------------------


async def test_a_follower_that_finds_the_job_paused_waits_for_resume_then_takes_over(
    tmp_path: Path,
) -> None:
    tick, identity = now_tick()
    # A dead owner's row, lapsed: its takeover is refused while paused.
    guard = MemoryGuard()
    guard.rows[identity] = Row("RUNNING", 1, 99, datetime.now(UTC) - timedelta(seconds=1))
    guard.script.append(Refused(identity, "paused", "RUNNING", attempt=1))
    firing = Firing(guards=lambda _: guard, replica="unit:1")
    with structlog.testing.capture_logs() as logs:
        fire = asyncio.create_task(firing.fire(Fire(quick_job(command=["true"]), tick, identity)))
        while not any(e["event"] == "waiting_for_resume" for e in logs):
            assert not fire.done(), f"the follower stopped following: {fire.result()}"
            await asyncio.sleep(0.01)
        firing.resumed()
        outcome = await asyncio.wait_for(fire, 5)
    assert "success" == outcome
    assert (2, "SUCCESS") == (guard.rows[identity].attempt, guard.rows[identity].status)


async def test_a_run_once_job_refused_paused_runs_on_resume(tmp_path: Path) -> None:
    identity = Identity.initial("seed")
    guard = MemoryGuard(script=deque([Refused(identity, "paused", detail="paused by ops")]))
    firing = Firing(guards=lambda _: guard, replica="unit:1")
    seed = quick_job("seed", command=["true"])
    with structlog.testing.capture_logs() as logs:
        fire = asyncio.create_task(firing.fire(Fire(seed, datetime.now(UTC), identity)))
        while not any(e["event"] == "waiting_for_resume" for e in logs):
            assert not fire.done(), f"the run-once job was dropped: {fire.result()}"
            await asyncio.sleep(0.01)
        firing.resumed()
        outcome = await asyncio.wait_for(fire, 5)
    assert "success" == outcome
    assert "SUCCESS" == guard.rows[identity].status


async def test_a_fire_waiting_for_resume_ends_at_shutdown(tmp_path: Path) -> None:
    identity = Identity.initial("seed")
    guard = MemoryGuard(script=deque([Refused(identity, "paused", detail="paused by ops")]))
    firing = Firing(guards=lambda _: guard, replica="unit:1")
    seed = quick_job("seed", command=["true"])
    with structlog.testing.capture_logs() as logs:
        fire = asyncio.create_task(firing.fire(Fire(seed, datetime.now(UTC), identity)))
        while not any(e["event"] == "waiting_for_resume" for e in logs):
            assert not fire.done()
            await asyncio.sleep(0.01)
        firing.stop()
        outcome = await asyncio.wait_for(fire, 2)
    assert "lose" == outcome  # not run here; the next start tries it again
    assert identity not in guard.rows


async def test_a_new_tick_of_a_paused_job_is_a_skip_not_a_wait(tmp_path: Path) -> None:
    tick, identity = now_tick()
    guard = MemoryGuard(script=deque([Refused(identity, "paused", "SKIPPED", detail="by ops")]))
    firing = Firing(guards=lambda _: guard, replica="unit:1")
    outcome = await asyncio.wait_for(
        firing.fire(Fire(quick_job(command=["true"]), tick, identity)), 2
    )
    assert "skip" == outcome


async def test_a_finalize_that_keeps_failing_is_followed_and_taken_over_not_left_open(
    tmp_path: Path,
) -> None:
    guard = Breaking(breaks="record", times=3)
    tick, identity = now_tick()
    firing = Firing(guards=lambda _: guard, replica="unit:1")
    with structlog.testing.capture_logs() as logs:
        outcome = await firing.fire(Fire(quick_job(command=["true"]), tick, identity))
    assert "success" == outcome
    # The first attempt's row lapsed (lease 200ms) and was taken over here.
    assert (2, "SUCCESS") == (guard.rows[identity].attempt, guard.rows[identity].status)
    assert any(e["event"] == "outcome_not_recorded" for e in logs)


async def test_a_resume_that_arrives_while_the_claim_is_on_its_way_is_not_missed(
    tmp_path: Path,
) -> None:
    identity = Identity.initial("seed")
    firing: Firing

    @dataclass
    class ResumedMeanwhile(MemoryGuard):
        async def claim(self, request: ClaimRequest) -> Held | Refused:
            if not self.calls:
                firing.resumed()  # the NOTIFY came before this claim's answer
            return await super().claim(request)

    guard = ResumedMeanwhile(script=deque([Refused(identity, "paused", detail="by ops")]))
    firing = Firing(guards=lambda _: guard, replica="unit:1")
    seed = quick_job("seed", command=["true"])
    outcome = await asyncio.wait_for(firing.fire(Fire(seed, datetime.now(UTC), identity)), 5)
    assert "success" == outcome


async def test_followers_asleep_on_the_grid_end_at_shutdown(tmp_path: Path) -> None:
    """A follower asleep is a future on its grid slot, not a task: stop() rings every slot."""
    one = quick_job("followed", command=["true"])
    tick = datetime.now(UTC)
    identities = [Identity.schedule("followed", f"2026-01-01T00:00:{n:02d}Z") for n in range(50)]
    # Another replica holds every tick for a minute yet: each is followed, asleep.
    held: deque[str | Refused] = deque(
        Refused(i, "held", "RUNNING", wait=timedelta(minutes=1)) for i in identities
    )
    guard = MemoryGuard(script=held)
    all_lost = asyncio.Event()

    class Lost(FireEvents):
        count = 0

        def claim_lost(self, job: JobConfig, reason: str) -> None:
            # Said just before the fire goes to sleep on the grid, in the same step.
            self.count += 1
            if self.count == len(identities):
                all_lost.set()

    firing = Firing(guards=lambda _: guard, replica="unit:1", events=Lost())
    fires = [asyncio.create_task(firing.fire(Fire(one, tick, i))) for i in identities]
    await asyncio.wait_for(all_lost.wait(), 5)
    assert not any(fire.done() for fire in fires)
    firing.stop()
    outcomes = await asyncio.wait_for(asyncio.gather(*fires), 2)
    assert {"lose"} == set(outcomes)
