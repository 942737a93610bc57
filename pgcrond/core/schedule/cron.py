"""cron(8) expressions in a time zone, with Vixie cron's day rule and a DST policy.

Cron semantics follow Vixie cron, not APScheduler 3: day-of-week 0 and 7 are
Sunday, and when both day-of-month and day-of-week are restricted (neither
starts with ``*`` or is ``?``) a day matches if EITHER matches. The Quartz
extensions read as cronsim (healthchecks.io's evaluator) reads them:
``L`` (the last day of the month) and ``LW`` (its last weekday) in
day-of-month, ``nL`` (the last weekday n of the month) and ``n#k`` (the k-th
weekday n) in day-of-week; ``nW`` (the weekday nearest the n-th, never
leaving the month) as Quartz and croniter read it; ``?`` is ``*``.

Time zones: a job fires once per intended local wall-clock time, under its
:class:`Dst` policy. The default (``shift``, ``first``):

* A wall time skipped by a spring-forward transition is read with the offset
  in force before the transition, i.e. it fires shifted forward by the gap
  (02:30 Europe/Berlin on the last Sunday of March fires at 03:30 CEST).
* A wall time repeated by a fall-back transition fires at its first
  occurrence only (``fold=0``).
* Wall times that land on the same instant fire once.

Because skipped times move forward, local time -> instant is not monotonic
around a gap; :meth:`CronSchedule.next_after` accounts for that so that it
always returns the smallest qualifying instant. The other policies are that
stream filtered (``skip``: a shifted time is dropped; ``last``: a first
occurrence is dropped) and joined with the second occurrences (``last``,
``both``), which are found from the zone's fall-back transitions.
"""

from __future__ import annotations

import calendar
import functools
from bisect import bisect_left
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any, Literal
from zoneinfo import ZoneInfo

from pgcrond.core.schedule.base import Occasion, utc_seconds
from pgcrond.core.schedule.zones import (
    LOOKBACK,
    SECOND,
    fall_backs,
    offset_at,
    offsets,
    transition,
    wall_of,
)

# The Gregorian calendar repeats every 400 years: an expression that matches
# nothing in that span never matches, and any real expression matches sooner.
_HORIZON_YEARS = 400
_DAY_CACHE_SIZE = 512

Skipped = Literal["shift", "skip"]
Repeated = Literal["first", "last", "both"]

MACROS = {
    "@yearly": "0 0 1 1 *",
    "@annually": "0 0 1 1 *",
    "@monthly": "0 0 1 * *",
    "@weekly": "0 0 * * 0",
    "@daily": "0 0 * * *",
    "@midnight": "0 0 * * *",
    "@hourly": "0 * * * *",
}
_MONTH_NAMES = {
    name: number
    for number, name in enumerate(
        ["jan", "feb", "mar", "apr", "may", "jun", "jul", "aug", "sep", "oct", "nov", "dec"],
        start=1,
    )
}
_DAY_NAMES = {
    name: number for number, name in enumerate(["sun", "mon", "tue", "wed", "thu", "fri", "sat"])
}
_WEEKDAY_WORDS = ["Sunday", "Monday", "Tuesday", "Wednesday", "Thursday", "Friday", "Saturday"]


@dataclass(frozen=True)
class Dst:
    """What a job does at a clock change: a skipped wall time, a repeated one."""

    skipped: Skipped = "shift"  # shift: run it shifted forward by the gap; skip: not at all
    repeated: Repeated = "first"  # first or last occurrence, or both (two ticks, two run keys)

    def __str__(self) -> str:
        return f"dst skipped: {self.skipped}, repeated: {self.repeated}"


DEFAULT_DST = Dst()


@dataclass(frozen=True)
class _Field:
    name: str
    low: int
    high: int
    names: dict[str, int] = field(default_factory=dict)


