"""The schedule forms as a config writes them: cron lists, every, between, skip_on, calendars, dst.

Each form is read from YAML, refused with its file, line and field when
wrong, survives the registry's round trip (a replica's definition rebuilt by
`pgcrond plan`), and shows in `next`, `plan` and `calendars`.
"""

from __future__ import annotations

import json
from datetime import UTC, date, datetime, timedelta
from pathlib import Path
from zoneinfo import ZoneInfo

import pytest

from pgcrond.cli import main
from pgcrond.config.definition import definition
from pgcrond.config.loader import load_config
from pgcrond.config.models import Config
from pgcrond.config.plan import make_plan
from pgcrond.core.schedule import (
    AnyOf,
    Between,
    CronSchedule,
    Dst,
    EverySchedule,
    Skipping,
    from_definition,
    run_key_for,
)
from pgcrond.errors import ConfigError

HEAD = 'database: {url: "postgresql://u@127.0.0.1/x"}\n'
BERLIN = ZoneInfo("Europe/Berlin")


def load(tmp_path: Path, text: str, name: str = "jobs.yaml") -> Config:
    path = tmp_path / name
    path.write_text(HEAD + text)
    return load_config([path])


def problems(tmp_path: Path, text: str) -> list[tuple[int | None, str | None, str]]:
    path = tmp_path / "bad.yaml"
    path.write_text(HEAD + text)
    with pytest.raises(ConfigError) as caught:
        load_config([path])
    return [(i.line, i.field, i.message) for i in caught.value.issues]


def ticks(config: Config, code: str, start: datetime, count: int) -> list[str]:
    schedule, t = config.jobs[code].schedule, start
    found: list[str] = []
    while len(found) < count and (tick := schedule.next_after(t)) is not None:
        found.append(run_key_for(tick))
        t = tick
    return found


def test_a_cron_list_runs_a_tick_due_under_two_expressions_once(tmp_path: Path) -> None:
    config = load(
        tmp_path,
        "jobs:\n  j:\n    cron: ['0 * * * *', '*/30 * * * *']\n    command: ['true']\n",
    )
    start = datetime(2026, 1, 1, tzinfo=UTC)
    assert ticks(config, "j", start, 3) == [
        "2026-01-01T00:30:00Z",
        "2026-01-01T01:00:00Z",
        "2026-01-01T01:30:00Z",
    ]
    occasion = config.jobs["j"].schedule.occasion_after(start + timedelta(minutes=30))
    assert occasion is not None
    assert occasion.form == "cron '0 * * * *' and cron '*/30 * * * *'"


def test_a_wrong_entry_of_a_cron_list_is_blamed_at_its_own_line(tmp_path: Path) -> None:
    text = (
        "jobs:\n"
        "  j:\n"
        "    cron:\n"
        "      - '0 18 LW * *'\n"
        "      - '0 9 * * fri#6'\n"
        "      - '0 9 15W * mon'\n"
        "    command: ['true']\n"
    )
    assert problems(tmp_path, text) == [
        (
            6,
            "cron",
            "entry 1: day-of-week: 'fri#6': the number after '#' is 1-5, the n-th of that "
            "weekday in the month ('fri#2' is the second Friday; a month has at most five "
            "of a weekday)",
        )
    ]


@pytest.mark.parametrize(
    ("expression", "explained"),
    [
        ("0 0 * * L", "day-of-week: 'L' needs a weekday before it"),
        ("0 0 5L * *", "the last Friday of the month is '5L' in day-of-week"),
        ("0 0 W * *", "day-of-month: 'W' needs a day before it"),
        ("0 0 * * 1W", "'W' (the weekday nearest a day) belongs in day-of-month"),
        ("0 0 1#2 * *", "'#' (the n-th weekday of the month) belongs in day-of-week"),
        ("0 0 L-2 * *", "'L' cannot take a range or a step"),
        ("0 ? * * *", "hour: '?' (no specific value) is only for day-of-month or day-of-week"),
        ("L 0 * * *", "minute: 'L': 'L' and 'W' are only for day-of-month and day-of-week"),
        ("0 0 1-5W * *", "'W' takes one day before it"),
        ("0 0 ?,1 * *", "'?' stands alone"),
    ],
)
def test_check_explains_a_wrong_quartz_item(
    tmp_path: Path, expression: str, explained: str
) -> None:
    [(line, field, message)] = problems(
        tmp_path, f"jobs:\n  j:\n    cron: '{expression}'\n    command: ['true']\n"
    )
    assert (line, field) == (4, "cron")
    assert explained in message


