"""APScheduler's part: one entry per distinct schedule, and the hand-on of its fires.

APScheduler keeps the timers; :class:`ScheduleTrigger` gives it our schedule
(cron(8) semantics, DST rule) and :class:`FireExecutor` hands each intended
fire time on, so the tick's run key never comes from the clock at run time.
A schedule's fire fans out to the jobs on it, each at its jittered fire time.
A tick is handed on ahead of it, by a lead that grows with the jobs on its
schedule (:func:`lead_for`, from ``CLAIM_AHEAD`` to ``CLAIM_AHEAD_MAX``): a
lease job's claim is sent then, so that the claims' round trips, and the
replica's work of handing on and claiming thousands of fires, are over by
the fire time (the lease guard holds each run until then, by the database
clock, and the lease counts from the fire time). APScheduler wakes
``CLAIM_AHEAD_MAX`` before every tick, and the hand-on waits out the rest of
the lead. An advisory job's fire waits for the fire time.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from apscheduler.executors.base import BaseExecutor
from apscheduler.schedulers.asyncio import AsyncIOScheduler
from apscheduler.triggers.base import BaseTrigger

from pgcrond import catchup
from pgcrond.config.models import Config, JobConfig
from pgcrond.core.jitter import fire_time
from pgcrond.core.keys import Identity
from pgcrond.core.schedule import OnceSchedule, Schedule, run_key_for, skip_reason
from pgcrond.core.wheel import wheel
from pgcrond.daemon.accounting import FireNow
from pgcrond.fire import Fire
from pgcrond.storage.leases import CLAIM_AHEAD_MAX

# The least lead of a tick: a claim's round trip on a loaded replica is
# 5-30 ms, so a tick's claims sent this early are answered by the tick.
CLAIM_AHEAD = timedelta(milliseconds=100)
# A tick's lead grows by this per job on its schedule: what handing on a fire
# and claiming it costs a loaded replica's loop, with room to spare (a
# 10,000-job tick: 1.6 s; its claims then all land before the tick).
LEAD_PER_JOB = timedelta(microseconds=150)


def lead_for(jobs: int, gap: timedelta | None) -> timedelta:
    """How long before a tick its ``jobs`` are handed on; ``gap``: to the schedule's next tick.

    Never more than half the gap: a per-second tick claimed before the one
    before it has run would find that one's forbid runs still going, and be
    claimed again at its time.
    """
    lead = min(CLAIM_AHEAD + jobs * LEAD_PER_JOB, CLAIM_AHEAD_MAX)
    return lead if gap is None else min(lead, max(gap / 2, CLAIM_AHEAD))


class ScheduleTrigger(BaseTrigger):  # type: ignore[misc]
    """An APScheduler trigger over our own schedule (cron(8) semantics, DST rule).

    Its times are the ticks less ``CLAIM_AHEAD_MAX`` (see the module docstring),
    those on a calendar's day included: such a tick is fired too, to be
    recorded SKIPPED/``calendar:<name>`` once for the cluster, never run.
    APScheduler's times never leave this module. APScheduler 3's crontab
    parser reads day-of-week 0 as Monday and ANDs the day fields, so it is
    never used.
    """

    def __init__(self, schedule: Schedule) -> None:
        self.schedule = schedule

    def get_next_fire_time(
        self, previous_fire_time: datetime | None, now: datetime
    ) -> datetime | None:
        after = now if previous_fire_time is None else previous_fire_time + CLAIM_AHEAD_MAX
        found = self.schedule.occasion_after(after)
        return None if found is None else found.tick - CLAIM_AHEAD_MAX

    def __str__(self) -> str:
        return self.schedule.describe()


class FireExecutor(BaseExecutor):  # type: ignore[misc]
    """Hands each intended fire time straight on to its schedule's jobs, on the loop."""

    def __init__(self, submit: Callable[[str, datetime], None]) -> None:
        super().__init__()
        self._submit = submit

    def _do_submit_job(self, job: Any, run_times: list[datetime]) -> None:
        for run_time in run_times:
            self._submit(job.id, run_time)
        # The run itself is tracked by the daemon, not by APScheduler's
        # instance count (which would otherwise refuse the next tick).
        self._run_job_success(job.id, [])