_SECONDS = _Field("second", 0, 59)
_MINUTES = _Field("minute", 0, 59)
_HOURS = _Field("hour", 0, 23)
_DOM = _Field("day-of-month", 1, 31)
_MONTHS = _Field("month", 1, 12, _MONTH_NAMES)
# 7 is accepted as a second spelling of Sunday, as in cron(8).
_DOW = _Field("day-of-week", 0, 7, _DAY_NAMES)


@dataclass(frozen=True)
class _Specials:
    """The day fields' Quartz items: they name days that depend on the month."""

    last: bool = False  # day-of-month L
    last_weekday: bool = False  # day-of-month LW
    nearest: tuple[int, ...] = ()  # day-of-month nW
    last_of: frozenset[int] = frozenset()  # day-of-week nL (0-6)
    nth: frozenset[tuple[int, int]] = frozenset()  # day-of-week n#k: (weekday 0-6, k)


@functools.lru_cache(maxsize=4096)
def _parse_cached(text: str, zone: ZoneInfo, dst: Dst) -> CronSchedule:
    return CronSchedule._parse(text, zone, dst)


def _parse_field(text: str, spec: _Field) -> tuple[int, ...]:
    if text == "?":
        raise ValueError(
            f"{spec.name}: '?' (no specific value) is only for day-of-month or day-of-week"
        )
    values: set[int] = set()
    for item in text.split(","):
        values.update(_parse_item(item, spec))
    return tuple(sorted(values))


def _parse_item(item: str, spec: _Field) -> range:
    if not item:
        raise ValueError(f"{spec.name}: empty list item")
    _refuse_specials(item, spec)
    base, slash, step_text = item.partition("/")
    step = 1
    if slash:
        if not step_text.isdigit() or int(step_text) == 0:
            raise ValueError(f"{spec.name}: step {step_text!r} must be a positive integer")
        step = int(step_text)
    if base == "*":
        values = range(spec.low, spec.high + 1, step)
    else:
        start_text, dash, end_text = base.partition("-")
        start = _parse_value(start_text, spec)
        if not dash:
            if slash:
                raise ValueError(
                    f"{spec.name}: a step needs a range or '*', "
                    f"write '{start_text}-{spec.high}/{step}' or '*/{step}'"
                )
            return range(start, start + 1)
        end = _parse_value(end_text, spec)
        if end < start:
            raise ValueError(
                f"{spec.name}: range {base!r} runs backwards; write the smaller value first"
            )
        values = range(start, end + 1, step)
    size = spec.high - spec.low + 1
    if step > size:
        # A step restarts at every wrap of its field: '*/90' seconds fires at
        # second 0 of each minute, never every 90 seconds, so it is a mistake.
        raise ValueError(
            f"{spec.name}: step {step} in {item!r} is beyond the field's range "
            f"{spec.low}-{spec.high}: it fires only at {spec.name} {values[0]}, not every "
            f"{step}; use a step of at most {size}"
        )
    return values


def _refuse_specials(item: str, spec: _Field) -> None:
    """Explain a Quartz item written where it has no meaning (its own field is read apart)."""
    upper = item.upper()
    if "#" in upper:
        raise ValueError(
            f"{spec.name}: {item!r}: '#' (the n-th weekday of the month) belongs in "
            "day-of-week, as 'fri#2' (the second Friday), alone in its list item"
        )
    if "?" in upper:
        raise ValueError(
            f"{spec.name}: {item!r}: '?' stands alone, for the whole day-of-month or "
            "day-of-week field"
        )
    if spec is _DOW and upper.endswith("W"):
        raise ValueError(
            f"{spec.name}: {item!r}: 'W' (the weekday nearest a day) belongs in "
            "day-of-month, as '15W'"
        )
    if spec in (_DOM, _DOW) and "L" in upper:
        where = "day-of-month" if spec is _DOM else "day-of-week"
        raise ValueError(
            f"{where}: {item!r}: 'L' cannot take a range or a step; write 'L' or 'LW' in "
            "day-of-month, or '5L' (the last Friday) in day-of-week, as a list item alone"
        )
    quartz = upper in ("L", "LW", "W") or (upper[:-1].isdigit() and upper[-1:] in ("L", "W"))
    if spec not in (_DOM, _DOW) and quartz:
        raise ValueError(
            f"{spec.name}: {item!r}: 'L' and 'W' are only for day-of-month and day-of-week"
        )