def test_every_ticks_at_the_epoch_plus_k_intervals_plus_the_phase(tmp_path: Path) -> None:
    config = load(tmp_path, "jobs:\n  j:\n    every: 36h\n    phase: 1h\n    command: ['true']\n")
    assert config.jobs["j"].schedule == EverySchedule(36 * 3600, 3600)
    # 2026-01-01T00:00Z is 13,636 × 36 h after the epoch: its ticks are an hour later.
    assert ticks(config, "j", datetime(2026, 1, 1, tzinfo=UTC), 2) == [
        "2026-01-01T01:00:00Z",
        "2026-01-02T13:00:00Z",
    ]


@pytest.mark.parametrize(
    ("fields", "expected"),
    [
        ("every: 1500ms", (4, "every", "every must be whole seconds")),
        ("every: 0s", (4, "every", "must be 1s or more")),
        ("every: 10s\n    phase: 10s", (5, "phase", "must be shorter than every (10s)")),
        ("every: 10s\n    phase: 500ms", (5, "phase", "phase must be whole seconds")),
        ("cron: '* * * * *'\n    phase: 5s", (5, "phase", "only with every:")),
        ("every: 10s\n    dst: {skipped: skip}", (5, "dst", "only with cron:")),
        ("at: 2030-01-01T00:00:00Z\n    between: {end: 2031-01-01}", (5, "between", "no use")),
        ("once: true\n    skip_on: [x]", (5, "skip_on", "no use with once:")),
        ("every: 10s\n    between: {}", (5, "between", "names neither start nor end")),
        ("every: 10s\n    between: {start: 2027-01-02, end: 2027-01-01}", (5, "between", "end")),
        ("every: 10s\n    between: {begin: 2027-01-02}", (5, "between", "unknown key 'begin'")),
        ("cron: '* * * * *'\n    dst: {repeated: twice}", (5, "dst", "'twice' is not one of")),
    ],
)
def test_each_wrong_form_is_named_at_its_line(
    tmp_path: Path, fields: str, expected: tuple[int, str, str]
) -> None:
    [(line, field, message)] = problems(
        tmp_path, f"jobs:\n  j:\n    {fields}\n    command: ['true']\n"
    )
    assert (line, field) == expected[:2]
    assert expected[2] in message


def test_between_reads_dates_as_local_days_and_names_the_window(tmp_path: Path) -> None:
    config = load(
        tmp_path,
        "jobs:\n  j:\n    cron: '0 12 * * *'\n    timezone: Europe/Berlin\n"
        "    between: {start: 2026-06-01, end: 2026-06-02}\n    command: ['true']\n",
    )
    schedule = config.jobs["j"].schedule
    assert isinstance(schedule, Between)
    # From midnight of June 1st through the end of June 2nd, Berlin time.
    assert (schedule.start, schedule.end) == (
        datetime(2026, 5, 31, 22, tzinfo=UTC),
        datetime(2026, 6, 2, 22, tzinfo=UTC),
    )
    assert ticks(config, "j", datetime(2026, 1, 1, tzinfo=UTC), 5) == [
        "2026-06-01T10:00:00Z",
        "2026-06-02T10:00:00Z",
    ]


CALENDARS = """\
calendars:
  holidays:
    days: [2026-12-24, "2026-12-31..2027-01-01"]
    yearly: [12-25]
    include: shared.yaml
defaults:
  timezone: Europe/Berlin
  skip_on: [holidays]
jobs:
  daily:
    cron: '0 9 * * *'
    command: ['true']
"""


