"""A job's schedule: ``cron:`` (with a ``CRON_TZ=`` prefix), ``once:`` or ``at:``."""

from __future__ import annotations

import re
from zoneinfo import ZoneInfo

from pgcrond.config.converters import zone_problem
from pgcrond.config.fields import JOB, SCHEDULE_KEYS
from pgcrond.config.models import DEFAULT_TIMEZONE
from pgcrond.config.reading import Reading
from pgcrond.config.yamlnodes import Section
from pgcrond.core.schedule import AtSchedule, CronSchedule, OnceSchedule, Schedule, local_to_instant

# cronie's and Vixie cron's per-line zone prefix: "CRON_TZ=Europe/Berlin 30 2 * * *".
_CRON_TZ = re.compile(r"^\s*(?:CRON_TZ|TZ)=(\S*)\s*(.*)$", re.DOTALL)


def read_schedule(
    reading: Reading, section: Section, zone: ZoneInfo | None, zone_is_own: bool
) -> tuple[Schedule | None, ZoneInfo | None]:
    """The job's schedule, and its zone (a ``CRON_TZ=`` prefix sets it)."""
    given = [k for k in SCHEDULE_KEYS if k in section.values]
    if len(given) != 1:
        reading.one_of(section, given, "schedule", "cron: '...', once: true or at: <ISO datetime>")
        return None, zone
    # With a bad time zone (reported already) the expression is still worth checking.
    if given == ["cron"]:
        expression = reading.read(section, "cron", JOB["cron"].convert)
        if expression is None:
            return None, zone
        prefix = _CRON_TZ.match(expression)
        if prefix is not None:
            name, expression = prefix.groups()
            problem = zone_problem(name) if name else "CRON_TZ= names no time zone"
            if problem is not None:
                reading.report(section, "cron", f"CRON_TZ: {problem}")
                return None, zone
            if zone_is_own and zone is not None and zone.key != name:
                reading.report(
                    section,
                    "cron",
                    f"CRON_TZ={name} disagrees with timezone: {zone.key}; keep one of them",
                )
                return None, zone
            zone = ZoneInfo(name)
        try:
            return CronSchedule.parse(expression, zone or DEFAULT_TIMEZONE), zone
        except ValueError as exc:
            reading.report(section, "cron", str(exc))
            return None, zone
    if given == ["once"]:
        once = reading.read(section, "once", JOB["once"].convert)
        if once is False:
            reading.report(section, "once", "once: false is no schedule; remove it or use cron:")
        return (OnceSchedule() if once else None), zone
    at = reading.read(section, "at", JOB["at"].convert)
    if at is None:
        return None, zone
    effective = zone or DEFAULT_TIMEZONE
    try:
        instant = local_to_instant(at, effective) if at.tzinfo is None else at
    except (OverflowError, ValueError):
        reading.report(section, "at", "is too close to the end of the calendar to be a tick")
        return None, zone
    return AtSchedule(instant), zone