def _parse_value(text: str, spec: _Field) -> int:
    lowered = text.lower()
    if lowered in spec.names:
        return spec.names[lowered]
    if not text.isdigit():
        allowed = f"a number {spec.low}-{spec.high}"
        if spec.names:
            allowed += f" or a name ({', '.join(spec.names)})"
        raise ValueError(f"{spec.name}: {text!r} is not {allowed}")
    value = int(text)
    if not spec.low <= value <= spec.high:
        raise ValueError(f"{spec.name}: {value} is out of range {spec.low}-{spec.high}")
    return value


def _parse_dom(text: str) -> tuple[tuple[int, ...], _Specials]:
    """Day-of-month: values, and L, LW, nW."""
    if text == "?":
        return tuple(range(1, 32)), _Specials()
    values: set[int] = set()
    last = last_weekday = False
    nearest: set[int] = set()
    for item in text.split(","):
        upper = item.upper()
        if upper == "L":
            last = True
        elif upper == "LW":
            last_weekday = True
        elif upper.endswith("L") and upper[:-1].isdigit():
            raise ValueError(
                f"day-of-month: {item!r}: 'L' alone is the last day of the month; the last "
                "Friday of the month is '5L' in day-of-week"
            )
        elif upper.endswith("W") and upper != "W":
            day_text = upper[:-1]
            if not day_text.isdigit():
                raise ValueError(
                    f"day-of-month: {item!r}: 'W' takes one day before it: '15W' is the "
                    "weekday nearest the 15th, 'LW' the last weekday of the month"
                )
            nearest.add(_parse_value(day_text, _DOM))
        elif upper == "W":
            raise ValueError(
                "day-of-month: 'W' needs a day before it: '15W' is the weekday nearest the "
                "15th, 'LW' the last weekday of the month"
            )
        else:
            values.update(_parse_item(item, _DOM))
    specials = _Specials(last=last, last_weekday=last_weekday, nearest=tuple(sorted(nearest)))
    return tuple(sorted(values)), specials


def _parse_dow(text: str) -> tuple[tuple[int, ...], _Specials]:
    """Day-of-week: values, and nL, n#k."""
    if text == "?":
        return tuple(range(7)), _Specials()
    values: set[int] = set()
    last_of: set[int] = set()
    nth: set[tuple[int, int]] = set()
    for item in text.split(","):
        upper = item.upper()
        day_text, hash_, nth_text = item.partition("#")
        if hash_:
            if not nth_text.isdigit() or not 1 <= int(nth_text) <= 5:
                raise ValueError(
                    f"day-of-week: {item!r}: the number after '#' is 1-5, the n-th of that "
                    "weekday in the month ('fri#2' is the second Friday; a month has at most "
                    "five of a weekday)"
                )
            nth.add((_weekday(day_text, item), int(nth_text)))
        elif upper == "L":
            raise ValueError(
                "day-of-week: 'L' needs a weekday before it: '5L' (or 'friL') is the last "
                "Friday of the month; the last day of the month is 'L' in day-of-month"
            )
        elif upper.endswith("L"):
            last_of.add(_weekday(item[:-1], item))
        else:
            values.update(_parse_item(item, _DOW))
    specials = _Specials(last_of=frozenset(last_of), nth=frozenset(nth))
    return tuple(sorted({d % 7 for d in values})), specials


