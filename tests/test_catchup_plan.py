"""An ``at:`` job with no row yet: its instant, if it came while the replica started, is due.

Fresh-clone CI run 55: an ``at:`` job whose one instant passed while the
only replica was starting (its interpreter still importing) was never run:
the plan had nothing for a job without a record, and the scheduler, started
after the instant, had no tick left to fire.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from pgcrond.catchup import plan_job
from pgcrond.testing import job

NOW = datetime(2026, 12, 3, 8, 13, 40, tzinfo=UTC)
STARTED = NOW - timedelta(seconds=10)
WINDOW = timedelta(days=1)


def test_an_at_job_whose_instant_passed_while_the_replica_started_is_due() -> None:
    at = job("j", at="2026-12-03T08:13:33Z", sql="SELECT 1")
    planned = plan_job(at, None, NOW, window=WINDOW, started=STARTED)
    assert [(NOW - timedelta(seconds=7), "due")] == [(p.tick, p.action) for p in planned.ticks]
    # Past its grace (5 min by default): not run, and nothing recorded MISSED
    # either: the job has no record to continue.
    late = NOW + timedelta(minutes=6)
    assert () == plan_job(at, None, late, window=WINDOW, started=STARTED).ticks
    # Before the replica started: no replica was there, nothing is owed.
    assert () == plan_job(at, None, NOW, window=WINDOW, started=NOW - timedelta(seconds=5)).ticks
    # Without a start (the `catch-up` command): nothing, as before.
    assert () == plan_job(at, None, NOW, window=WINDOW).ticks


def test_a_new_cron_jobs_record_starts_with_its_first_scheduled_fire() -> None:
    every = job("j", cron="* * * * * *", misfire_grace="3s", lease="1s", command=["true"])
    assert () == plan_job(every, None, NOW, window=WINDOW, started=STARTED).ticks
