"""An ``at:`` job with no row yet: its instant, if it came while the replica started, is due.

Fresh-clone CI run 55: an ``at:`` job whose one instant passed while the
only replica was starting (its interpreter still importing) was never run:
the plan had nothing for a job without a record, and the scheduler, started
after the instant, had no tick left to fire.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path

from pgcrond.catchup import plan_job
from pgcrond.config.loader import load_config
from pgcrond.config.models import JobConfig

NOW = datetime(2026, 12, 3, 8, 13, 40, tzinfo=UTC)
STARTED = NOW - timedelta(seconds=10)
WINDOW = timedelta(days=1)


def job(tmp_path: Path, line: str) -> JobConfig:
    path = tmp_path / "jobs.yaml"
    path.write_text(f"database: {{url: 'postgresql://unused@127.0.0.1/x'}}\njobs:\n  j: {line}\n")
    return load_config([path]).jobs["j"]


def test_an_at_job_whose_instant_passed_while_the_replica_started_is_due(tmp_path: Path) -> None:
    at = job(tmp_path, "{at: '2026-12-03T08:13:33Z', sql: 'SELECT 1'}")
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


def test_a_new_cron_jobs_record_starts_with_its_first_scheduled_fire(tmp_path: Path) -> None:
    every = job(tmp_path, "{cron: '* * * * * *', misfire_grace: 3s, lease: 1s, command: ['true']}")
    assert () == plan_job(every, None, NOW, window=WINDOW, started=STARTED).ticks