def _weekday(text: str, item: str) -> int:
    try:
        return _parse_value(text, _DOW) % 7
    except ValueError:
        raise ValueError(
            f"day-of-week: {item!r}: 'L' and '#' take one weekday before them (0-7 or "
            "sun-sat): '5L' is the last Friday, 'fri#2' the second Friday"
        ) from None


def _next_in(values: Sequence[int], at_least: int) -> int | None:
    index = bisect_left(values, at_least)
    return values[index] if index < len(values) else None


def _nearest_weekday(day: int, first_weekday: int, length: int) -> int:
    """The weekday nearest ``day`` in its month (``first_weekday``: Monday 0).

    Quartz's rule: a Saturday moves to the Friday before and a Sunday to the
    Monday after, never across the month's edge (the 1st on a Saturday moves
    to Monday the 3rd, the 31st on a Sunday to Friday the 29th). A day past
    the month's end is read as its last day, as croniter reads it ('31W' in
    April is the weekday nearest the 30th).
    """
    day = min(day, length)
    weekday = (first_weekday + day - 1) % 7
    if weekday == 5:
        return day - 1 if day > 1 else day + 2
    if weekday == 6:
        return day + 1 if day < length else day - 2
    return day


def _clock(wall: datetime) -> str:
    return f"{wall:%H:%M}" if wall.second == 0 else f"{wall:%H:%M:%S}"


