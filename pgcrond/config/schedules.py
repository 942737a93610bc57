"""A job's schedule: ``cron:`` (one or a list, a ``CRON_TZ=`` prefix), ``every:``, ``once:``
or ``at:``; and around it ``between:``, ``skip_on:`` and, for cron, ``dst:``."""

from __future__ import annotations

import difflib
import re
from collections.abc import Mapping
from datetime import date, datetime, time, timedelta
from typing import cast
from zoneinfo import ZoneInfo

import yaml

from pgcrond.config.converters import zone_problem
from pgcrond.config.fields import JOB, SCHEDULE_KEYS
from pgcrond.config.models import DEFAULT_TIMEZONE
from pgcrond.config.reading import INVALID, Reading
from pgcrond.config.yamlnodes import Section
from pgcrond.core.schedule import (
    DEFAULT_DST,
    AnyOf,
    AtSchedule,
    Between,
    Calendar,
    CronSchedule,
    Dst,
    EverySchedule,
    OnceSchedule,
    Schedule,
    Skipping,
    local_to_instant,
)

# cronie's and Vixie cron's per-line zone prefix: "CRON_TZ=Europe/Berlin 30 2 * * *".
_CRON_TZ = re.compile(r"^\s*(?:CRON_TZ|TZ)=(\S*)\s*(.*)$", re.DOTALL)
_ALLOWED = "cron: '...', every: 90s, once: true or at: <ISO datetime>"


def read_schedule(
    reading: Reading,
    section: Section,
    zone: ZoneInfo | None,
    zone_is_own: bool,
    merged: Mapping[str, object],
) -> tuple[Schedule | None, ZoneInfo | None]:
    """The job's schedule, and its zone (a ``CRON_TZ=`` prefix sets it).

    ``merged``: the job's default-able fields over ``defaults:`` (``dst``, ``skip_on``).
    """
    given = [k for k in SCHEDULE_KEYS if k in section.values]
    if len(given) != 1:
        reading.one_of(section, given, "schedule", _ALLOWED)
        return None, zone
    form = given[0]
    _refuse_misplaced(reading, section, form)
    dst = merged.get("dst")
    base: Schedule | None
    if form == "cron":
        # A wrong dst: (reported already) leaves the expressions still worth checking.
        policy = DEFAULT_DST if dst is None or dst is INVALID else cast(Dst, dst)
        base, zone = _cron(reading, section, zone, zone_is_own, policy)
        base = None if dst is INVALID else base
    elif form == "every":
        base = _every(reading, section)
    elif form == "once":
        once = reading.read(section, "once", JOB["once"].convert)
        if once is False:
            reading.report(section, "once", "once: false is no schedule; remove it or use cron:")
        return (OnceSchedule() if once else None), zone
    else:
        return _at(reading, section, zone), zone
    # Each part is checked even when another is wrong, so one run reports them all.
    effective = zone or DEFAULT_TIMEZONE
    between = reading.read(section, "between", JOB["between"].convert)
    if between is not None:
        window = _window(reading, section, between, effective)
        base = None if base is None or window is None else Between(base, *window)
    skip_on = merged.get("skip_on")
    if skip_on:
        calendars = (
            None
            if skip_on is INVALID
            else _calendars(reading, section, cast(tuple[str, ...], skip_on))
        )
        base = None if base is None or calendars is None else Skipping(base, calendars, effective)
    return base, zone


def _refuse_misplaced(reading: Reading, section: Section, form: str) -> None:
    """A job's own field that its schedule form has no use for is a mistake, not noise."""
    unused = {
        "phase": form != "every",
        "dst": form != "cron",
        "between": form in ("once", "at"),
        "skip_on": form in ("once", "at"),
    }
    reasons = {
        "phase": "only with every: (it shifts an interval's ticks)",
        "dst": "only with cron: (every: counts UTC instants, which no clock change moves)",
        "between": f"has no use with {form}: (it bounds recurring ticks)",
        "skip_on": f"has no use with {form}: (it skips recurring ticks)",
    }
    for name, misplaced in unused.items():
        if misplaced and name in section.values:
            reading.report(section, name, reasons[name])