@dataclass(frozen=True, slots=True)
class _Fired:
    """One tick of a schedule, as each job on it is fired: made once per schedule."""

    tick: datetime  # in UTC
    run_key: str
    following: datetime | None  # the schedule's next tick: when this one is superseded
    lead: timedelta  # how long before the tick its lease jobs are claimed (at most)
    skip_reason: str | None  # calendar:<name> on a calendar's day: recorded SKIPPED, never run


def _tick(fired_at: datetime) -> datetime:
    """The tick (in UTC) of an APScheduler fire time (see :class:`ScheduleTrigger`)."""
    return (fired_at + CLAIM_AHEAD_MAX).astimezone(UTC)


def _no_op() -> None:
    """APScheduler needs a callable per job; the executor never calls it."""


class Scheduling:
    """The replica's APScheduler: started once, regrouped at each reload, shut at the drain."""

    def __init__(
        self,
        *,
        config: Callable[[], Config],
        fire: FireNow,
        stopping: asyncio.Event,
    ) -> None:
        """``fire``: hands a fire on (the daemon tracks it for the drain)."""
        self._config = config
        self._fire = fire
        self._stopping = stopping
        self._scheduler: AsyncIOScheduler | None = None
        # APScheduler job id (a schedule's repr) -> the codes of the jobs on it.
        self._groups: dict[str, list[str]] = {}
        # Each schedule's last tick handed on: a schedule removed and added
        # back by reloads within a tick's lead is fired by two APScheduler
        # entries, and its tick is handed on once.
        self._handed_on: dict[str, datetime] = {}
        # Each schedule's ticks that APScheduler fired and that wait out their
        # lead, oldest first: APScheduler's own next time is already past them.
        self._leading: dict[str, deque[datetime]] = {}

    def start(self) -> None:
        scheduler = AsyncIOScheduler(
            timezone=UTC,
            executors={"default": FireExecutor(self._on_fire_group)},
            job_defaults={"coalesce": False, "max_instances": 1, "misfire_grace_time": None},
        )
        self._scheduler = scheduler
        self.regroup(self._config().jobs.values())
        scheduler.start()

    def shutdown(self) -> None:
        if self._scheduler is not None:
            self._scheduler.shutdown(wait=False)

    def next_ticks(self) -> list[tuple[list[str], datetime | None]]:
        """Each schedule's jobs and next tick, for a scrape (on the render's thread).

        APScheduler's ``get_jobs`` copies its store under its own lock; a
        reload replaces ``_groups`` whole, so one reference is a consistent map.
        A schedule added by a reload after the copy shows from the next scrape.
        """
        scheduler, groups = self._scheduler, self._groups
        if scheduler is None:
            return []
        return [
            (groups.get(entry.id, []), self._next_tick(entry.id, entry.next_run_time))
            for entry in scheduler.get_jobs()
        ]

    def _next_tick(self, key: str, fired_at: datetime | None) -> datetime | None:
        leading = self._leading.get(key)
        if leading:
            with contextlib.suppress(IndexError):  # handed on meanwhile, by the loop
                return leading[0]
        return fired_at and _tick(fired_at)

    def regroup(self, started: Iterable[JobConfig]) -> None:
        """One APScheduler job per distinct schedule, fanning out to its jobs.

        APScheduler's cost is per job it holds (next fire times, its sorted
        store, events): 10,000 per-minute jobs on one cron are one entry, and
        their co-firing fires are handed on in one turn. Run-once jobs in
        ``started`` (new or changed ones) are attempted now; the lease decides.
        """
        scheduler = self._scheduler
        assert scheduler is not None
        groups: dict[str, list[str]] = {}
        schedules: dict[str, Schedule] = {}
        for job in self._config().jobs.values():
            if not isinstance(job.schedule, OnceSchedule):
                key = repr(job.schedule)
                groups.setdefault(key, []).append(job.code)
                schedules[key] = job.schedule
        for key in self._groups.keys() - groups.keys():
            with contextlib.suppress(Exception):
                scheduler.remove_job(key)
        for key in groups.keys() - self._groups.keys():
            scheduler.add_job(_no_op, trigger=ScheduleTrigger(schedules[key]), id=key, name=key)
        self._groups = groups
        self._handed_on = {key: tick for key, tick in self._handed_on.items() if key in groups}
        self._leading = {key: ticks for key, ticks in self._leading.items() if key in groups}
        for job in started:
            if isinstance(job.schedule, OnceSchedule):
                self._fire(Fire(job, datetime.now(UTC), Identity.initial(job.code)))

    def _on_fire_group(self, key: str, fired_at: datetime) -> None:
        codes = self._groups.get(key, ())
        if not codes:
            return
        # Once per schedule, not per job: the tick in UTC, its run key, when
        # it is superseded, and its lead.
        tick = _tick(fired_at)
        schedule = self._config().jobs[codes[0]].schedule
        upcoming = schedule.occasion_after(tick)
        following = None if upcoming is None else upcoming.tick
        if upcoming is not None and upcoming.skipped_by is not None:
            # A skipped tick supersedes none (late_ticks: coalesce): the next that runs does.
            following = schedule.next_after(tick)
        lead = lead_for(len(codes), None if upcoming is None else upcoming.tick - tick)
        fired = _Fired(tick, run_key_for(tick), following, lead, skip_reason(schedule, tick))
        delay = (tick - lead - datetime.now(UTC)).total_seconds()
        if delay > 0:
            self._leading.setdefault(key, deque()).append(tick)
            wheel().call_later(delay, functools.partial(self._hand_on, key, fired))
        else:
            self._hand_on(key, fired)

    def _hand_on(self, key: str, fired: _Fired) -> None:
        """Hand ``fired`` on to the jobs on its schedule as they are now (after any reload)."""
        leading = self._leading.get(key)
        if leading and leading[0] == fired.tick:
            leading.popleft()
        codes = self._groups.get(key, ())
        last = self._handed_on.get(key)
        if not codes or (last is not None and last >= fired.tick):
            return
        self._handed_on[key] = fired.tick
        for code in codes:
            self._on_fire(code, fired)

    def _on_fire(self, code: str, fired: _Fired) -> None:
        job = self._config().jobs.get(code)
        if job is None or self._stopping.is_set():
            return
        # jitter: APScheduler keeps firing at the ticks (one monotonic next
        # fire per job, even when the jitter exceeds the gap between ticks);
        # the fire is handed on at tick + its stable shift, the same instant
        # on every replica. Misfire and lateness count from that instant.
        at = fire_time(code, fired.tick, job.jitter)
        lease = job.guard == "lease"
        # A lease counts from the fire time: any lease job may be claimed ahead.
        ahead = fired.lead if lease else timedelta(0)
        # On the wheel even when due already: it hands a big tick's fires on a
        # share a loop turn, so a turn stays short and its claims share a statement.
        delay = (at - ahead - datetime.now(UTC)).total_seconds()
        wheel().call_later(delay, functools.partial(self._fire_at, code, fired, at))

    def _fire_at(self, code: str, fired: _Fired, at: datetime) -> None:
        """Fire ``fired``'s tick of ``code`` as due at ``at`` (its jittered fire time)."""
        job = self._config().jobs.get(code)
        if job is None or self._stopping.is_set():
            return  # removed by a reload while its shift ran, or stopping
        self._fire(
            Fire(
                job,
                at,
                Identity.schedule(code, fired.run_key),
                superseded_at=catchup.superseded_at(job, fired.following),
                skip_reason=fired.skip_reason,
            )
        )
