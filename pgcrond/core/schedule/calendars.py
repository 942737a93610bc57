"""Calendars: named lists of days (holidays, freeze windows) on which a job's ticks are skipped.

A day is a local date in the job's zone. A calendar holds single dates,
inclusive ranges of dates and yearly dates (a month and a day, every year;
``02-29`` only in leap years).
"""

from __future__ import annotations

import hashlib
import json
import re
from bisect import bisect_right
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import date, timedelta
from typing import Any

_YEARLY = re.compile(r"^(\d{2})-(\d{2})$")
# A range is written with two dots, as in ISO 8601's "2026-12-24/2026-12-31" read aloud.
RANGE_MARK = ".."


def parse_day(text: str) -> tuple[date, date]:
    """``2026-12-24`` or ``2026-12-24..2027-01-02`` -> (first, last), both included."""
    first_text, mark, last_text = text.strip().partition(RANGE_MARK)
    first = _date(first_text)
    last = _date(last_text) if mark else first
    if last < first:
        raise ValueError(f"range {text!r} runs backwards; write the earlier date first")
    return first, last


def parse_yearly(text: str) -> tuple[int, int]:
    """``12-25`` -> (12, 25): that day every year."""
    found = _YEARLY.match(text.strip())
    if found is None:
        raise ValueError(f"{text!r} is not a yearly date MM-DD like 12-25")
    month, day = int(found[1]), int(found[2])
    try:
        date(2000, month, day)  # a leap year: 02-29 is a yearly date
    except ValueError:
        raise ValueError(f"{text!r} is no day of the year (MM-DD)") from None
    return month, day


def _date(text: str) -> date:
    try:
        return date.fromisoformat(text.strip())
    except ValueError:
        raise ValueError(
            f"{text.strip()!r} is not a date like 2026-12-24 or a range like 2026-12-24..2027-01-02"
        ) from None


@dataclass(frozen=True)
class Calendar:
    """A named set of days; build it with :meth:`build` (spans sorted and merged)."""

    name: str
    spans: tuple[tuple[date, date], ...] = ()  # inclusive, sorted, apart
    yearly: frozenset[tuple[int, int]] = frozenset()  # (month, day)

    @classmethod
    def build(
        cls, name: str, spans: Iterable[tuple[date, date]], yearly: Iterable[tuple[int, int]] = ()
    ) -> Calendar:
        merged: list[tuple[date, date]] = []
        for first, last in sorted(spans):
            if merged and first <= merged[-1][1] + timedelta(days=1):
                merged[-1] = (merged[-1][0], max(merged[-1][1], last))
            else:
                merged.append((first, last))
        return cls(name, tuple(merged), frozenset(yearly))

    def __repr__(self) -> str:
        # A schedule's repr keys the daemon's timers: a changed day must change it.
        text = json.dumps(self.definition(), sort_keys=True)
        return f"Calendar({self.name!r}, {hashlib.sha256(text.encode()).hexdigest()[:16]})"

    def holds(self, day: date) -> bool:
        if (day.month, day.day) in self.yearly:
            return True
        index = bisect_right(self.spans, (day, date.max)) - 1
        return index >= 0 and self.spans[index][0] <= day <= self.spans[index][1]

    def days(self, first: date, last: date) -> list[date]:
        """The calendar's days from ``first`` to ``last``, both included."""
        found: list[date] = []
        day = first
        while day <= last:
            if self.holds(day):
                found.append(day)
            day += timedelta(days=1)
        return found

    def definition(self) -> dict[str, Any]:
        return {
            "days": [
                a.isoformat() if a == b else f"{a.isoformat()}{RANGE_MARK}{b.isoformat()}"
                for a, b in self.spans
            ],
            "yearly": [f"{m:02d}-{d:02d}" for m, d in sorted(self.yearly)],
        }

    @classmethod
    def from_definition(cls, name: str, found: dict[str, Any]) -> Calendar:
        spans = [parse_day(text) for text in found.get("days", [])]
        return cls.build(name, spans, [parse_yearly(text) for text in found.get("yearly", [])])
