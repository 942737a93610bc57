"""APScheduler's part: one entry per distinct schedule, and the hand-on of its ticks.

APScheduler keeps the timers; :class:`ScheduleTrigger` gives it our schedule
(cron(8) semantics, DST rule) and :class:`FireExecutor` hands each intended
fire time on, so the tick's run key never comes from the clock at run time.
A schedule's tick becomes its jobs' fires by the tick plan
(:mod:`pgcrond.tickplan`), handed on a wave at a time: APScheduler wakes
``CLAIM_AHEAD_MAX`` before every tick, and each wave waits on the wheel for
its hand-on (its fire time less the tick's lead for lease jobs).
"""

from __future__ import annotations

import contextlib
import functools
from collections import deque
from collections.abc import Callable, Iterable
from datetime import UTC, datetime
from typing import Any

from apscheduler.executors.base import BaseExecutor
from apscheduler.schedulers.asyncio import AsyncIOScheduler
from apscheduler.triggers.base import BaseTrigger

from pgcrond.config.models import Config, JobConfig
from pgcrond.core.keys import Identity
from pgcrond.core.schedule import OnceSchedule, Schedule, skip_reason
from pgcrond.core.wheel import wheel
from pgcrond.fire import Fire
from pgcrond.tickplan import CLAIM_AHEAD_MAX, Wave, plan_tick

# Hands a tick's fires on (the daemon claims them together).
FireTick = Callable[[list[Fire]], None]


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
        fire: FireTick,
        stopping: Callable[[], bool],
    ) -> None:
        """``fire``: hands a tick's fires on (the daemon tracks them for the drain)."""
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
                self._fire([Fire(job, datetime.now(UTC), Identity.initial(job.code))])

    def _on_fire_group(self, key: str, fired_at: datetime) -> None:
        codes = self._groups.get(key, ())
        last = self._handed_on.get(key)
        tick = _tick(fired_at)
        if not codes or (last is not None and last >= tick):
            return
        self._handed_on[key] = tick
        jobs = self._config().jobs
        schedule = jobs[codes[0]].schedule
        # The next tick that runs: one on a calendar's day supersedes none.
        following = schedule.next_after(tick)
        waves = plan_tick(
            (jobs[code] for code in codes), tick, following, skip_reason(schedule, tick)
        )
        leading = self._leading.setdefault(key, deque())
        leading.append(tick)
        now = datetime.now(UTC)
        for wave in waves:
            delay = (wave.hand_on - now).total_seconds()
            wheel().call_later(delay, functools.partial(self._hand_on, key, tick, wave))

    def _hand_on(self, key: str, tick: datetime, wave: Wave) -> None:
        """Hand ``wave`` on to the jobs on its schedule as they are now (after any reload)."""
        leading = self._leading.get(key)
        if leading and leading[0] <= tick:
            leading.popleft()
        if self._stopping():
            return
        jobs = self._config().jobs
        # A job removed by a reload during the lead is not fired; a changed one
        # is claimed as planned, and runs as the config in force defines it.
        fires = [fire for fire in wave.fires if fire.job.code in jobs]
        if fires:
            self._fire(fires)
