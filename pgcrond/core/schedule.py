"""When jobs fire: cron(8) expressions, one-off instants and run-once jobs.

Pure functions of their arguments: the caller passes the instant to search
from, and every answer is an aware UTC datetime in whole seconds, so that all
replicas compute the same tick (and therefore the same run key) for a fire.

Cron semantics follow Vixie cron, not APScheduler 3: day-of-week 0 and 7 are
Sunday, and when both day-of-month and day-of-week are restricted (neither
starts with ``*``) a day matches if EITHER matches.

Time zones: a job fires once per intended local wall-clock time.

* A wall time skipped by a spring-forward transition is read with the offset
  in force before the transition, i.e. it fires shifted forward by the gap
  (02:30 Europe/Berlin on the last Sunday of March fires at 03:30 CEST).
* A wall time repeated by a fall-back transition fires at its first
  occurrence only (``fold=0``).
* Wall times that land on the same instant fire once.

Because skipped times move forward, local time -> instant is not monotonic
around a gap; :meth:`CronSchedule.next_after` accounts for that so that it
always returns the smallest qualifying instant.
"""

from __future__ import annotations

import calendar
import functools
from bisect import bisect_left
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Protocol
from zoneinfo import ZoneInfo

_SECOND = timedelta(seconds=1)
# Longer than any DST gap or overlap on record (2 h for wartime double summer time).
_LOOKBACK = timedelta(hours=3)
# The Gregorian calendar repeats every 400 years: an expression that matches
# nothing in that span never matches, and any real expression matches sooner.
_HORIZON_YEARS = 400
_DAY_CACHE_SIZE = 512

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


class Schedule(Protocol):
    """When a job fires. Every implementation is immutable and clock-free."""

    def next_after(self, t: datetime) -> datetime | None:
        """The first tick strictly after the aware instant ``t`` (aware UTC), or None."""
        ...

    def describe(self) -> str:
        """A short English phrase for `pgcrond check` and `pgcrond next`."""
        ...


def run_key_for(tick: datetime) -> str:
    """The run key of a tick: its instant in UTC, ISO-8601, whole seconds."""
    if tick.tzinfo is None:
        raise ValueError("a tick must be an aware datetime")
    return tick.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def manual_run_key(now: datetime) -> str:
    """``manual:<UTC minute>``: a run asked for by hand, the same for askers in one minute."""
    return "manual:" + now.astimezone(UTC).strftime("%Y-%m-%dT%H:%MZ")


