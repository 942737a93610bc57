"""When jobs fire: cron(8) expressions, intervals, one-off instants and run-once jobs.

Pure functions of their arguments: the caller passes the instant to search
from, and every answer is an aware UTC datetime in whole seconds, so that all
replicas compute the same tick (and therefore the same run key) for a fire.

The modules: :mod:`~pgcrond.core.schedule.base` (what a schedule answers, run
keys), :mod:`~pgcrond.core.schedule.cron` (cron(8), its Quartz day items and
the DST policies), :mod:`~pgcrond.core.schedule.forms` (``every:``, ``at:``,
``once:``, a list of crons, ``between:`` and ``skip_on:``),
:mod:`~pgcrond.core.schedule.calendars` (days off) and
:mod:`~pgcrond.core.schedule.zones` (wall-clock time and instants).
"""

from pgcrond.core.schedule.base import Occasion, Schedule, manual_run_key, run_key_for, tick_of
from pgcrond.core.schedule.calendars import Calendar
from pgcrond.core.schedule.cron import DEFAULT_DST, MACROS, CronSchedule, Dst
from pgcrond.core.schedule.forms import (
    AnyOf,
    AtSchedule,
    Between,
    EverySchedule,
    OnceSchedule,
    Skipping,
    calendars_of,
    day_end,
    from_definition,
    skip_reason,
    window_of,
    written,
)
from pgcrond.core.schedule.zones import local_to_instant

# Every class a job's schedule is made of (isinstance checks over the Protocol).
SCHEDULE_FORMS = (CronSchedule, AnyOf, EverySchedule, AtSchedule, OnceSchedule, Between, Skipping)

__all__ = [
    "DEFAULT_DST",
    "MACROS",
    "SCHEDULE_FORMS",
    "AnyOf",
    "AtSchedule",
    "Between",
    "Calendar",
    "CronSchedule",
    "Dst",
    "EverySchedule",
    "Occasion",
    "OnceSchedule",
    "Schedule",
    "Skipping",
    "calendars_of",
    "day_end",
    "from_definition",
    "local_to_instant",
    "manual_run_key",
    "run_key_for",
    "skip_reason",
    "tick_of",
    "window_of",
    "written",
]
