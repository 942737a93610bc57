"""The database's clock bounded from below by the tightest recent answer (``ClockFloor``)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from pgcrond.storage.dbclock import MAX_AGE_S, RATE_MARGIN, ClockFloor

DB_NOW = datetime(2026, 12, 4, 20, 0, tzinfo=UTC)


def ms(milliseconds: float) -> timedelta:
    return timedelta(milliseconds=milliseconds)


def close(a: datetime | None, b: datetime) -> bool:
    return a is not None and abs(a - b) < timedelta(microseconds=5)


def test_without_an_answer_nothing_is_known() -> None:
    assert ClockFloor().now_at_least(100.0) is None


def test_an_answer_bounds_the_clock_from_its_arrival_on_less_the_rate_margin() -> None:
    floor = ClockFloor()
    floor.saw(DB_NOW, received_at=100.0)
    assert close(floor.now_at_least(100.0), DB_NOW)
    # A second later the database's clock moved on at least 1 s less the margin.
    assert close(floor.now_at_least(101.0), DB_NOW + timedelta(seconds=1 - RATE_MARGIN))


def test_a_laggier_answer_leaves_the_tighter_bound_in_place() -> None:
    floor = ClockFloor()
    floor.saw(DB_NOW, received_at=100.0)  # read at most a moment before its arrival
    # Read 10 ms of database time later, arrived 50 ms later: 40 ms of lag more.
    floor.saw(DB_NOW + ms(10), received_at=100.050)
    assert close(floor.now_at_least(100.050), DB_NOW + ms(50) * (1 - RATE_MARGIN))


def test_a_tighter_answer_raises_the_bound() -> None:
    floor = ClockFloor()
    floor.saw(DB_NOW, received_at=100.0)
    floor.saw(DB_NOW + ms(60), received_at=100.050)  # the first had lagged 10 ms more
    assert close(floor.now_at_least(100.050), DB_NOW + ms(60))


def test_an_old_answer_gives_way_to_a_newer_one_and_none_is_used_past_the_max_age() -> None:
    floor = ClockFloor()
    floor.saw(DB_NOW, received_at=100.0)
    at = 100.0 + MAX_AGE_S + 1
    assert floor.now_at_least(at) is None
    # Half the max age on, a looser answer replaces the anchor: it is still usable later.
    later = 100.0 + MAX_AGE_S / 2 + 1
    floor.saw(DB_NOW + timedelta(seconds=MAX_AGE_S / 2), received_at=later)
    assert close(
        floor.now_at_least(at),
        DB_NOW + timedelta(seconds=MAX_AGE_S / 2 + (1 - RATE_MARGIN) * (at - later)),
    )


def test_the_bound_reaches_an_instant_when_the_slowest_database_clock_would() -> None:
    floor = ClockFloor()
    assert floor.reaches(DB_NOW, now=100.0) is None
    floor.saw(DB_NOW, received_at=100.0)
    at = floor.reaches(DB_NOW + timedelta(seconds=2), now=100.0)
    # Two seconds of the database's clock at its slowest take longer than 2 s here.
    assert at is not None and abs(at - (100.0 + 2 / (1 - RATE_MARGIN))) < 1e-6
    assert close(floor.now_at_least(at), DB_NOW + timedelta(seconds=2))
    assert floor.reaches(DB_NOW, now=100.0 + MAX_AGE_S + 1) is None
