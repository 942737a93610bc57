"""Durations as written in YAML: unit strings, combinations and plain milliseconds."""

from __future__ import annotations

from datetime import timedelta

import pytest

from pgcrond.core.durations import format_duration, parse_duration


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("90s", timedelta(seconds=90)),
        ("15m", timedelta(minutes=15)),
        ("2h", timedelta(hours=2)),
        ("1d", timedelta(days=1)),
        ("500ms", timedelta(milliseconds=500)),
        ("1h30m", timedelta(hours=1, minutes=30)),
        ("1h 30m 5s", timedelta(hours=1, minutes=30, seconds=5)),
        ("1.5h", timedelta(minutes=90)),
        ("0s", timedelta(0)),
        (" 10s ", timedelta(seconds=10)),
        ("0", timedelta(0)),
        (0, timedelta(0)),
        (timedelta(seconds=3), timedelta(seconds=3)),
    ],
)
def test_accepted_spellings(text: object, expected: timedelta) -> None:
    assert parse_duration(text) == expected


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ("-5s", "must not be negative"),
        (-5, "must not be negative"),
        (timedelta(seconds=-1), "must not be negative"),
        (True, "got a boolean"),
        (False, "got a boolean"),
        (1.5, "got a decimal number"),
        (None, "got nothing"),
        ([1], "got a list"),
        ("1.5x", "cannot read '1.5x'"),
        ("1.5.3s", "cannot read"),
        ("15 minutes", "cannot read"),
        ("", "cannot read"),
        ("s", "cannot read"),
        ("1m1m", "unit 'm' appears twice"),
    ],
)
def test_refused_values_say_what_is_allowed(value: object, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        parse_duration(value)


@pytest.mark.parametrize(
    ("value", "text"),
    [
        (timedelta(0), "0s"),
        (timedelta(milliseconds=500), "500ms"),
        (timedelta(hours=1, minutes=30), "1h30m"),
        (timedelta(days=30), "30d"),
    ],
)
def test_format_round_trips(value: timedelta, text: str) -> None:
    assert format_duration(value) == text
    assert parse_duration(text) == value
