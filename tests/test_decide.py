"""The decide table row by row, over answers the in-memory guard gives.

Each test asks the in-memory guard (lease semantics on a test's clock) for a
real answer, or scripts the one a database race gives, and checks the step
the table makes of it. ``scripts/test`` checks that this file alone covers
every line and branch of ``pgcrond/decide.py`` (``coverage --branch``, 100 %).
"""

from __future__ import annotations

from collections import deque
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import get_args

import pytest

from pgcrond.config.loader import load_config
from pgcrond.config.models import JobConfig
from pgcrond.core.keys import Identity
from pgcrond.core.schedule import run_key_for
from pgcrond.core.timing import LeaseTiming
from pgcrond.decide import (
    BLOCKED_RETRY_RECHECK,
    FOLLOW_MARGIN,
    ROWS,
    WAITING_RECHECK,
    Ran,
    State,
    Step,
    decide,
)
from pgcrond.guard.base import ClaimRequest, Held, RefusalReason, Refused
from pgcrond.guard.memory import MemoryGuard, Row

NOW = datetime(2026, 3, 1, 12, 0, tzinfo=UTC)
TICK = NOW
IDENTITY = Identity.schedule("j", run_key_for(TICK))


def job(tmp_path: Path, body: str = "") -> JobConfig:
    path = tmp_path / "jobs.yaml"
    path.write_text(
        "database: {url: 'postgresql://unused@127.0.0.1/x'}\n"
        "jobs:\n"
        f"  j: {{cron: '* * * * *', lease: 2s, misfire_grace: 5s, command: ['true'] {body}}}\n"
    )
    return load_config([path]).jobs["j"]


def guard(row: Row | None = None) -> MemoryGuard:
    """The in-memory guard at ``NOW``, with ``row`` as the tick's row."""
    found = MemoryGuard(clock=lambda: NOW)
    if row is not None:
        found.rows[IDENTITY] = row
    return found


async def claim(
    memory: MemoryGuard,
    *,
    identity: Identity = IDENTITY,
    tick: datetime = TICK,
    deadline: datetime | None = NOW + timedelta(seconds=1),
    superseded_at: datetime | None = None,
    suspended: str | None = None,
    skip_reason: str | None = None,
) -> Held | Refused:
    request = ClaimRequest(
        identity,
        tick,
        LeaseTiming.build(),
        deadline=deadline,
        superseded_at=superseded_at,
        suspended=suspended,
        skip_reason=skip_reason,
    )
    return await memory.claim(request)


def scripted(refused: Refused) -> MemoryGuard:
    return MemoryGuard(clock=lambda: NOW, script=deque([refused]))


# -- a won claim, a run's end, no answer -------------------------------------------------


async def test_a_won_claim_runs_with_what_the_fire_did_so_far(tmp_path: Path) -> None:
    held = await claim(guard())
    assert isinstance(held, Held)
    assert Step("run") == decide(held, State(job(tmp_path)))
    assert Step("run", "lease_lost") == decide(held, State(job(tmp_path), outcome="lease_lost"))


async def test_a_claim_won_once_the_replica_halted_is_released_unstarted(tmp_path: Path) -> None:
    held = await claim(guard())
    state = State(job(tmp_path), halted=True)
    assert Step("release", "lose", cause="stopping") == decide(held, state)


async def test_a_claim_won_for_a_job_a_reload_removed_is_released_unstarted(
    tmp_path: Path,
) -> None:
    held = await claim(guard())
    state = State(job(tmp_path), in_force=False)
    assert Step("release", "skip", cause="job_removed") == decide(held, state)


@pytest.mark.parametrize(
    ("ran", "expected"),
    [
        (Ran("fail", retry=True), Step("follow", "fail", started=True)),
        (Ran("lease_lost", retry=False), Step("follow", "lease_lost", started=True)),
        (Ran("success", retry=False), Step("done", "success")),
        (Ran("fail", retry=False), Step("done", "fail")),
    ],
)
def test_a_run_with_a_retry_or_a_lost_lease_is_followed_and_any_other_ends_the_fire(
    tmp_path: Path, ran: Ran, expected: Step
) -> None:
    assert expected == decide(ran, State(job(tmp_path)))


def test_no_answer_by_the_end_of_the_window_is_a_miss_and_at_a_stop_no_miss(
    tmp_path: Path,
) -> None:
    assert Step("miss", "misfire", cause="database_unavailable") == decide(
        None, State(job(tmp_path))
    )
    assert Step("done", "lose") == decide(None, State(job(tmp_path), stopping=True))
    assert Step("done", "success") == decide(
        None, State(job(tmp_path), outcome="success", stopping=True)
    )
    # A tick on a calendar's day never runs: no answer leaves it unrecorded, no miss.
    holiday = State(job(tmp_path), skip_reason="calendar:holidays")
    assert Step("skip", "skip", cause="calendar:holidays") == decide(None, holiday)