def test_a_calendar_gathers_dates_ranges_yearly_dates_and_an_included_file(
    tmp_path: Path,
) -> None:
    (tmp_path / "shared.yaml").write_text("days: [2026-12-28]\nyearly: [01-06]\n")
    config = load(tmp_path, CALENDARS)
    schedule = config.jobs["daily"].schedule
    assert isinstance(schedule, Skipping)
    days = [d.day for d in config.calendars["holidays"].days(date(2026, 12, 20), date(2027, 1, 10))]
    assert days == [24, 25, 28, 31, 1, 6]
    runs = ticks(config, "daily", datetime(2026, 12, 23, tzinfo=UTC), 4)
    assert runs == [
        "2026-12-23T08:00:00Z",
        "2026-12-26T08:00:00Z",
        "2026-12-27T08:00:00Z",
        "2026-12-29T08:00:00Z",
    ]


def test_a_wrong_day_and_an_unknown_calendar_are_each_named(tmp_path: Path) -> None:
    text = (
        "calendars:\n"
        "  holidays:\n"
        "    days:\n"
        "      - 2026-12-24\n"
        "      - 2026-13-01\n"
        "    yearly: [02-30]\n"
        "    include: nowhere.yaml\n"
        "jobs:\n"
        "  j:\n"
        "    cron: '0 9 * * *'\n"
        "    skip_on: [holiday]\n"
        "    command: ['true']\n"
    )
    found = problems(tmp_path, text)
    assert [(line, field) for line, field, _ in found] == [
        (6, "calendars.holidays.days"),
        (7, "calendars.holidays.yearly"),
        (8, "calendars.holidays.include"),
        (12, "skip_on"),
    ]
    assert "'2026-13-01' is not a date" in found[0][2]
    assert "'02-30' is no day of the year" in found[1][2]
    assert "cannot read" in found[2][2]
    assert "no calendar 'holiday'; did you mean 'holidays'?" == found[3][2]


def test_every_form_survives_the_registrys_round_trip(tmp_path: Path) -> None:
    """What a replica registers, `plan` rebuilds into the same schedule."""
    (tmp_path / "shared.yaml").write_text("days: [2026-12-28]\n")
    config = load(
        tmp_path,
        CALENDARS + "  listed:\n    cron: ['0 18 LW * *', '0 9 * * fri#2']\n"
        "    dst: {skipped: skip, repeated: both}\n    command: ['true']\n"
        "  interval:\n    every: 90s\n    phase: 15s\n"
        "    between: {start: 2026-06-01, end: 2027-01-01T00:00:00Z}\n    command: ['true']\n",
    )
    for job in config.jobs.values():
        plain = json.loads(json.dumps(definition(job)))
        rebuilt = from_definition(plain["schedule"], job.timezone)
        assert rebuilt == job.schedule, job.code
        assert repr(rebuilt) == repr(job.schedule)


def test_a_plain_crons_definition_is_as_before_the_new_forms(tmp_path: Path) -> None:
    """A replica that registered a plain cron, and one that runs this code, agree on it:
    `plan` and the drift check see no change where the config has none."""
    config = load(tmp_path, "jobs:\n  j:\n    cron: '0 9 * * *'\n    command: ['true']\n")
    assert {"cron": "0 9 * * *"} == definition(config.jobs["j"])["schedule"]


def test_distinct_schedules_have_distinct_reprs() -> None:
    """The daemon keeps one timer per repr: two schedules that differ may not share one."""
    cron = CronSchedule.parse("0 2 * * *", BERLIN)
    both = CronSchedule.parse("0 2 * * *", BERLIN, Dst(repeated="both"))
    reprs = {
        repr(s)
        for s in [
            cron,
            both,
            AnyOf((cron, CronSchedule.parse("0 3 * * *", BERLIN))),
            EverySchedule(90),
            EverySchedule(90, 15),
            Between(cron, datetime(2026, 1, 1, tzinfo=UTC)),
            Between(cron, datetime(2026, 1, 2, tzinfo=UTC)),
        ]
    }
    assert len(reprs) == 7


def test_plan_shows_the_fires_a_change_adds_and_removes(tmp_path: Path) -> None:
    old = load(tmp_path, "jobs:\n  j:\n    cron: '0 9 * * *'\n    command: ['true']\n", "old.yaml")
    new = load(
        tmp_path,
        "jobs:\n  j:\n    cron: ['0 9 * * mon-fri', '0 10 * * sat,sun']\n    command: ['true']\n",
        "new.yaml",
    )
    now = datetime(2026, 1, 1, tzinfo=UTC)  # a Thursday
    plan = make_plan(new, {"j": [definition(old.jobs["j"])]}, {}, now)
    [job] = plan.jobs
    assert job.fires_appearing == ["2026-01-03T10:00:00Z", "2026-01-04T10:00:00Z"]
    assert job.fires_disappearing == ["2026-01-03T09:00:00Z", "2026-01-04T09:00:00Z"]
    assert job.fire_forms == [
        "cron '0 9 * * mon-fri'",
        "cron '0 9 * * mon-fri'",
        "cron '0 10 * * sat,sun'",
        "cron '0 10 * * sat,sun'",
        "cron '0 9 * * mon-fri'",
    ]


