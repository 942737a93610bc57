"""A calendar's day, without a database: which tick it skips, what accounting and `plan` say.

A gap (no replica running) that spans a calendar's day leaves its ticks with
no row; the plan of the replica that comes back records each SKIPPED with
the reason ``calendar:<name>`` at once, and its ``catch_up`` policy only
ever picks a tick that runs. `pgcrond plan` says which fires a new calendar
turns into SKIPPED records.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path

from pgcrond.catchup import plan_job
from pgcrond.config.definition import definition
from pgcrond.config.loader import load_config
from pgcrond.config.models import Config, JobConfig
from pgcrond.config.plan import make_plan
from pgcrond.core.schedule import skip_reason
from pgcrond.tickplan import plan_tick

WINDOW = timedelta(days=7)


def config_of(tmp_path: Path, line: str, name: str = "jobs.yaml") -> Config:
    path = tmp_path / name
    path.write_text(
        "database: {url: 'postgresql://unused@127.0.0.1/x'}\n"
        "calendars:\n"
        "  holidays: {days: ['2026-12-25']}\n"
        f"jobs:\n  j: {line}\n"
    )
    return load_config([path])


def job(tmp_path: Path, line: str) -> JobConfig:
    return config_of(tmp_path, line).jobs["j"]


def test_a_gap_over_a_calendar_day_records_its_ticks_skipped_and_runs_the_newest_other(
    tmp_path: Path,
) -> None:
    daily = job(
        tmp_path,
        "{cron: '0 9 * * *', timezone: Europe/Berlin, skip_on: [holidays], catch_up: latest,"
        " command: ['true']}",
    )
    last = datetime(2026, 12, 23, 8, tzinfo=UTC)  # 09:00 in Berlin: its newest row
    now = datetime(2026, 12, 26, 12, tzinfo=UTC)
    planned = plan_job(daily, last, now, window=WINDOW)
    assert [
        ("2026-12-24T08:00:00Z", "missed", "no_replica"),
        ("2026-12-25T08:00:00Z", "skipped", "calendar:holidays"),
        ("2026-12-26T08:00:00Z", "run", None),
    ] == [(p.run_key, p.action, p.reason) for p in planned.ticks]


def test_a_calendar_day_tick_inside_its_misfire_grace_is_recorded_skipped_not_fired(
    tmp_path: Path,
) -> None:
    every = job(
        tmp_path,
        "{every: 10s, skip_on: [holidays], misfire_grace: 1m, lease: 20s, command: ['true']}",
    )
    last = datetime(2026, 12, 25, 11, 59, 30, tzinfo=UTC)
    now = datetime(2026, 12, 25, 12, 0, 5, tzinfo=UTC)
    planned = plan_job(every, last, now, window=WINDOW)
    assert {("skipped", "calendar:holidays")} == {(p.action, p.reason) for p in planned.ticks}
    assert 3 == len(planned.ticks)


def test_a_tick_s_skip_reason_names_the_calendar_holding_its_local_day(tmp_path: Path) -> None:
    berlin = job(
        tmp_path, "{cron: '30 23 * * *', timezone: Europe/Berlin, skip_on: [holidays], sql: 'x'}"
    )
    # 23:30 on the 24th in UTC is 00:30 on the 25th in Berlin: the holiday.
    assert "calendar:holidays" == skip_reason(
        berlin.schedule, datetime(2026, 12, 24, 23, 30, tzinfo=UTC)
    )
    assert skip_reason(berlin.schedule, datetime(2026, 12, 25, 23, 30, tzinfo=UTC)) is None
    plain = job(tmp_path, "{cron: '0 9 * * *', sql: 'x'}")
    assert skip_reason(plain.schedule, datetime(2026, 12, 25, 9, tzinfo=UTC)) is None


def test_plan_says_which_fires_a_new_calendar_records_skipped(tmp_path: Path) -> None:
    before = config_of(tmp_path, "{cron: '0 9 * * *', command: ['true']}", "old.yaml")
    after = config_of(
        tmp_path, "{cron: '0 9 * * *', skip_on: [holidays], command: ['true']}", "new.yaml"
    )
    running = {code: [definition(j)] for code, j in before.jobs.items()}
    found = make_plan(after, running, {}, datetime(2026, 12, 23, 12, tzinfo=UTC))
    [change] = found.jobs
    assert ["2026-12-25T09:00:00Z"] == change.fires_disappearing
    assert {"2026-12-25T09:00:00Z": "calendar:holidays"} == change.fires_skipped


def test_a_calendar_day_tick_is_fired_at_its_time_carrying_its_reason(tmp_path: Path) -> None:
    """Nothing runs: a lease job's fire of it is handed on at the tick, with no claim ahead."""
    daily = job(tmp_path, "{cron: '0 9 * * *', skip_on: [holidays], command: ['true']}")
    tick = datetime(2026, 12, 25, 9, tzinfo=UTC)
    [wave] = plan_tick([daily], tick, None, skip_reason(daily.schedule, tick))
    assert tick == wave.hand_on
    assert ["calendar:holidays"] == [fire.skip_reason for fire in wave.fires]
    # A tick that runs is handed on ahead of it, for its claim to be answered by then.
    [ahead] = plan_tick([daily], tick, None)
    assert ahead.hand_on < tick and [None] == [fire.skip_reason for fire in ahead.fires]
