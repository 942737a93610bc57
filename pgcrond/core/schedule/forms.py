"""The schedule forms besides cron: one instant, run-once, intervals, and the wrappers.

A job's schedule is one base form (a cron expression or a list of them, an
interval, one instant, run-once), optionally inside :class:`Between` (no tick
outside a window) and :class:`Skipping` (no tick runs on a calendar's day).
Each answers the daemon's one question, "the next tick after t" (its
occasion, marked when a calendar skips it), so a form flows through the
daemon's timers unchanged.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from datetime import UTC, datetime, time, timedelta
from typing import Any
from zoneinfo import ZoneInfo

from pgcrond.core.durations import format_duration
from pgcrond.core.schedule.base import Occasion, Schedule, run_key_for, utc_seconds
from pgcrond.core.schedule.calendars import Calendar
from pgcrond.core.schedule.cron import DEFAULT_DST, CronSchedule, Dst
from pgcrond.core.schedule.zones import local_to_instant

_EPOCH = datetime(1970, 1, 1)
# "Before t" for an inclusive bound: next_after(t - this) may answer t itself.
_JUST_BEFORE = timedelta(microseconds=1)


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

    def occasion_after(self, t: datetime) -> Occasion | None:
        return Occasion(self.at, "at") if self.at > t else None

    def describe(self) -> str:
        return f"once at {run_key_for(self.at)}"

    def definition(self) -> dict[str, Any]:
        return {"at": self.at.isoformat()}


@dataclass(frozen=True)
class OnceSchedule:
    """A run-once job (``once: true``): no ticks; it is attempted at start, identity INITIAL."""

    def next_after(self, t: datetime) -> datetime | None:
        return None

    def occasion_after(self, t: datetime) -> Occasion | None:
        return None

    def describe(self) -> str:
        return "once, at start (run-once)"

    def definition(self) -> dict[str, Any]:
        return {"once": True}


@dataclass(frozen=True)
class EverySchedule:
    """``every:`` with ``phase:``: ticks at 1970-01-01T00:00:00Z + k × every + phase.

    UTC instants, not wall-clock time: no clock change moves a tick, and every
    replica derives the same ticks (and run keys) from the config alone.
    """

    every: int  # seconds, at least 1
    phase: int = 0  # seconds, 0 <= phase < every

    def __post_init__(self) -> None:
        if self.every < 1 or not 0 <= self.phase < self.every:
            raise ValueError("every needs every >= 1 s and 0 <= phase < every")

    def next_after(self, t: datetime) -> datetime | None:
        elapsed = int((utc_seconds(t) - _EPOCH).total_seconds())
        k = (elapsed - self.phase) // self.every + 1
        return (_EPOCH + timedelta(seconds=k * self.every + self.phase)).replace(tzinfo=UTC)

    def occasion_after(self, t: datetime) -> Occasion | None:
        tick = self.next_after(t)
        return None if tick is None else Occasion(tick, self._form())

    def _form(self) -> str:
        every = format_duration(timedelta(seconds=self.every))
        return f"every {every}" + (
            f" (phase {format_duration(timedelta(seconds=self.phase))})" if self.phase else ""
        )

    def describe(self) -> str:
        return f"{self._form()}, counted in UTC instants"

    def definition(self) -> dict[str, Any]:
        return {"every": self.every, "phase": self.phase}


@dataclass(frozen=True)
class AnyOf:
    """``cron:`` as a list: the union of its expressions' ticks; a tick due under two runs once."""

    members: tuple[CronSchedule, ...]

    def next_after(self, t: datetime) -> datetime | None:
        ticks = [tick for m in self.members if (tick := m.next_after(t)) is not None]
        return min(ticks, default=None)

    def occasion_after(self, t: datetime) -> Occasion | None:
        found = [o for m in self.members if (o := m.occasion_after(t)) is not None]
        if not found:
            return None
        tick = min(o.tick for o in found)
        due = [o for o in found if o.tick == tick]
        notes = [o.dst for o in due if o.dst]
        return Occasion(tick, " and ".join(o.form for o in due), notes[0] if notes else None)

    def describe(self) -> str:
        first = self.members[0]
        policy = "" if first.dst == DEFAULT_DST else f"; {first.dst}"
        expressions = ", ".join(repr(m.expression) for m in self.members)
        return f"cron any of {expressions} ({first.zone.key}{policy})"

    def definition(self) -> dict[str, Any]:
        found: dict[str, Any] = {"cron": [m.expression for m in self.members]}
        return {**self.members[0].definition(), **found}


@dataclass(frozen=True)
class Between:
    """No tick outside [start, end): ``between: {start, end}``; either bound may be open."""

    inner: Schedule
    start: datetime | None = None  # aware; included
    end: datetime | None = None  # aware; excluded

    def _from(self, t: datetime) -> datetime:
        start = self.start
        return t if start is None or t >= start else start - _JUST_BEFORE

    def _inside(self, tick: datetime | None) -> bool:
        return tick is not None and (self.end is None or tick < self.end)

    def next_after(self, t: datetime) -> datetime | None:
        tick = self.inner.next_after(self._from(t))
        return tick if self._inside(tick) else None

    def occasion_after(self, t: datetime) -> Occasion | None:
        found = self.inner.occasion_after(self._from(t))
        return found if found is not None and self._inside(found.tick) else None

    def describe(self) -> str:
        bounds = []
        if self.start is not None:
            bounds.append(f"from {run_key_for(self.start)}")
        if self.end is not None:
            bounds.append(f"until {run_key_for(self.end)} (excluded)")
        return f"{self.inner.describe()}, {' '.join(bounds)}"

    def definition(self) -> dict[str, Any]:
        bounds = {
            name: value.astimezone(UTC).isoformat()
            for name, value in (("start", self.start), ("end", self.end))
            if value is not None
        }
        return {**self.inner.definition(), "between": bounds}