def test_next_marks_the_skipped_days_and_the_clock_changes(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "shared.yaml").write_text("days: []\n")
    path = tmp_path / "jobs.yaml"
    path.write_text(
        HEAD
        + CALENDARS
        + "  twice:\n    cron: '30 2 * * *'\n    dst: {repeated: both}\n    skip_on: []\n"
        "    command: ['true']\n"
    )
    assert 0 == main(["next", "-c", str(path), "-n", "2", "--from", "2026-12-23T12:00:00Z"])
    assert capsys.readouterr().out.splitlines()[:4] == [
        "daily: cron '0 9 * * *': at 09:00 every day (Europe/Berlin), not on holidays days",
        "  2026-12-24T08:00:00Z  2026-12-24 09:00:00 CET (+0100)"
        "  SKIPPED calendar:holidays (and the rest of that day)",
        "  2026-12-25T08:00:00Z  2026-12-25 09:00:00 CET (+0100)"
        "  SKIPPED calendar:holidays (and the rest of that day)",
        "  2026-12-26T08:00:00Z  2026-12-26 09:00:00 CET (+0100)",
    ]
    assert 0 == main(
        ["next", "-c", str(path), "--job", "twice", "-n", "2", "--from", "2026-10-25T00:00:00Z"]
    )
    assert capsys.readouterr().out.splitlines()[1:] == [
        "  2026-10-25T00:30:00Z  2026-10-25 02:30:00 CEST (+0200)"
        "  02:30 repeated by the clock change, its first occurrence (dst repeated: both)",
        "  2026-10-25T01:30:00Z  2026-10-25 02:30:00 CET (+0100)"
        "  02:30 repeated by the clock change, its second occurrence (dst repeated: both)",
    ]


def test_next_says_when_a_window_opens_and_that_it_closed(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "jobs.yaml"
    path.write_text(
        HEAD + "jobs:\n  j:\n    every: 1h\n"
        "    between: {start: 2026-06-01T00:00:00Z, end: 2026-06-01T02:00:00Z}\n"
        "    command: ['true']\n"
    )
    assert 0 == main(["next", "-c", str(path), "-n", "3", "--from", "2026-05-01T00:00:00Z"])
    assert capsys.readouterr().out.splitlines()[1:] == [
        "  the window opens at 2026-06-01T00:00:00Z",
        "  2026-06-01T00:00:00Z  2026-06-01 00:00:00 UTC (+0000)",
        "  2026-06-01T01:00:00Z  2026-06-01 01:00:00 UTC (+0000)",
    ]
    assert 0 == main(["next", "-c", str(path), "--from", "2026-07-01T00:00:00Z"])
    assert capsys.readouterr().out.splitlines()[1:] == [
        "  the window closed at 2026-06-01T02:00:00Z"
    ]


def test_calendars_lists_the_days_to_come_and_who_skips_them(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "shared.yaml").write_text("yearly: [01-06]\n")
    path = tmp_path / "jobs.yaml"
    path.write_text(HEAD + CALENDARS)
    args = ["calendars", "-c", str(path), "--from", "2026-12-30", "--days", "10"]
    assert 0 == main(args)
    assert capsys.readouterr().out.splitlines() == [
        "holidays: skipped by daily",
        "  3 day(s) from 2026-12-30 to 2027-01-08",
        "  2026-12-31  Thu",
        "  2027-01-01  Fri",
        "  2027-01-06  Wed",
    ]
    assert 0 == main([*args, "--json"])
    assert json.loads(capsys.readouterr().out)["calendars"] == [
        {"name": "holidays", "jobs": ["daily"], "days": ["2026-12-31", "2027-01-01", "2027-01-06"]}
    ]