# -- refusals -----------------------------------------------------------------------------


async def test_a_tick_not_due_by_the_guards_clock_is_claimed_again_when_it_is(
    tmp_path: Path,
) -> None:
    refused = await claim(guard(), tick=NOW + timedelta(milliseconds=300))
    assert isinstance(refused, Refused)
    expected = Step("follow", wait=timedelta(milliseconds=300))
    assert expected == decide(refused, State(job(tmp_path)))
    # A scripted not_due without a wait: claimed again at once.
    bare = Refused(IDENTITY, "not_due")
    assert Step("follow") == decide(bare, State(job(tmp_path)))


async def test_a_late_or_coalesced_first_claim_is_a_miss_the_guard_recorded(
    tmp_path: Path,
) -> None:
    late = await claim(guard(), deadline=NOW - timedelta(seconds=1))
    coalesced = await claim(guard(), superseded_at=NOW)
    assert isinstance(late, Refused) and isinstance(coalesced, Refused)
    # The in-memory guard keeps no MISSED row: not recorded.
    assert Step("miss", "misfire", cause="late") == decide(late, State(job(tmp_path)))
    assert Step("miss", "misfire", cause="coalesced") == decide(coalesced, State(job(tmp_path)))
    stored = Refused(IDENTITY, "late", "MISSED")
    expected = Step("miss", "misfire", cause="late", recorded=True)
    assert expected == decide(stored, State(job(tmp_path)))


async def test_a_late_answer_after_this_replica_ran_the_tick_ends_with_its_outcome(
    tmp_path: Path,
) -> None:
    late = await claim(guard(), deadline=NOW - timedelta(seconds=1))
    assert Step("done", "fail") == decide(late, State(job(tmp_path), outcome="fail"))


async def test_a_paused_new_tick_is_a_skip(tmp_path: Path) -> None:
    refused = await claim(guard(), suspended="suspended: true in jobs.yaml")
    assert isinstance(refused, Refused)
    # A suspended job waits for a reload, not for `pgcrond resume`.
    suspended = job(tmp_path, ", suspended: true")
    assert Step("skip", "skip", cause="paused") == decide(refused, State(suspended))
    # A tick the database recorded SKIPPED is over.
    skipped = Refused(IDENTITY, "paused", "SKIPPED")
    assert Step("skip", "skip", cause="paused") == decide(skipped, State(job(tmp_path)))
    # `pgcrond trigger` does not wait for a resume.
    paused = Refused(IDENTITY, "paused", "FAIL")
    assert Step("skip", "skip", cause="paused") == decide(
        paused, State(job(tmp_path), follow=False)
    )


async def test_a_calendar_day_tick_is_a_skip_the_guard_recorded_however_late(
    tmp_path: Path,
) -> None:
    memory = guard()
    # Past its window and while suspended: recorded SKIPPED/calendar:<name> all the same.
    first = await claim(
        memory,
        deadline=NOW - timedelta(seconds=1),
        suspended="suspended: true in jobs.yaml",
        skip_reason="calendar:holidays",
    )
    assert isinstance(first, Refused)
    holiday = State(job(tmp_path), skip_reason="calendar:holidays")
    expected = Step("skip", "skip", cause="calendar:holidays", recorded=True)
    assert expected == decide(first, holiday)
    assert ("SKIPPED", "calendar:holidays") == (
        memory.rows[IDENTITY].status,
        memory.rows[IDENTITY].reason,
    )
    # A second replica's claim finds that row: lost, not skipped twice.
    second = await claim(memory, skip_reason="calendar:holidays")
    assert isinstance(second, Refused)
    assert Step("done", "lose", lost=True) == decide(second, holiday)
    # A guard without a table (advisory) refuses it alike, storing nothing.
    bare = Refused(IDENTITY, "skipped", cause="calendar:holidays")
    assert Step("skip", "skip", cause="calendar:holidays") == decide(bare, holiday)


async def test_a_paused_started_tick_waits_for_resume(tmp_path: Path) -> None:
    paused = Refused(IDENTITY, "paused", "RUNNING", attempt=1)
    expected = Step("resume", "lease_lost", started=True)
    assert expected == decide(paused, State(job(tmp_path), outcome="lease_lost"))


async def test_an_overlap_is_a_skip_and_a_blocked_retry_waits_for_the_newer_run(
    tmp_path: Path,
) -> None:
    forbid = job(tmp_path, ", concurrency: forbid")
    overlap = await claim(scripted(Refused(IDENTITY, "overlap", "SKIPPED")))
    assert isinstance(overlap, Refused)
    assert Step("skip", "skip", cause="overlap") == decide(overlap, State(forbid))
    blocked = await claim(scripted(Refused(IDENTITY, "overlap", "FAIL", attempt=1)))
    wait = min(forbid.timing.lease, BLOCKED_RETRY_RECHECK)
    assert Step("follow", wait=wait, started=True) == decide(blocked, State(forbid))


