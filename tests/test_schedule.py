"""cron(8) semantics, DST rules and run keys of pgcrond.core.schedule, on hand-picked cases."""

from __future__ import annotations

import re
from datetime import UTC, datetime
from zoneinfo import ZoneInfo

import pytest

from pgcrond.core.schedule import (
    AtSchedule,
    CronSchedule,
    OnceSchedule,
    local_to_instant,
    run_key_for,
)

BERLIN = ZoneInfo("Europe/Berlin")
NEW_YORK = ZoneInfo("America/New_York")
UTC_ZONE = ZoneInfo("UTC")


def utc(
    year: int, month: int, day: int, hour: int = 0, minute: int = 0, second: int = 0
) -> datetime:
    return datetime(year, month, day, hour, minute, second, tzinfo=UTC)


def ticks(expr: str, zone: ZoneInfo, start: datetime, count: int) -> list[str]:
    schedule = CronSchedule.parse(expr, zone)
    out = []
    t: datetime | None = start
    for _ in range(count):
        assert t is not None
        t = schedule.next_after(t)
        assert t is not None
        out.append(run_key_for(t))
    return out


def local(tick: str, zone: ZoneInfo) -> str:
    return datetime.fromisoformat(tick).astimezone(zone).isoformat()


# --- fields and names -------------------------------------------------------


def test_sunday_is_both_0_and_7() -> None:
    """2026-03-01 is a Sunday; `0` and `7` and `sun` all name it."""
    for dow in ("0", "7", "sun", "SUN"):
        assert ticks(f"0 0 * * {dow}", UTC_ZONE, utc(2026, 2, 26), 1) == ["2026-03-01T00:00:00Z"]


def test_day_of_week_range_ending_at_7_includes_sunday() -> None:
    assert ticks("0 0 * * 5-7", UTC_ZONE, utc(2026, 2, 26), 3) == [
        "2026-02-27T00:00:00Z",  # Friday
        "2026-02-28T00:00:00Z",  # Saturday
        "2026-03-01T00:00:00Z",  # Sunday
    ]


def test_day_of_month_or_day_of_week_when_both_restricted() -> None:
    """`0 0 13 * fri`: every 13th AND every Friday (Vixie's OR), not Friday the 13th only."""
    assert ticks("0 0 13 * fri", UTC_ZONE, utc(2026, 3, 1), 4) == [
        "2026-03-06T00:00:00Z",  # Friday
        "2026-03-13T00:00:00Z",  # the 13th (also a Friday: fires once)
        "2026-03-20T00:00:00Z",  # Friday
        "2026-03-27T00:00:00Z",  # Friday
    ]
    assert ticks("0 0 13 * fri", UTC_ZONE, utc(2026, 4, 1), 2) == [
        "2026-04-03T00:00:00Z",
        "2026-04-10T00:00:00Z",
    ]
    assert "2026-04-13T00:00:00Z" in ticks("0 0 13 * fri", UTC_ZONE, utc(2026, 4, 1), 4)


def test_a_day_field_starting_with_star_is_unrestricted_so_both_must_match() -> None:
    """`*/2` in day-of-month starts with '*': the fields AND, as in Vixie cron."""
    # Odd days of March 2026 that are Mondays: the 9th, 23rd.
    assert ticks("0 0 */2 * mon", UTC_ZONE, utc(2026, 3, 1), 2) == [
        "2026-03-09T00:00:00Z",
        "2026-03-23T00:00:00Z",
    ]


def test_names_are_case_insensitive_and_work_in_ranges() -> None:
    assert ticks("0 12 1 JAN-mar * ", UTC_ZONE, utc(2026, 1, 15), 3) == [
        "2026-02-01T12:00:00Z",
        "2026-03-01T12:00:00Z",
        "2027-01-01T12:00:00Z",
    ]


def test_steps_over_ranges_and_lists() -> None:
    assert ticks("10-30/10,45 9 * * *", UTC_ZONE, utc(2026, 1, 1), 5) == [
        "2026-01-01T09:10:00Z",
        "2026-01-01T09:20:00Z",
        "2026-01-01T09:30:00Z",
        "2026-01-01T09:45:00Z",
        "2026-01-02T09:10:00Z",
    ]


@pytest.mark.parametrize(
    ("macro", "first"),
    [
        ("@yearly", "2027-01-01T00:00:00Z"),
        ("@annually", "2027-01-01T00:00:00Z"),
        ("@monthly", "2026-04-01T00:00:00Z"),
        ("@weekly", "2026-03-15T00:00:00Z"),
        ("@daily", "2026-03-11T00:00:00Z"),
        ("@midnight", "2026-03-11T00:00:00Z"),
        ("@hourly", "2026-03-10T13:00:00Z"),
    ],
)
def test_macros(macro: str, first: str) -> None:
    assert ticks(macro, UTC_ZONE, utc(2026, 3, 10, 12, 30), 1) == [first]