@functools.lru_cache(maxsize=4096)
def tick_of(run_key: str) -> datetime | None:
    """The tick a schedule run key names, or None for another run key (``manual:…``).

    Cached: the co-firing jobs of a tick share its run key, and every claim
    and record of each asks again.
    """
    try:
        return datetime.strptime(run_key, "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=UTC)
    except ValueError:
        return None


def local_to_instant(wall: datetime, zone: ZoneInfo) -> datetime:
    """The instant a wall-clock time fires at, under the DST rule of this module.

    ``fold=0`` gives exactly that rule: a repeated time resolves to its first
    occurrence, and a skipped one is read with the offset before the gap.
    """
    local = wall.replace(tzinfo=zone, fold=0)
    offset = local.utcoffset()
    assert offset is not None  # a ZoneInfo always knows its offset
    return (wall.replace(tzinfo=None) - offset).replace(tzinfo=UTC)


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


@functools.lru_cache(maxsize=4096)
def _parse_cached(text: str, zone: ZoneInfo) -> CronSchedule:
    return CronSchedule._parse(text, zone)


def _parse_field(text: str, spec: _Field) -> tuple[int, ...]:
    values: set[int] = set()
    for item in text.split(","):
        values.update(_parse_item(item, spec))
    return tuple(sorted(values))


def _parse_item(item: str, spec: _Field) -> range:
    if not item:
        raise ValueError(f"{spec.name}: empty list item")
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


def _next_in(values: Sequence[int], at_least: int) -> int | None:
    index = bisect_left(values, at_least)
    return values[index] if index < len(values) else None


@dataclass(frozen=True, eq=False)
class CronSchedule:
    """A cron(8) expression evaluated in one time zone.

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
    # Vixie's rule: a day field is "restricted" iff its text does not start with '*'.
    dom_restricted: bool
    dow_restricted: bool
    _day_cache: dict[tuple[int, int], tuple[int, ...]] = field(
        default_factory=dict, repr=False, compare=False
    )

    def __repr__(self) -> str:
        return f"CronSchedule({self.expression!r}, zone={self.zone.key!r})"

    # Equal by definition, the expression as written and the zone, so that a
    # reload tells an unchanged job from a changed one (the parsed fields
    # follow from these two; the day cache is not part of the value).
    def __eq__(self, other: object) -> bool:
        if not isinstance(other, CronSchedule):
            return NotImplemented
        return (self.expression, self.zone.key) == (other.expression, other.zone.key)

    def __hash__(self) -> int:
        return hash((self.expression, self.zone.key))

    @classmethod
    def parse(cls, expression: str, zone: ZoneInfo) -> CronSchedule:
        """Read an expression; raise ``ValueError`` naming the faulty field.

        One object per (expression, zone): 10,000 jobs on one cron share it
        (a schedule is immutable; its day cache serves every job alike).
        """
        return _parse_cached(" ".join(expression.split()), zone)

    @classmethod
    def _parse(cls, text: str, zone: ZoneInfo) -> CronSchedule:
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
        schedule = cls(
            expression=text,
            zone=zone,
            seconds=_parse_field(seconds, _SECONDS),
            minutes=_parse_field(minutes, _MINUTES),
            hours=_parse_field(hours, _HOURS),
            days_of_month=_parse_field(dom, _DOM),
            months=_parse_field(months, _MONTHS),
            days_of_week=tuple(sorted({d % 7 for d in _parse_field(dow, _DOW)})),
            dom_restricted=not dom.startswith("*"),
            dow_restricted=not dow.startswith("*"),
        )
        if schedule._next_wall(datetime(2000, 1, 1)) is None:
            raise ValueError(
                f"{text!r} never fires: no date matches its day-of-month, month and day-of-week"
            )
        return schedule

    def describe(self) -> str:
        phrase = self._phrase()
        body = f"cron {self.expression!r}" + (f": {phrase}" if phrase else "")
        return f"{body} ({self.zone.key})"

    def next_after(self, t: datetime) -> datetime | None:
        if t.tzinfo is None:
            raise ValueError("next_after needs an aware datetime")
        # Ticks are whole seconds, so "after t" and "after t rounded down" agree.
        now = t.astimezone(UTC).replace(microsecond=0, tzinfo=None)
        zone = self.zone
        wall = _wall(now, zone)
        # Within a few hours after a spring-forward, a skipped wall time (read
        # with the older, smaller offset) can still be in the future although
        # it lies before the current wall time: start the scan early enough.
        earlier = now + _offset_at(now - _LOOKBACK, zone)
        candidate = self._next_wall(min(wall, earlier))
        while candidate is not None:
            before, after = _offsets(candidate, zone)
            instant = candidate - before
            if instant > now:
                if before < after:
                    instant = self._first_after_gap(candidate, before, after, now, instant)
                return instant.replace(tzinfo=UTC)
            if before > after:
                # A repeated wall time whose first occurrence is past. If we are
                # already in the second occurrence no repeated time can qualify:
                # jump to the end of the overlap instead of walking through it.
                end = _transition(zone, candidate - before, candidate - after) + before
                candidate = self._next_wall(max(candidate, min(now + before, end - _SECOND)))
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
        gap_end = _transition(self.zone, skipped - after, skipped - before) + after
        real = self._next_wall(max(gap_end - _SECOND, now + after))
        if real is None:
            return instant
        real_before, real_after = _offsets(real, self.zone)
        if real_before != real_after:
            return instant
        real_instant = real - real_before
        return real_instant if now < real_instant < instant else instant

    def _next_wall(self, after: datetime) -> datetime | None:
        """The first matching wall-clock time strictly after ``after`` (naive).

        Searches field by field, carrying into the next larger unit when a
        field has no value left, so a call costs a handful of steps.
        """
        start = after.replace(microsecond=0) + _SECOND
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
        dow = set(self.days_of_week)
        either = self.dom_restricted and self.dow_restricted
        days = []
        for day in range(1, length + 1):
            dom_ok = day in dom
            dow_ok = (first_cron_weekday + day - 1) % 7 in dow
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
        if len(parts) == 5 and parts[2:] == ["*", "*", "*"]:
            minute, hour = parts[0], parts[1]
            if minute.isdigit() and hour.isdigit():
                return f"at {int(hour):02d}:{int(minute):02d} every day"
            if minute.isdigit() and hour == "*":
                return f"every hour at minute {int(minute)}"
            if minute == "*" and hour == "*":
                return "every minute"
            if minute.startswith("*/") and hour == "*":
                return f"every {minute[2:]} minutes"
        return None


@dataclass(frozen=True)
class AtSchedule:
    """One tick at a fixed instant (``at:`` in the config)."""

    at: datetime

    def __post_init__(self) -> None:
        if self.at.tzinfo is None:
            raise ValueError("at needs an aware datetime")
        object.__setattr__(self, "at", self.at.astimezone(UTC).replace(microsecond=0))

    def next_after(self, t: datetime) -> datetime | None:
        return self.at if self.at > t else None

    def describe(self) -> str:
        return f"once at {run_key_for(self.at)}"


@dataclass(frozen=True)
class OnceSchedule:
    """A run-once job (``once: true``): no ticks; it is attempted at start, identity INITIAL."""

    def next_after(self, t: datetime) -> datetime | None:
        return None

    def describe(self) -> str:
        return "once, at start (run-once)"


def _wall(instant: datetime, zone: ZoneInfo) -> datetime:
    """Naive UTC instant -> naive wall-clock time in ``zone``."""
    return instant + _offset_at(instant, zone)


def _offset_at(instant: datetime, zone: ZoneInfo) -> timedelta:
    """The UTC offset in force at a naive UTC instant."""
    offset = zone.utcoffset(zone.fromutc(instant.replace(tzinfo=zone)))
    assert offset is not None
    return offset


def _offsets(wall: datetime, zone: ZoneInfo) -> tuple[timedelta, timedelta]:
    """Offsets of a wall time read with fold=0 and fold=1.

    Equal for an ordinary time; larger-then-smaller for a repeated time;
    smaller-then-larger for a skipped one.
    """
    before = zone.utcoffset(wall)
    after = zone.utcoffset(wall.replace(fold=1))
    assert before is not None and after is not None
    return before, after


def _transition(zone: ZoneInfo, old: datetime, new: datetime) -> datetime:
    """The first naive UTC second in (old, new] already under the offset in force at ``new``.

    A bisection: zoneinfo does not expose its transition table.
    """
    target = _offset_at(new, zone)
    low, high = 0, int((new - old).total_seconds())
    while high - low > 1:
        middle = (low + high) // 2
        if _offset_at(old + timedelta(seconds=middle), zone) == target:
            high = middle
        else:
            low = middle
    return old + timedelta(seconds=high)