async def test_a_tick_its_overlap_policy_keeps_waiting_is_followed_each_second_unbounded(
    tmp_path: Path,
) -> None:
    """buffer_one, or replace while the replaced run stops: no skip, no misfire bound."""
    for policy in ("buffer_one", "replace"):
        waits = job(tmp_path, f", concurrency: {policy}")
        waiting = await claim(scripted(Refused(IDENTITY, "waiting", "FAIL", attempt=0)))
        assert isinstance(waiting, Refused)
        expected = Step("follow", wait=WAITING_RECHECK, started=True)
        assert expected == decide(waiting, State(waits))
        # A fire that ran the tick already keeps its outcome while it waits.
        assert Step("follow", "lease_lost", wait=WAITING_RECHECK, started=True) == decide(
            waiting, State(waits, outcome="lease_lost")
        )


async def test_a_tick_held_elsewhere_is_lost_once_and_followed_past_its_lease(
    tmp_path: Path,
) -> None:
    running = Row("RUNNING", 1, 7, NOW + timedelta(seconds=2))
    held = await claim(guard(row=running))
    assert isinstance(held, Refused) and "held" == held.reason
    expected = Step(
        "follow", "lose", wait=timedelta(seconds=2) + FOLLOW_MARGIN, started=True, lost=True
    )
    assert expected == decide(held, State(job(tmp_path)))
    # Lost before: no second claim_lost, the outcome stays.
    again = Step("follow", "lose", wait=timedelta(seconds=2) + FOLLOW_MARGIN, started=True)
    assert again == decide(held, State(job(tmp_path), outcome="lose"))


async def test_a_pending_retry_elsewhere_is_followed_until_it_is_due(tmp_path: Path) -> None:
    failed = Row("FAIL", 1, 7, NOW, retry_at=NOW + timedelta(seconds=1), reason="error")
    pending = await claim(guard(row=failed))
    assert isinstance(pending, Refused) and "retry_pending" == pending.reason
    expected = Step(
        "follow", "lose", wait=timedelta(seconds=1) + FOLLOW_MARGIN, started=True, lost=True
    )
    assert expected == decide(pending, State(job(tmp_path)))


async def test_a_lost_tick_is_not_followed_by_trigger(tmp_path: Path) -> None:
    running = Row("RUNNING", 1, 7, NOW + timedelta(seconds=2))
    held = await claim(guard(row=running))
    assert Step("done", "lose", lost=True) == decide(held, State(job(tmp_path), follow=False))
    # Its own retry is followed all the same.
    expected = Step("follow", "fail", wait=timedelta(seconds=2) + FOLLOW_MARGIN, started=True)
    assert expected == decide(held, State(job(tmp_path), outcome="fail", follow=False))


async def test_a_finished_or_failed_tick_ends_the_fire(tmp_path: Path) -> None:
    done = await claim(guard(row=Row("SUCCESS", 1, 7, NOW)))
    failed = await claim(guard(row=Row("FAIL", 2, 7, NOW)))
    assert isinstance(done, Refused) and isinstance(failed, Refused)
    assert ("done", "failed") == (done.reason, failed.reason)
    assert Step("done", "lose", lost=True) == decide(done, State(job(tmp_path)))
    assert Step("done", "success") == decide(failed, State(job(tmp_path), outcome="success"))


def test_a_held_tick_with_no_wait_is_not_followed(tmp_path: Path) -> None:
    """The advisory guard knows no holder's lease: a lock held elsewhere is a loss."""
    held = Refused(IDENTITY, "held")
    assert Step("done", "lose", lost=True) == decide(held, State(job(tmp_path)))


async def test_a_run_once_job_out_of_retries_is_left_to_the_next_start(tmp_path: Path) -> None:
    initial = Identity.initial("j")
    once = job(tmp_path, ", retries: 1")
    memory = MemoryGuard(clock=lambda: NOW)
    memory.rows[initial] = Row("FAIL", 2, 7, NOW, retry_at=NOW + timedelta(seconds=5))
    out = await claim(memory, identity=initial, deadline=None)
    assert isinstance(out, Refused) and "retry_pending" == out.reason
    assert Step("done", "lose", lost=True) == decide(out, State(once))
    # Retries left: followed.
    memory.rows[initial] = Row("FAIL", 1, 7, NOW, retry_at=NOW + timedelta(seconds=5))
    left = await claim(memory, identity=initial, deadline=None)
    expected = Step(
        "follow", "lose", wait=timedelta(seconds=5) + FOLLOW_MARGIN, started=True, lost=True
    )
    assert expected == decide(left, State(once))


def test_every_refusal_reason_has_a_row() -> None:
    assert set(get_args(RefusalReason)) == set(ROWS)
