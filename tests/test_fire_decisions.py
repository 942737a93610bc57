"""The fire's decisions over the in-memory guard: no database, every branch.

Runs are real (``/bin/true`` and ``/bin/false``); the guard answers as the
lease table would, or as a test scripts it.
"""

from __future__ import annotations

import asyncio
from collections import deque
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
import structlog

from pgcrond.config.loader import load_config
from pgcrond.config.models import JobConfig
from pgcrond.core.keys import Identity
from pgcrond.core.schedule import run_key_for
from pgcrond.fire import Firing
from pgcrond.guard.base import Refused
from pgcrond.guard.memory import MemoryGuard
from tests import jobs_fixture


def job(tmp_path: Path, body: str) -> JobConfig:
    path = tmp_path / "jobs.yaml"
    path.write_text(
        "database: {url: 'postgresql://unused@127.0.0.1/x'}\n"
        "jobs:\n"
        f"  j: {{cron: '* * * * *', lease: 200ms, heartbeat: 0s, misfire_grace: 1s, {body}}}\n"
    )
    return load_config([path]).jobs["j"]


def now_tick(offset: float = 0.0) -> tuple[datetime, Identity]:
    tick = datetime.now(UTC) + timedelta(seconds=offset)
    return tick, Identity.schedule("j", run_key_for(tick))


def firing(guard: MemoryGuard) -> Firing:
    return Firing(guards=lambda _: guard, replica="unit:1")


@pytest.mark.usefixtures("subprocesses")
async def test_a_won_claim_runs_and_records_success(tmp_path: Path) -> None:
    guard = MemoryGuard()
    tick, identity = now_tick()
    outcome = await firing(guard).fire(job(tmp_path, "command: ['true']"), tick, identity)
    assert "success" == outcome
    assert "SUCCESS" == guard.rows[identity].status
    assert ["claim", "record:success"] == guard.calls


@pytest.mark.usefixtures("subprocesses")
async def test_a_failure_with_retries_left_is_claimed_again_and_retried(tmp_path: Path) -> None:
    guard = MemoryGuard()
    tick, identity = now_tick()
    failing = job(tmp_path, "command: ['false'], retries: 1, retry_delay: 50ms")
    with structlog.testing.capture_logs() as logs:
        outcome = await firing(guard).fire(failing, tick, identity)
    attempts = [e["attempt"] for e in logs if e["event"] == "run_finished"]
    assert "fail" == outcome
    assert [1, 2] == attempts
    assert ("FAIL", None) == (guard.rows[identity].status, guard.rows[identity].retry_at)


@pytest.mark.usefixtures("subprocesses")
async def test_a_tick_held_elsewhere_is_taken_over_once_its_lease_lapses(tmp_path: Path) -> None:
    guard = MemoryGuard()
    tick, identity = now_tick()
    from pgcrond.guard.memory import Row

    # A dead winner's row: RUNNING, its lease lapsing 100 ms from now.
    guard.rows[identity] = Row("RUNNING", 1, 99, datetime.now(UTC) + timedelta(milliseconds=100))
    outcome = await firing(guard).fire(job(tmp_path, "command: ['true']"), tick, identity)
    assert "success" == outcome
    assert (2, "SUCCESS") == (guard.rows[identity].attempt, guard.rows[identity].status)


@pytest.mark.usefixtures("subprocesses")
async def test_a_fenced_outcome_is_not_recorded_and_the_tick_is_still_followed(
    tmp_path: Path,
) -> None:
    """Hole 12: losing its own attempt does not make a replica stop following the tick."""
    guard = MemoryGuard(script=deque([None, "fence"]))  # type: ignore[list-item]
    tick, identity = now_tick()
    with structlog.testing.capture_logs() as logs:
        outcome = await firing(guard).fire(job(tmp_path, "command: ['true']"), tick, identity)
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
    outcome = await firing(guard).fire(job(tmp_path, "command: ['true']"), tick, identity)
    assert "success" == outcome
    assert ["claim", "claim", "claim", "record:success"] == guard.calls


async def test_an_outage_longer_than_the_misfire_window_is_a_miss(tmp_path: Path) -> None:
    guard = MemoryGuard(script=deque(["unavailable"] * 50))
    tick, identity = now_tick(-0.5)
    with structlog.testing.capture_logs() as logs:
        outcome = await firing(guard).fire(job(tmp_path, "command: ['true']"), tick, identity)
    missed = [e for e in logs if e["event"] == "tick_missed"]
    assert "misfire" == outcome
    assert ["database_unavailable"] == [e["cause"] for e in missed]


async def test_a_fire_later_than_the_misfire_grace_never_claims(tmp_path: Path) -> None:
    """Under a guard without history: the replica's clock is all there is to judge by."""
    guard = MemoryGuard(remembers=False)
    tick, identity = now_tick(-2)
    outcome = await firing(guard).fire(job(tmp_path, "command: ['true']"), tick, identity)
    assert "misfire" == outcome
    assert [] == guard.calls


