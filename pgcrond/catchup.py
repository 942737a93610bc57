"""Which expected ticks no replica ran, and what to do with each: pure, clock passed in.

A starting replica (or ``pgcrond catch-up``) knows, per lease-guarded job, the
newest tick that has a row. Every tick after it, up to now and at most
``window`` back, had no replica record it. Each becomes one of:

* ``due``: still inside its ``misfire_grace`` (counted from its fire time,
  moved by jitter): fired like any late fire, at that fire time (it runs if no
  replica has it; not before its fire time);
* ``run``: run late by the job's ``catch_up`` policy (``latest``: the newest
  one; ``all``: the newest ``max_catch_up``, oldest first), under its own run
  key and idempotency key;
* ``missed``: recorded MISSED, with why;
* ``skipped``: on a day of one of the job's calendars (``skip_on:``):
  recorded SKIPPED/``calendar:<name>`` at once, whatever its lateness, never
  run and never missed, as a replica's own claim of it would record it.

A job with no row at all has no record to continue: nothing before its
record is recorded MISSED or caught up, and a ``cron:`` job's record starts
with its first scheduled fire. An ``at:`` job's one instant, though, if it
came since this replica's process started (``started``: while the replica
was starting, before its scheduler ran) and is still inside its
``misfire_grace``, is ``due`` like any late fire — it is the job's only tick;
the claim decides, so an instant another replica ran is not run again.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Literal

from pgcrond.config.models import JobConfig
from pgcrond.core.jitter import fire_time
from pgcrond.core.schedule import AtSchedule, Occasion, Schedule, run_key_for

# At most this many ticks per job and scan (a per-second job down for a day
# would otherwise be 86,400 rows); older ones are counted, not recorded.
ROW_CAP = 1000

Action = Literal["due", "run", "missed", "skipped"]


@dataclass(frozen=True)
class Planned:
    """One expected tick with no row, and what becomes of it."""

    code: str
    tick: datetime
    action: Action
    # For missed: the row's reason and text; for skipped, its reason (calendar:<name>).
    reason: str | None = None
    why: str | None = None

    @property
    def run_key(self) -> str:
        return run_key_for(self.tick)


@dataclass(frozen=True)
class JobPlan:
    code: str
    last: datetime | None
    ticks: tuple[Planned, ...]
    # Expected ticks were left out: older than the window's start or over the cap.
    dropped: bool = False


def covered(job: JobConfig) -> bool:
    """Jobs whose every tick has a row: lease-guarded, with ticks (not run-once)."""
    return job.guard_remembers and not job.is_once


def superseded_at(job: JobConfig, following: datetime | None) -> datetime | None:
    """When a tick of ``job`` is superseded: its next tick's fire time, for late_ticks: coalesce.

    ``following`` is the tick after the one fired (the scheduler knows it once
    per schedule); None when the schedule ends, or the job runs each late tick.
    """
    if job.late_ticks != "coalesce" or following is None:
        return None
    return fire_time(job.code, following, job.jitter)


def _tick_after(schedule: Schedule, t: datetime) -> datetime | None:
    """The next tick after ``t``, one on a calendar's day included (it is accounted for too)."""
    found = schedule.occasion_after(t)
    return None if found is None else found.tick


def newest_ticks(
    schedule: Schedule, after: datetime, until: datetime, cap: int
) -> tuple[list[Occasion], bool]:
    """The newest ``cap`` ticks in (after, until], oldest first, and whether there were more.

    Those on a calendar's day are among them, marked. Walks forward from a
    start only as far back as ``cap`` ticks need (a guess from the gap
    between two ticks, doubled until it holds enough), so the work grows
    with ``cap``, not with the length of (after, until]: a per-second job
    after a week would otherwise cost 600,000 evaluations.
    """
    following = _tick_after(schedule, until)
    second = None if following is None else _tick_after(schedule, following)
    # No gap to guess from (the schedule ends): the whole span, however short.
    gap = None if following is None or second is None else second - following
    span = until - after if gap is None else gap * cap
    while True:
        start = max(after, until - span)
        found: list[Occasion] = []
        occasion = schedule.occasion_after(start)
        while occasion is not None and occasion.tick <= until:
            found.append(occasion)
            occasion = schedule.occasion_after(occasion.tick)
        if len(found) >= cap or start == after:
            break
        span *= 2
    kept = found[max(len(found) - cap, 0) :]
    if start == after or not kept:
        return kept, len(found) > len(kept)
    # Stopped short of ``after`` with enough ticks: any tick before the first kept is one more.
    earliest = _tick_after(schedule, after)
    return kept, len(found) > len(kept) or (earliest is not None and earliest < kept[0].tick)