@dataclass(frozen=True)
class Skipping:
    """No tick runs on a calendar's day (the day in ``zone``): ``skip_on: [holidays]``.

    :meth:`next_after` answers the ticks that run; :meth:`occasion_after` also
    answers those on a calendar's day, marked with the calendar: the daemon
    fires those too, and each is recorded SKIPPED/``calendar:<name>``
    (:func:`skip_reason`), never run.
    """

    inner: Schedule
    calendars: tuple[Calendar, ...]
    zone: ZoneInfo

    def calendar_of(self, tick: datetime) -> Calendar | None:
        """The first of the calendars that holds the tick's local day, or None."""
        day = tick.astimezone(self.zone).date()
        return next((c for c in self.calendars if c.holds(day)), None)

    def next_after(self, t: datetime) -> datetime | None:
        tick = self.inner.next_after(t)
        while tick is not None and self.calendar_of(tick) is not None:
            # Jump to the end of the skipped day: a per-second job on a
            # holiday is one step, not 86,400.
            tick = self.inner.next_after(max(tick, day_end(tick, self.zone)))
        return tick

    def occasion_after(self, t: datetime) -> Occasion | None:
        found = self.inner.occasion_after(t)
        if found is None:
            return None
        holding = self.calendar_of(found.tick)
        return found if holding is None else replace(found, skipped_by=holding.name)

    def describe(self) -> str:
        names = ", ".join(c.name for c in self.calendars)
        return f"{self.inner.describe()}, not on {names} days"

    def definition(self) -> dict[str, Any]:
        found = {c.name: c.definition() for c in self.calendars}
        return {**self.inner.definition(), "skip_on": found}


def day_end(tick: datetime, zone: ZoneInfo) -> datetime:
    """Just before the local midnight that ends the local day of ``tick``."""
    following = tick.astimezone(zone).date() + timedelta(days=1)
    return local_to_instant(datetime.combine(following, time()), zone) - _JUST_BEFORE


def window_of(schedule: Schedule) -> tuple[datetime | None, datetime | None]:
    """The ``between:`` window of a schedule, (None, None) when it has none."""
    while isinstance(schedule, Skipping | Between):
        if isinstance(schedule, Between):
            return schedule.start, schedule.end
        schedule = schedule.inner
    return None, None


def skip_reason(schedule: Schedule, tick: datetime) -> str | None:
    """Why a tick of ``schedule`` is not run: ``calendar:<name>`` on a calendar's day, else None."""
    calendar = schedule.calendar_of(tick) if isinstance(schedule, Skipping) else None
    return None if calendar is None else f"calendar:{calendar.name}"


def calendars_of(schedule: Schedule) -> tuple[Calendar, ...]:
    """The calendars whose days a schedule skips."""
    return schedule.calendars if isinstance(schedule, Skipping) else ()


def from_definition(found: dict[str, Any], zone: ZoneInfo) -> Schedule:
    """A schedule rebuilt from its :meth:`~Schedule.definition` and the job's zone."""
    schedule: Schedule
    if found.get("once"):
        return OnceSchedule()
    if "at" in found:
        return AtSchedule(datetime.fromisoformat(found["at"]))
    if "every" in found:
        schedule = EverySchedule(int(found["every"]), int(found.get("phase", 0)))
    else:
        dst = Dst(**found["dst"]) if "dst" in found else DEFAULT_DST
        expressions = found["cron"]
        if isinstance(expressions, str):
            schedule = CronSchedule.parse(expressions, zone, dst)
        else:
            schedule = AnyOf(tuple(CronSchedule.parse(e, zone, dst) for e in expressions))
    if "between" in found:
        bounds = {k: datetime.fromisoformat(v) for k, v in found["between"].items()}
        schedule = Between(schedule, bounds.get("start"), bounds.get("end"))
    if "skip_on" in found:
        calendars = tuple(Calendar.from_definition(n, d) for n, d in found["skip_on"].items())
        schedule = Skipping(schedule, calendars, zone)
    return schedule


def written(schedule: Schedule) -> str:
    """The schedule as written, for narrow tables: ``0 3 * * *``, with its zone if not UTC."""
    if isinstance(schedule, Skipping):
        return f"{written(schedule.inner)} except {','.join(c.name for c in schedule.calendars)}"
    if isinstance(schedule, Between):
        start, end = schedule.start, schedule.end
        bounds = (f" from {run_key_for(start)}" if start else "") + (
            f" until {run_key_for(end)}" if end else ""
        )
        return written(schedule.inner) + bounds
    crons = schedule.members if isinstance(schedule, AnyOf) else None
    if isinstance(schedule, CronSchedule):
        crons = (schedule,)
    if crons:
        zone = crons[0].zone.key
        return " | ".join(c.expression for c in crons) + ("" if zone == "UTC" else f" ({zone})")
    if isinstance(schedule, EverySchedule):
        return schedule._form()
    if isinstance(schedule, AtSchedule):
        return f"at {run_key_for(schedule.at)}"
    return "once"