def test_leap_day_fires_only_in_leap_years() -> None:
    assert ticks("0 0 29 2 *", UTC_ZONE, utc(2026, 1, 1), 2) == [
        "2028-02-29T00:00:00Z",
        "2032-02-29T00:00:00Z",
    ]


def test_the_31st_skips_months_with_30_days() -> None:
    assert ticks("0 0 31 * *", UTC_ZONE, utc(2026, 3, 31, 1), 3) == [
        "2026-05-31T00:00:00Z",
        "2026-07-31T00:00:00Z",
        "2026-08-31T00:00:00Z",
    ]


@pytest.mark.parametrize("expr", ["0 0 30 2 *", "0 0 31 4,6,9,11 *", "0 0 31 2 */2"])
def test_expressions_that_never_fire_are_refused(expr: str) -> None:
    with pytest.raises(ValueError, match="never fires"):
        CronSchedule.parse(expr, UTC_ZONE)


@pytest.mark.parametrize(
    ("expr", "message"),
    [
        ("0 0 * * 8", "day-of-week: 8 is out of range 0-7"),
        ("60 * * * *", "minute: 60 is out of range 0-59"),
        ("0 24 * * *", "hour: 24 is out of range 0-23"),
        ("0 0 0 * *", "day-of-month: 0 is out of range 1-31"),
        ("0 0 * 13 *", "month: 13 is out of range 1-12"),
        ("60 0 * * * *", "second: 60 is out of range 0-59"),
        ("0 0 * foo *", "month: 'foo' is not a number 1-12 or a name (jan"),
        ("0 0 * * mon-", "day-of-week: '' is not a number"),
        ("*/0 * * * *", "minute: step '0' must be a positive integer"),
        ("5/10 * * * *", "minute: a step needs a range or '*'"),
        ("30-10 * * * *", "minute: range '30-10' runs backwards"),
        ("1,,2 * * * *", "minute: empty list item"),
        ("* * * *", "expected 5 fields"),
        ("* * * * * * *", "expected 5 fields"),
        ("@every 5m", "unknown macro"),
        (
            "@reboot",
            "@reboot is not supported: a cluster has no boot. 'once: true' is not per "
            "boot either: it runs the job once per cluster, ever.",
        ),
        (
            "*/90 * * * * *",
            "second: step 90 in '*/90' is beyond the field's range 0-59: "
            "it fires only at second 0, not every 90; use a step of at most 60",
        ),
        ("*/61 * * * *", "minute: step 61 in '*/61' is beyond the field's range 0-59"),
        ("0 */25 * * *", "hour: step 25 in '*/25' is beyond the field's range 0-23"),
        ("0 0 */32 * *", "day-of-month: step 32 in '*/32' is beyond the field's range 1-31"),
        (
            "0 0 * 2-11/13 *",
            "month: step 13 in '2-11/13' is beyond the field's range 1-12: "
            "it fires only at month 2",
        ),
        ("", "expected 5 fields"),
    ],
)
def test_bad_expressions_name_the_field(expr: str, message: str) -> None:
    with pytest.raises(ValueError, match="^" + re.escape(message)):
        CronSchedule.parse(expr, UTC_ZONE)


def test_a_step_as_wide_as_its_field_is_still_allowed() -> None:
    """'*/60' minutes is every 60 minutes (hourly at :00), which is what it says."""
    assert ["0"] == [str(m) for m in CronSchedule.parse("*/60 * * * *", UTC_ZONE).minutes]


def test_schedules_are_equal_by_expression_and_zone() -> None:
    """A reload compares jobs: the same definition parsed twice is the same schedule."""
    berlin = ZoneInfo("Europe/Berlin")
    assert CronSchedule.parse("0 3 * * *", UTC_ZONE) == CronSchedule.parse("0  3 * * *", UTC_ZONE)
    assert hash(CronSchedule.parse("0 3 * * *", berlin)) == hash(
        CronSchedule.parse("0 3 * * *", berlin)
    )
    assert CronSchedule.parse("0 3 * * *", UTC_ZONE) != CronSchedule.parse("0 4 * * *", UTC_ZONE)
    assert CronSchedule.parse("0 3 * * *", UTC_ZONE) != CronSchedule.parse("0 3 * * *", berlin)


# --- seconds ----------------------------------------------------------------