@dataclass(frozen=True, eq=False)
class CronSchedule:
    """A cron(8) expression evaluated in one time zone, under one DST policy.

    Build it with :meth:`parse`; the fields hold the sorted allowed values.
    """

    expression: str
    zone: ZoneInfo
    seconds: tuple[int, ...]
    minutes: tuple[int, ...]
    hours: tuple[int, ...]
    days_of_month: tuple[int, ...]
    months: tuple[int, ...]
    days_of_week: tuple[int, ...]
    # Vixie's rule: a day field is "restricted" iff its text does not start
    # with '*' (and is not '?', which is '*').
    dom_restricted: bool
    dow_restricted: bool
    specials: _Specials = _Specials()
    dst: Dst = DEFAULT_DST
    _day_cache: dict[tuple[int, int], tuple[int, ...]] = field(
        default_factory=dict, repr=False, compare=False
    )

    def __repr__(self) -> str:
        policy = "" if self.dst == DEFAULT_DST else f", {self.dst}"
        return f"CronSchedule({self.expression!r}, zone={self.zone.key!r}{policy})"

    # Equal by definition, the expression as written, the zone and the DST
    # policy, so that a reload tells an unchanged job from a changed one (the
    # parsed fields follow from these; the day cache is not part of the value).
    def __eq__(self, other: object) -> bool:
        if not isinstance(other, CronSchedule):
            return NotImplemented
        return self._value() == other._value()

    def __hash__(self) -> int:
        return hash(self._value())

    def _value(self) -> tuple[str, str, Dst]:
        return (self.expression, self.zone.key, self.dst)

    @classmethod
    def parse(cls, expression: str, zone: ZoneInfo, dst: Dst = DEFAULT_DST) -> CronSchedule:
        """Read an expression; raise ``ValueError`` naming the faulty field.

        One object per (expression, zone, policy): 10,000 jobs on one cron
        share it (a schedule is immutable; its day cache serves every job alike).
        """
        return _parse_cached(" ".join(expression.split()), zone, dst)

    @classmethod
    def _parse(cls, text: str, zone: ZoneInfo, dst: Dst) -> CronSchedule:
        if text.startswith("@"):
            if text.lower() == "@reboot":
                raise ValueError(
                    "@reboot is not supported: a cluster has no boot. 'once: true' is not "
                    "per boot either: it runs the job once per cluster, ever. The first "
                    "replica to start runs it; once it has succeeded, no start or restart of "
                    "any replica runs it again (a failed run is tried at the next start, and "
                    "`pgcrond unlock CODE --initial` allows one more run)"
                )
            if text.lower() not in MACROS:
                raise ValueError(f"unknown macro {text!r}; allowed: {', '.join(MACROS)}")
            fields = ["0", *MACROS[text.lower()].split()]
        else:
            fields = text.split()
            if len(fields) == 5:
                fields = ["0", *fields]
            elif len(fields) != 6:
                raise ValueError(
                    f"expected 5 fields (minute hour day-of-month month day-of-week) "
                    f"or 6 with seconds first, got {len(fields)}"
                )
        seconds, minutes, hours, dom, months, dow = fields
        days_of_month, dom_specials = _parse_dom(dom)
        days_of_week, dow_specials = _parse_dow(dow)
        schedule = cls(
            expression=text,
            zone=zone,
            seconds=_parse_field(seconds, _SECONDS),
            minutes=_parse_field(minutes, _MINUTES),
            hours=_parse_field(hours, _HOURS),
            days_of_month=days_of_month,
            months=_parse_field(months, _MONTHS),
            days_of_week=days_of_week,
            dom_restricted=not (dom.startswith("*") or dom == "?"),
            dow_restricted=not (dow.startswith("*") or dow == "?"),
            specials=_Specials(
                last=dom_specials.last,
                last_weekday=dom_specials.last_weekday,
                nearest=dom_specials.nearest,
                last_of=dow_specials.last_of,
                nth=dow_specials.nth,
            ),
            dst=dst,
        )
        if schedule._next_wall(datetime(2000, 1, 1)) is None:
            raise ValueError(
                f"{text!r} never fires: no date matches its day-of-month, month and day-of-week"
            )
        return schedule

    def describe(self) -> str:
        phrase = self._phrase()
        body = f"cron {self.expression!r}" + (f": {phrase}" if phrase else "")
        policy = "" if self.dst == DEFAULT_DST else f"; {self.dst}"
        return f"{body} ({self.zone.key}{policy})"

    def definition(self) -> dict[str, Any]:
        # The zone is the job's own field; the default policy is left out, so
        # that a definition written before policies existed reads the same.
        found: dict[str, Any] = {"cron": self.expression}
        if self.dst != DEFAULT_DST:
            found["dst"] = {"skipped": self.dst.skipped, "repeated": self.dst.repeated}
        return found

    def next_after(self, t: datetime) -> datetime | None:
        tick = self._next(utc_seconds(t))
        return None if tick is None else tick.replace(tzinfo=UTC)

    def occasion_after(self, t: datetime) -> Occasion | None:
        tick = self._next(utc_seconds(t))
        if tick is None:
            return None
        return Occasion(tick.replace(tzinfo=UTC), f"cron {self.expression!r}", self._dst_note(tick))

    def _next(self, now: datetime) -> datetime | None:
        """The policy's next tick after the naive UTC ``now``, as a naive UTC instant."""
        tick = self._first_reading_after(now)
        if self.dst == DEFAULT_DST:
            return tick
        zone = self.zone
        while tick is not None:
            wall = wall_of(tick, zone)
            if self.dst.skipped == "skip" and not self._matches(wall):
                tick = self._first_reading_after(tick)  # a skipped wall time, shifted
                continue
            before, after = offsets(wall, zone)
            if self.dst.repeated == "last" and before > after:
                # A first occurrence: none of this overlap's first occurrences
                # run, so look on from the end of the overlap's first pass.
                change = transition(zone, tick, tick + (before - after))
                tick = self._first_reading_after(change - SECOND)
                continue
            break
        if self.dst.repeated != "first":
            second = self._second_occurrence_after(now, tick)
            if second is not None:
                return second
        return tick

    def _second_occurrence_after(self, now: datetime, until: datetime | None) -> datetime | None:
        """The first second occurrence of a repeated wall time in (now, until), or None."""
        zone = self.zone
        last_year = (now if until is None else until).year
        for year in range((now - LOOKBACK).year, last_year + 1):
            for change, before, after in fall_backs(zone, year):
                if change + (before - after) <= now:
                    continue  # this overlap's second pass is over
                if until is not None and change >= until:
                    return None
                wall = self._next_wall(max(now + after, change + after - SECOND))
                if wall is not None and wall < change + before:
                    instant = wall - after
                    return instant if until is None or instant < until else None
        return None

    def _dst_note(self, tick: datetime) -> str | None:
        """How a clock change made ``tick`` (naive UTC), in words; None for an ordinary tick."""
        wall = wall_of(tick, self.zone)
        if not self._matches(wall):
            skipped = tick + offset_at(tick - LOOKBACK, self.zone)
            return (
                f"{_clock(skipped)} skipped by the clock change, run at {_clock(wall)} "
                f"(dst skipped: {self.dst.skipped})"
            )
        before, after = offsets(wall, self.zone)
        if before == after:
            return None
        which = "first" if tick == wall - before else "second"
        return (
            f"{_clock(wall)} repeated by the clock change, its {which} occurrence "
            f"(dst repeated: {self.dst.repeated})"
        )

    def _matches(self, wall: datetime) -> bool:
        return (
            wall.month in self.months
            and wall.hour in self.hours
            and wall.minute in self.minutes
            and wall.second in self.seconds
            and wall.day in self._days(wall.year, wall.month)
        )

    def _first_reading_after(self, now: datetime) -> datetime | None:
        """Under the default policy (shift, first): the first tick after the naive UTC ``now``."""
        zone = self.zone
        wall = wall_of(now, zone)
        # Within a few hours after a spring-forward, a skipped wall time (read
        # with the older, smaller offset) can still be in the future although
        # it lies before the current wall time: start the scan early enough.
        earlier = now + offset_at(now - LOOKBACK, zone)
        candidate = self._next_wall(min(wall, earlier))
        while candidate is not None:
            before, after = offsets(candidate, zone)
            instant = candidate - before
            if instant > now:
                if before < after:
                    instant = self._first_after_gap(candidate, before, after, now, instant)
                return instant
            if before > after:
                # A repeated wall time whose first occurrence is past. If we are
                # already in the second occurrence no repeated time can qualify:
                # jump to the end of the overlap instead of walking through it.
                end = transition(zone, candidate - before, candidate - after) + before
                candidate = self._next_wall(max(candidate, min(now + before, end - SECOND)))
            else:
                # Wall times up to now+offset map to instants <= now.
                candidate = self._next_wall(max(candidate, now + before))
        return None

    def _first_after_gap(
        self,
        skipped: datetime,
        before: timedelta,
        after: timedelta,
        now: datetime,
        instant: datetime,
    ) -> datetime:
        """A real wall time just after the gap can map earlier than a shifted skipped one."""
        gap_end = transition(self.zone, skipped - after, skipped - before) + after
        real = self._next_wall(max(gap_end - SECOND, now + after))
        if real is None:
            return instant
        real_before, real_after = offsets(real, self.zone)
        if real_before != real_after:
            return instant
        real_instant = real - real_before
        return real_instant if now < real_instant < instant else instant

    def _next_wall(self, after: datetime) -> datetime | None:
        """The first matching wall-clock time strictly after ``after`` (naive).

        Searches field by field, carrying into the next larger unit when a
        field has no value left, so a call costs a handful of steps.
        """
        start = after.replace(microsecond=0) + SECOND
        year, month, day = start.year, start.month, start.day
        hour, minute, second = start.hour, start.minute, start.second
        limit = min(year + _HORIZON_YEARS, 9999)
        while year <= limit:
            found = _next_in(self.months, month)
            if found is None:
                year, month, day, hour, minute, second = year + 1, 1, 1, 0, 0, 0
                continue
            if found != month:
                month, day, hour, minute, second = found, 1, 0, 0, 0
            found = _next_in(self._days(year, month), day)
            if found is None:
                month, day, hour, minute, second = month + 1, 1, 0, 0, 0
                continue
            if found != day:
                day, hour, minute, second = found, 0, 0, 0
            found = _next_in(self.hours, hour)
            if found is None:
                day, hour, minute, second = day + 1, 0, 0, 0
                continue
            if found != hour:
                hour, minute, second = found, 0, 0
            found = _next_in(self.minutes, minute)
            if found is None:
                hour, minute, second = hour + 1, 0, 0
                continue
            if found != minute:
                minute, second = found, 0
            found = _next_in(self.seconds, second)
            if found is None:
                minute, second = minute + 1, 0
                continue
            return datetime(year, month, day, hour, minute, found)
        return None

    def _days(self, year: int, month: int) -> tuple[int, ...]:
        """The days of one month that match, honouring the OR rule of cron(8)."""
        key = (year, month)
        cached = self._day_cache.get(key)
        if cached is not None:
            return cached
        first_weekday, length = calendar.monthrange(year, month)
        # calendar counts Monday as 0; cron counts Sunday as 0.
        first_cron_weekday = (first_weekday + 1) % 7
        dom = set(self.days_of_month)
        special = self.specials
        if special.last:
            dom.add(length)
        if special.last_weekday:
            dom.add(_nearest_weekday(length, first_weekday, length))
        dom.update(_nearest_weekday(wanted, first_weekday, length) for wanted in special.nearest)
        dow = set(self.days_of_week)
        either = self.dom_restricted and self.dow_restricted
        days = []
        for day in range(1, length + 1):
            weekday = (first_cron_weekday + day - 1) % 7
            dom_ok = day in dom
            dow_ok = (
                weekday in dow
                or (weekday in special.last_of and day + 7 > length)
                or (weekday, (day + 6) // 7) in special.nth
            )
            if (dom_ok or dow_ok) if either else (dom_ok and dow_ok):
                days.append(day)
        if len(self._day_cache) >= _DAY_CACHE_SIZE:
            self._day_cache.clear()
        result = tuple(days)
        self._day_cache[key] = result
        return result

    def _phrase(self) -> str | None:
        """Plain words for the shapes people write most; None for the rest."""
        parts = MACROS.get(self.expression.lower(), self.expression).split()
        if len(parts) != 5:
            return None
        minute, hour, dom, month, dow = parts
        at = f"at {int(hour):02d}:{int(minute):02d}" if (minute + hour).isdigit() else None
        if [dom, month, dow] == ["*", "*", "*"]:
            if at:
                return f"{at} every day"
            if minute.isdigit() and hour == "*":
                return f"every hour at minute {int(minute)}"
            if minute == "*" and hour == "*":
                return "every minute"
            if minute.startswith("*/") and hour == "*":
                return f"every {minute[2:]} minutes"
        if at and month == "*" and dow in ("*", "?"):
            if dom.upper() == "L":
                return f"{at} on the last day of the month"
            if dom.upper() == "LW":
                return f"{at} on the last weekday of the month"
            if dom.upper().endswith("W") and dom[:-1].isdigit():
                return f"{at} on the weekday nearest the {_ordinal(int(dom[:-1]))}"
        if at and month == "*" and dom in ("*", "?"):
            _, hash_, nth = dow.partition("#")
            if hash_ and len(self.specials.nth) == 1:
                weekday = _WEEKDAY_WORDS[next(iter(self.specials.nth))[0]]
                return f"{at} on the {_ordinal(int(nth))} {weekday} of the month"
            if dow.upper().endswith("L") and len(self.specials.last_of) == 1:
                weekday = _WEEKDAY_WORDS[next(iter(self.specials.last_of))]
                return f"{at} on the last {weekday} of the month"
        return None


def _ordinal(n: int) -> str:
    suffix = "th" if 10 <= n % 100 <= 20 else {1: "st", 2: "nd", 3: "rd"}.get(n % 10, "th")
    return f"{n}{suffix}"