def plan_job(
    job: JobConfig,
    last: datetime | None,
    now: datetime,
    *,
    window: timedelta,
    cap: int = ROW_CAP,
    outage: tuple[datetime, datetime] | None = None,
    started: datetime | None = None,
) -> JobPlan:
    """What becomes of each tick of ``job`` after ``last`` (its newest row) up to ``now``.

    ``now`` is the database's clock: a replica's own may run ahead, and
    would make ticks that are still to come look missed. ``started``: when
    the starting replica's process began, by the same clock (see above).
    """
    if not covered(job):
        return JobPlan(job.code, last, ())
    if last is None:
        if started is None or not isinstance(job.schedule, AtSchedule):
            return JobPlan(job.code, None, ())
        at = job.schedule.at
        fires = fire_time(job.code, at, job.jitter)
        owed = started <= fires <= now <= fires + job.misfire_grace
        return JobPlan(job.code, None, (Planned(job.code, at, "due"),) if owed else ())
    start = max(last, now - window)
    occasions, dropped = newest_ticks(job.schedule, start, now, cap)
    if last < start:
        # Ticks between the record's end and the window's start are not recorded.
        first = _tick_after(job.schedule, last)
        dropped = dropped or (first is not None and first <= start)
    skipped = [
        Planned(job.code, o.tick, "skipped", f"calendar:{o.skipped_by}")
        for o in occasions
        if o.skipped_by is not None
    ]
    # A tick's window runs from its fire time, moved by the job's jitter, as
    # the scheduler's own fire of it would (and its claim judges it so).
    late: list[datetime] = []
    due: list[datetime] = []
    for t in (o.tick for o in occasions if o.skipped_by is None):
        (late if fire_time(job.code, t, job.jitter) + job.misfire_grace < now else due).append(t)
    run: list[datetime] = []
    if not job.suspended and late:
        if job.catch_up == "latest":
            run = late[-1:]
        elif job.catch_up == "all" and job.max_catch_up > 0:
            run = late[-job.max_catch_up :]
    planned = [_missed(job, t, last, outage) for t in late if t not in run]
    planned += [Planned(job.code, t, "run") for t in run]
    planned += [Planned(job.code, t, "due") for t in due]
    planned += skipped
    planned.sort(key=lambda p: p.tick)
    return JobPlan(job.code, last, tuple(planned), dropped)


def plan(
    jobs: Iterable[JobConfig],
    last: dict[str, datetime | None],
    now: datetime,
    *,
    window: timedelta,
    cap: int = ROW_CAP,
    outage: tuple[datetime, datetime] | None = None,
    started: datetime | None = None,
) -> list[JobPlan]:
    """:func:`plan_job` for every covered job, in the order given."""
    return [
        plan_job(
            job, last.get(job.code), now, window=window, cap=cap, outage=outage, started=started
        )
        for job in jobs
        if covered(job)
    ]


def _missed(
    job: JobConfig, tick: datetime, last: datetime, outage: tuple[datetime, datetime] | None
) -> Planned:
    if outage is not None and outage[0] - job.misfire_grace <= tick <= outage[1]:
        since, until = (run_key_for(moment) for moment in outage)
        return Planned(
            job.code,
            tick,
            "missed",
            "database_unavailable",
            f"database unreachable from {since} to {until}",
        )
    policy = "suspended: true" if job.suspended else f"catch_up: {job.catch_up}"
    return Planned(
        job.code,
        tick,
        "missed",
        "no_replica",
        f"no replica was running (the record ended at {run_key_for(last)}; {policy})",
    )