async def test_a_late_fire_under_a_guard_with_history_is_judged_by_its_claim(
    tmp_path: Path,
) -> None:
    """Issue 20 item 5: the guard's clock (the database's) decides, not the replica's."""
    guard = MemoryGuard()
    tick, identity = now_tick(-2)
    outcome = await firing(guard).fire(job(tmp_path, "command: ['true']"), tick, identity)
    assert "misfire" == outcome
    assert ["claim"] == guard.calls


@pytest.mark.usefixtures("subprocesses")
async def test_a_tick_not_due_by_the_guards_clock_waits_and_then_runs(tmp_path: Path) -> None:
    """Hole 13: a replica whose clock runs ahead waits for the database's."""
    guard = MemoryGuard()
    tick, identity = now_tick(0.3)
    outcome = await firing(guard).fire(job(tmp_path, "command: ['true']"), tick, identity)
    assert "success" == outcome
    assert ["claim", "claim", "record:success"] == guard.calls


@pytest.mark.parametrize("reason", ["overlap"])
async def test_an_overlap_refusal_is_a_skip(tmp_path: Path, reason: str) -> None:
    tick, identity = now_tick()
    guard = MemoryGuard(script=deque([Refused(identity, reason)]))  # type: ignore[arg-type]
    outcome = await firing(guard).fire(job(tmp_path, "command: ['true']"), tick, identity)
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
    forbid = job(tmp_path, "command: ['true'], concurrency: forbid")
    outcome = await firing(guard).fire(forbid, tick, identity, started=True)
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
            job(tmp_path, "command: ['true']"), tick, identity, superseded_at=tick
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
        job(tmp_path, "command: ['true']"), tick, identity, superseded_at=tick
    )
    assert "misfire" == outcome
    assert [] == guard.calls


@pytest.mark.usefixtures("subprocesses")
async def test_a_retry_is_never_coalesced(tmp_path: Path) -> None:
    """Coalescing bounds a tick's first start only, like misfire_grace."""
    guard = MemoryGuard()
    tick, identity = now_tick(-0.5)
    # The retry waits at least 400 ms (half of retry_delay): past superseded_at.
    failing = job(tmp_path, "command: ['false'], retries: 1, retry_delay: 800ms")
    superseded = datetime.now(UTC) + timedelta(milliseconds=300)
    with structlog.testing.capture_logs() as logs:
        outcome = await firing(guard).fire(failing, tick, identity, superseded_at=superseded)
    assert "fail" == outcome
    assert [1, 2] == [e["attempt"] for e in logs if e["event"] == "run_finished"]


async def test_a_late_answer_is_a_miss_not_a_run(tmp_path: Path) -> None:
    tick, identity = now_tick()
    guard = MemoryGuard(script=deque([Refused(identity, "late")]))
    outcome = await firing(guard).fire(job(tmp_path, "command: ['true']"), tick, identity)
    assert "misfire" == outcome


@pytest.mark.usefixtures("subprocesses")
async def test_a_pending_retry_is_followed_past_the_misfire_window(tmp_path: Path) -> None:
    """Hole 7: a retry scheduled by another replica is taken by whoever follows the tick."""
    tick, identity = now_tick(-0.5)
    pending = Refused(
        identity, "retry_pending", "FAIL", wait=timedelta(seconds=0.7), attempt=1, cause="error"
    )
    guard = MemoryGuard(script=deque([pending]))
    outcome = await firing(guard).fire(job(tmp_path, "command: ['true']"), tick, identity)
    assert "success" == outcome
    assert ["claim", "claim", "record:success"] == guard.calls


async def test_a_lost_tick_is_not_followed_by_trigger(tmp_path: Path) -> None:
    tick, identity = now_tick()
    held = Refused(identity, "held", "RUNNING", wait=timedelta(seconds=0.1), attempt=1)
    guard = MemoryGuard(script=deque([held]))
    outcome = await firing(guard).fire(
        job(tmp_path, "command: ['true']"), tick, identity, follow=False
    )
    assert "lose" == outcome
    assert ["claim"] == guard.calls


@pytest.mark.usefixtures("subprocesses")
async def test_a_started_tick_is_taken_over_past_the_misfire_window(tmp_path: Path) -> None:
    """misfire_grace bounds a first start: a tick some replica started is followed to its end."""
    tick, identity = now_tick(-0.5)
    held = Refused(identity, "held", "RUNNING", wait=timedelta(seconds=0.7), attempt=1)
    guard = MemoryGuard(script=deque([held]))
    outcome = await firing(guard).fire(job(tmp_path, "command: ['true']"), tick, identity)
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
            assert "timeout" == await firing(guard).fire(stuck, first_tick, first)
            assert any(e["event"] == "entrypoint_thread_abandoned" for e in logs)
            following = asyncio.create_task(firing(guard).fire(stuck, second_tick, second))
            await asyncio.sleep(0.3)
            # The abandoned thread still runs: no claim of the next tick yet.
            assert ["claim", "record:timeout"] == guard.calls
            jobs_fixture.RELEASE[first.run_key or ""].set()
            assert "success" == await asyncio.wait_for(following, 5)
    finally:
        jobs_fixture.RELEASE[first.run_key or ""].set()
    assert ["claim", "record:timeout", "claim", "record:success"] == guard.calls
    assert 1 == sum(e["event"] == "claim_waits" for e in logs)