def _cron(
    reading: Reading,
    section: Section,
    zone: ZoneInfo | None,
    zone_is_own: bool,
    dst: Dst,
) -> tuple[Schedule | None, ZoneInfo | None]:
    # With a bad time zone (reported already) the expression is still worth checking.
    expressions = reading.read(section, "cron", JOB["cron"].convert)
    if expressions is None:
        return None, zone
    located = section.values["cron"]
    listed = isinstance(located.node, yaml.SequenceNode)
    nodes = located.node.value if listed else [located.node]
    prefixed: str | None = None
    texts: list[tuple[str, int, str]] = []  # expression, line, how an issue names the entry
    for index, (written, node) in enumerate(zip(expressions, nodes, strict=True)):
        expression = written
        entry = f"entry {index}: " if listed else ""
        line = int(node.start_mark.line) + 1
        prefix = _CRON_TZ.match(expression)
        if prefix is not None:
            name, expression = prefix.groups()
            problem = zone_problem(name) if name else "CRON_TZ= names no time zone"
            if problem is None and zone_is_own and zone is not None and zone.key != name:
                problem = f"CRON_TZ={name} disagrees with timezone: {zone.key}; keep one of them"
            if problem is None and prefixed is not None and prefixed != name:
                problem = f"CRON_TZ={name} disagrees with CRON_TZ={prefixed}; a job has one zone"
            if problem is not None:
                reading.issue(located.file, line, section.job, "cron", f"{entry}CRON_TZ: {problem}")
                return None, zone
            prefixed, zone = name, ZoneInfo(name)
        texts.append((expression, line, entry))
    members = []
    for expression, line, entry in texts:
        try:
            members.append(CronSchedule.parse(expression, zone or DEFAULT_TIMEZONE, dst))
        except ValueError as exc:
            reading.issue(located.file, line, section.job, "cron", f"{entry}{exc}")
    if len(members) != len(texts):
        return None, zone
    return (AnyOf(tuple(members)) if listed else members[0]), zone


def _every(reading: Reading, section: Section) -> Schedule | None:
    every = reading.read(section, "every", JOB["every"].convert)
    phase = reading.read(section, "phase", JOB["phase"].convert) or timedelta(0)
    if every is None:
        return None
    if phase >= every:
        reading.report(section, "phase", f"must be shorter than every ({every.total_seconds():g}s)")
        return None
    return EverySchedule(int(every.total_seconds()), int(phase.total_seconds()))


def _at(reading: Reading, section: Section, zone: ZoneInfo | None) -> Schedule | None:
    at = reading.read(section, "at", JOB["at"].convert)
    if at is None:
        return None
    effective = zone or DEFAULT_TIMEZONE
    try:
        instant = local_to_instant(at, effective) if at.tzinfo is None else at
    except (OverflowError, ValueError):
        reading.report(section, "at", "is too close to the end of the calendar to be a tick")
        return None
    return AtSchedule(instant)


def _bound(value: datetime | date | None, zone: ZoneInfo, end: bool) -> datetime | None:
    """An instant of ``between:``: a date is a local day (an end runs through it)."""
    if value is None:
        return None
    if not isinstance(value, datetime):
        day = value + timedelta(days=1) if end else value
        return local_to_instant(datetime.combine(day, time()), zone)
    return local_to_instant(value, zone) if value.tzinfo is None else value


def _window(
    reading: Reading,
    section: Section,
    between: tuple[datetime | date | None, datetime | date | None],
    zone: ZoneInfo,
) -> tuple[datetime | None, datetime | None] | None:
    try:
        start, end = _bound(between[0], zone, False), _bound(between[1], zone, True)
    except (OverflowError, ValueError):
        reading.report(section, "between", "is too close to the end of the calendar")
        return None
    if start is not None and end is not None and end <= start:
        reading.report(section, "between", "end must come after start")
        return None
    return start, end


def _calendars(
    reading: Reading, section: Section, names: tuple[str, ...]
) -> tuple[Calendar, ...] | None:
    found = []
    for name in names:
        calendar = reading.calendars.get(name)
        if calendar is None:
            known = list(reading.calendars)
            close = difflib.get_close_matches(name, known, n=1)
            hint = (
                f"did you mean {close[0]!r}?"
                if close
                else (f"known: {', '.join(known)}" if known else "there is no calendars: section")
            )
            blamed = reading.blame(section, section.values, "skip_on")
            reading.report(blamed, "skip_on", f"no calendar {name!r}; {hint}", job=section.job)
            return None
        found.append(calendar)
    return tuple(found)