def test_six_fields_put_seconds_first() -> None:
    assert ticks("*/20 * * * * *", UTC_ZONE, utc(2026, 1, 1, 0, 0, 30), 4) == [
        "2026-01-01T00:00:40Z",
        "2026-01-01T00:01:00Z",
        "2026-01-01T00:01:20Z",
        "2026-01-01T00:01:40Z",
    ]
    assert ticks("15 30 9 * * *", UTC_ZONE, utc(2026, 1, 1), 1) == ["2026-01-01T09:30:15Z"]


def test_next_after_is_strict_and_ignores_microseconds() -> None:
    schedule = CronSchedule.parse("* * * * * *", UTC_ZONE)
    assert schedule.next_after(utc(2026, 1, 1, 0, 0, 5)) == utc(2026, 1, 1, 0, 0, 6)
    t = datetime(2026, 1, 1, 0, 0, 5, 999_999, tzinfo=UTC)
    assert schedule.next_after(t) == utc(2026, 1, 1, 0, 0, 6)


def test_next_after_accepts_any_aware_instant_and_answers_in_utc() -> None:
    schedule = CronSchedule.parse("0 * * * *", BERLIN)
    result = schedule.next_after(datetime(2026, 1, 1, 12, 30, tzinfo=BERLIN))
    assert result == utc(2026, 1, 1, 12)
    assert result is not None and result.tzinfo is UTC


def test_next_after_refuses_naive_datetimes() -> None:
    with pytest.raises(ValueError, match="aware"):
        CronSchedule.parse("* * * * *", UTC_ZONE).next_after(datetime(2026, 1, 1))


# --- DST: Europe/Berlin (CET +01 <-> CEST +02, at 01:00 UTC) ----------------


def test_berlin_daily_time_in_the_skipped_hour_fires_shifted_by_the_gap_once() -> None:
    """02:30 does not exist on 2026-03-29: it fires at 03:30 CEST, and only once that day."""
    got = ticks("30 2 * * *", BERLIN, utc(2026, 3, 27, 12), 3)
    assert [local(t, BERLIN) for t in got] == [
        "2026-03-28T02:30:00+01:00",
        "2026-03-29T03:30:00+02:00",
        "2026-03-30T02:30:00+02:00",
    ]


def test_berlin_daily_time_in_the_repeated_hour_fires_once_at_its_first_occurrence() -> None:
    got = ticks("30 2 * * *", BERLIN, utc(2026, 10, 24, 12), 3)
    assert got == [
        "2026-10-25T00:30:00Z",  # 02:30 CEST, the first of the two 02:30s
        "2026-10-26T01:30:00Z",  # 02:30 CET the next day
        "2026-10-27T01:30:00Z",
    ]


def test_berlin_repeated_hour_from_inside_the_second_occurrence() -> None:
    """At 02:10 CET (second pass) the repeated 02:xx times are spent; 03:00 CET is next."""
    got = ticks("20,50 2,3 * * *", BERLIN, utc(2026, 10, 25, 1, 10), 2)
    assert got == ["2026-10-25T02:20:00Z", "2026-10-25T02:50:00Z"]  # 03:20 and 03:50 CET
    got = ticks("0,20 2,3 * * *", BERLIN, utc(2026, 10, 25, 1, 10), 1)
    assert got == ["2026-10-25T02:00:00Z"]  # 03:00 CET


def test_berlin_every_15_minutes_across_spring_forward() -> None:
    """The skipped 02:xx times land on the same instants as 03:xx: each instant fires once."""
    got = ticks("*/15 * * * *", BERLIN, utc(2026, 3, 29, 0, 30), 5)
    assert got == [
        "2026-03-29T00:45:00Z",  # 01:45 CET
        "2026-03-29T01:00:00Z",  # 03:00 CEST (also 02:00 shifted)
        "2026-03-29T01:15:00Z",
        "2026-03-29T01:30:00Z",
        "2026-03-29T01:45:00Z",
    ]


def test_berlin_hourly_across_fall_back_skips_the_repeated_hour() -> None:
    got = ticks("0 * * * *", BERLIN, utc(2026, 10, 24, 22, 30), 4)
    assert [local(t, BERLIN) for t in got] == [
        "2026-10-25T01:00:00+02:00",
        "2026-10-25T02:00:00+02:00",
        "2026-10-25T03:00:00+01:00",  # 02:00 CET is the repeated 02:00: already fired
        "2026-10-25T04:00:00+01:00",
    ]


def test_berlin_just_after_the_gap_a_shifted_time_still_comes() -> None:
    """At 03:10 CEST the shifted 02:30 (03:30 CEST) is still ahead although 02:30 < 03:10."""
    assert ticks("30 2 * * *", BERLIN, utc(2026, 3, 29, 1, 10), 1) == ["2026-03-29T01:30:00Z"]


def test_berlin_a_real_time_after_the_gap_can_come_before_a_shifted_one() -> None:
    """02:45 shifts to 03:45 CEST, but 03:05 CEST is real and earlier."""
    got = ticks("45,5 2,3 * * *", BERLIN, utc(2026, 3, 29, 0, 50), 3)
    assert [local(t, BERLIN) for t in got] == [
        "2026-03-29T03:05:00+02:00",  # 02:05 shifted and 03:05 are the same instant
        "2026-03-29T03:45:00+02:00",  # 02:45 shifted and 03:45: same instant again
        "2026-03-30T02:05:00+02:00",
    ]


# --- DST: America/New_York (EST -05 <-> EDT -04, at 02:00 local) -------------


def test_new_york_daily_time_in_the_skipped_hour_fires_at_3_30_edt() -> None:
    got = ticks("30 2 * * *", NEW_YORK, utc(2026, 3, 7, 12), 3)
    assert [local(t, NEW_YORK) for t in got] == [
        "2026-03-08T03:30:00-04:00",
        "2026-03-09T02:30:00-04:00",
        "2026-03-10T02:30:00-04:00",
    ]


def test_new_york_daily_time_in_the_repeated_hour_fires_once() -> None:
    got = ticks("30 1 * * *", NEW_YORK, utc(2026, 10, 31, 12), 3)
    assert [local(t, NEW_YORK) for t in got] == [
        "2026-11-01T01:30:00-04:00",  # first 01:30 (EDT); the EST one does not fire
        "2026-11-02T01:30:00-05:00",
        "2026-11-03T01:30:00-05:00",
    ]


def test_new_york_every_15_minutes_across_fall_back() -> None:
    got = ticks("*/15 * * * *", NEW_YORK, utc(2026, 11, 1, 5, 30), 4)
    assert [local(t, NEW_YORK) for t in got] == [
        "2026-11-01T01:45:00-04:00",
        "2026-11-01T02:00:00-05:00",  # the 01:xx EST pass is the repeated hour
        "2026-11-01T02:15:00-05:00",
        "2026-11-01T02:30:00-05:00",
    ]


def test_new_york_hourly_across_spring_forward() -> None:
    got = ticks("0 * * * *", NEW_YORK, utc(2026, 3, 8, 5, 30), 3)
    assert [local(t, NEW_YORK) for t in got] == [
        "2026-03-08T01:00:00-05:00",
        "2026-03-08T03:00:00-04:00",  # 02:00 shifts onto 03:00: one tick
        "2026-03-08T04:00:00-04:00",
    ]


def test_local_to_instant_follows_the_same_rule() -> None:
    assert local_to_instant(datetime(2026, 3, 29, 2, 30), BERLIN) == utc(2026, 3, 29, 1, 30)
    assert local_to_instant(datetime(2026, 10, 25, 2, 30), BERLIN) == utc(2026, 10, 25, 0, 30)


# --- run keys, at, once, describe -----------------------------------------------


def test_run_key_is_utc_iso_with_z_in_whole_seconds() -> None:
    tick = datetime(2026, 3, 29, 3, 30, 0, 123, tzinfo=BERLIN)
    assert run_key_for(tick) == "2026-03-29T01:30:00Z"
    with pytest.raises(ValueError, match="aware"):
        run_key_for(datetime(2026, 1, 1))


def test_at_schedule_fires_once_strictly_after() -> None:
    at = AtSchedule(datetime(2026, 5, 1, 12, tzinfo=BERLIN))
    assert at.next_after(utc(2026, 5, 1, 9, 59)) == utc(2026, 5, 1, 10)
    assert at.next_after(utc(2026, 5, 1, 10)) is None
    assert at.describe() == "once at 2026-05-01T10:00:00Z"


def test_once_schedule_has_no_ticks() -> None:
    assert OnceSchedule().next_after(utc(2026, 1, 1)) is None
    assert OnceSchedule().describe() == "once, at start (run-once)"


@pytest.mark.parametrize(
    ("expr", "text"),
    [
        ("0 3 * * *", "cron '0 3 * * *': at 03:00 every day (Europe/Berlin)"),
        ("*/5 * * * *", "cron '*/5 * * * *': every 5 minutes (Europe/Berlin)"),
        ("7 * * * *", "cron '7 * * * *': every hour at minute 7 (Europe/Berlin)"),
        ("* * * * *", "cron '* * * * *': every minute (Europe/Berlin)"),
        ("@daily", "cron '@daily': at 00:00 every day (Europe/Berlin)"),
        ("0 3 * * 1-5", "cron '0 3 * * 1-5' (Europe/Berlin)"),
    ],
)
def test_describe(expr: str, text: str) -> None:
    assert CronSchedule.parse(expr, BERLIN).describe() == text
