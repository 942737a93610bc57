"""A record for every expected tick: MISSED rows, and catch-up, on one replica.

Three ways a tick ends without a run, and how each gets its row:

* a replica fired it too late: the claim statement itself records it
  MISSED/late (nothing to do here), or, when this replica's own clock already
  said so and no claim was sent, :meth:`Accounting.missed` records it;
* no replica could reach the database: the ticks this replica gave up on are
  kept until the database answers again, then recorded
  ``database_unavailable`` with the outage's start and end as seen here;
* no replica was running: found when a replica starts (or comes back after an
  outage), by :meth:`Accounting.scan`: one replica, under a lease row
  (``pgcrond:catch-up``), computes each job's expected ticks after its newest
  row (:mod:`pgcrond.catchup`), records the missed ones and runs what the
  job's ``catch_up`` policy asks for.

All of it happens at start or on the way out of an outage: an idle replica
sends no query.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import time
from collections.abc import AsyncIterator, Callable, Coroutine, Iterable
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any, TypeVar

import structlog

from pgcrond.catchup import JobPlan, Planned, plan, superseded_at
from pgcrond.config.models import Config, JobConfig
from pgcrond.core.jitter import fire_time
from pgcrond.core.keys import Identity
from pgcrond.core.overlap import FORBID
from pgcrond.core.schedule import run_key_for, tick_of
from pgcrond.core.timing import LeaseTiming
from pgcrond.daemon.metrics import Metrics
from pgcrond.decide import FireOutcome
from pgcrond.errors import PgcrondError
from pgcrond.events import FireEvents
from pgcrond.fire import Fire, Firing
from pgcrond.storage.claims import NotAcquired
from pgcrond.storage.jobstate import pause_of, paused
from pgcrond.storage.leases import LeaseStore
from pgcrond.storage.ticks import (
    Miss,
    database_now,
    last_ticks,
    record_missed,
    running_scan,
)

T = TypeVar("T")
log = structlog.get_logger("pgcrond.daemon.accounting")

SCAN_CODE = "pgcrond:catch-up"
# The scan's lease is short and heartbeated like a run's: a replica that dies
# mid-scan holds the others up for seconds, not for the default 15 min.
SCAN_TIMING = LeaseTiming.build(timedelta(seconds=10))
# Ticks kept while the database is unreachable, to record once it answers.
PENDING_CAP = 10_000
# Jobs planned per hop to a worker thread: a per-minute job after a day's gap
# is ~1,000 schedule evaluations (~20 ms), so a hop is about a second of work
# that the loop (heartbeats, the scan's own among them) never waits for, and
# shutdown waits for at most one.
PLAN_CHUNK = 50
# The loop-side walks over every job (logging, firing) yield this often.
YIELD_EVERY_S = 0.005


def scan_identity(now: datetime) -> Identity:
    """One scan row per start; scans are claimed under concurrency: forbid, so one runs at a time.

    A scan that starts after another finished finds nothing left to record
    (recording is idempotent), so it only costs its queries.
    """
    return Identity.schedule(SCAN_CODE, run_key_for(now))


async def find_plan(
    store: LeaseStore,
    config: Config,
    *,
    outage: tuple[datetime, datetime] | None = None,
    before: datetime | None = None,
    started: datetime | None = None,
) -> list[JobPlan]:
    """What becomes of every tick no replica recorded, per job (one query).

    Judged by the database's clock, read in the same statement: a replica
    whose own runs ahead would take ticks still to come for missed ones.
    Planned off the loop, a chunk of jobs at a time. ``before``: see
    :func:`~pgcrond.storage.ticks.last_ticks`; ``started``: see
    :func:`~pgcrond.catchup.plan_job`.
    """
    jobs = list(config.jobs.values())
    window = config.catch_up_window
    # A little past the window, so that a record ending just before it is found.
    ends = await last_ticks(store, [job.code for job in jobs], within=window * 2, before=before)
    plans: list[JobPlan] = []
    for start in range(0, len(jobs), PLAN_CHUNK):
        chunk = jobs[start : start + PLAN_CHUNK]
        plans += await asyncio.to_thread(
            plan, chunk, ends.last, ends.db_now, window=window, outage=outage, started=started
        )
    return plans


async def record_plan(store: LeaseStore, config: Config, plans: list[JobPlan]) -> list[Miss]:
    """Record the plan's missed and skipped ticks; those recorded now (by no one else first)."""
    misses = [
        Miss(
            p.code,
            p.tick,
            p.reason or "no_replica",
            p.why or "",
            # A tick on a calendar's day never runs: no window to wait out.
            timedelta(0) if p.action == "skipped" else config.jobs[p.code].misfire_grace,
        )
        for job_plan in plans
        for p in job_plan.ticks
        if p.action in ("missed", "skipped")
    ]
    recorded: list[Miss] = []
    for start in range(0, len(misses), 500):
        recorded += await record_missed(store, misses[start : start + 500])
    return recorded


async def run_catch_up(
    firing: Firing, jobs: dict[str, JobConfig], planned: list[Planned]
) -> list[tuple[Planned, FireOutcome]]:
    """Run one job's catch-up ticks in order, one at a time (never in parallel)."""
    done: list[tuple[Planned, FireOutcome]] = []
    for item in planned:
        job = jobs.get(item.code)
        if job is None or firing.stopping.is_set():
            break
        log.info("tick_catch_up", job=item.code, run_key=item.run_key, policy=job.catch_up)
        # started=True: no misfire bound; the claim still decides, once per tick.
        identity = Identity.schedule(item.code, item.run_key)
        outcome = await firing.fire(
            Fire(job, item.tick, identity, started=True, trigger="catch_up")
        )
        done.append((item, outcome))
    return done


# Fires ticks like the scheduler's wave would (the daemon tracks them for the drain).
FireNow = Callable[[list[Fire]], None]


@dataclass
class Accounting(FireEvents):
    """One replica's part in accounting for every tick; see the module docstring."""

    store: LeaseStore
    config: Callable[[], Config]
    firing: Firing
    metrics: Metrics
    spawn: Callable[[Coroutine[Any, Any, Any]], None]
    # Fires a tick like the scheduler would (tracked for the drain).
    fire_now: FireNow
    replica: str
    clock: Callable[[], datetime] = field(default=lambda: datetime.now(UTC))
    # How often a scan waiting for another replica's looks again (a read; no row).
    overlap_wait: timedelta = timedelta(seconds=1)
    _pending: list[Miss] = field(default_factory=list)
    _outage_since: datetime | None = None
    # The database's clock when this replica began, before its scheduler started.
    _began: datetime | None = None
    # When this replica's process began, by the database's clock (see begin()).
    _started: datetime | None = None

    # -- the fire's events (pgcrond/events.py) -----------------------------------------

    def missed(
        self, job: JobConfig, identity: Identity, tick: datetime, cause: str, recorded: bool
    ) -> None:
        # A coalesced tick is recorded by the claim that found its successor due;
        # a guard that remembers nothing has no row to record a miss in.
        if (
            recorded
            or cause == "coalesced"
            or identity.type != "SCHEDULE"
            or not self.firing.guards(job).remembers
        ):
            return
        # ``tick`` is the fire time (moved by jitter); the row is the tick's.
        fired, tick = tick, tick_of(identity.run_key or "") or tick
        if cause == "database_unavailable":
            if len(self._pending) < PENDING_CAP:
                self._pending.append(Miss(job.code, tick, cause, "", job.misfire_grace))
            return
        lateness = self.clock() - fired
        shifted = f" (its jittered fire time {run_key_for(fired)})" if fired != tick else ""
        why = (
            f"replica too late: {self.replica} fired it {_seconds(lateness)} after the "
            f"tick{shifted}, past misfire_grace {_seconds(job.misfire_grace)}"
        )
        # Recorded only if the database's clock agrees that the window is over.
        self.spawn(self._record([Miss(job.code, tick, "late", why, job.misfire_grace)]))

    def database(self, operation: str, ok: bool) -> None:
        if not ok:
            if self._outage_since is None:
                self._outage_since = self.clock()
            return
        if self._outage_since is None:
            return
        outage = (self._outage_since, self.clock())
        self._outage_since = None
        log.info(
            "database_back",
            unreachable_from=outage[0].isoformat(),
            unreachable_to=outage[1].isoformat(),
        )
        self.spawn(self._recover(outage))

    async def _record(self, misses: list[Miss]) -> None:
        try:
            recorded = await record_missed(self.store, misses)
        except PgcrondError as exc:
            log.warning("missed_not_recorded", ticks=len(misses), error=str(exc))
            return
        self._found(recorded)
        for miss in recorded:
            log.info(
                "tick_recorded_missed",
                job=miss.code,
                run_key=miss.identity.run_key,
                reason=miss.reason,
                why=miss.why,
            )

    async def _recover(self, outage: tuple[datetime, datetime]) -> None:
        since, until = (run_key_for(moment) for moment in outage)
        pending, self._pending = self._pending, []
        text = f"database unreachable from {since} to {until} (as seen by {self.replica})"
        await self._record([Miss(m.code, m.tick, m.reason, text, m.grace) for m in pending])
        # The claims that found the database back must not hide the outage's gap.
        await self.scan(outage=outage, before=outage[0])

    def _found(self, recorded: list[Miss]) -> None:
        """The MISSED rows this replica wrote: counted (pgcrond_missed_recorded_total)
        and told to the fire's subscribers (the job's ``on_missed``)."""
        jobs = self.config().jobs
        for miss in recorded:
            if miss.status != "MISSED":
                continue
            self.metrics.missed_recorded.labels(miss.code, miss.reason).inc()
            job = jobs.get(miss.code)
            if job is not None:
                self.firing.events.missed_found(
                    job, miss.identity, miss.tick, miss.reason, miss.why
                )

    # -- start -------------------------------------------------------------------------

    async def begin(self) -> None:
        """Before the scheduler starts: note the database's clock (one query).

        The scan at start looks only at rows claimed before it, so a tick that
        this replica or a peer claimed meanwhile cannot hide the gap. The
        process's own start, on the same clock, bounds what the scan fires of
        jobs with no row yet: a tick that passed while the replica started.
        """
        try:
            self._began = await database_now(self.store)
        except PgcrondError as exc:
            log.warning("start_time_not_read", error=str(exc))
            return
        self._started = self._began - timedelta(seconds=_process_age())

    async def start(self) -> None:
        """At start: show the pauses in force (one query), then scan for missed ticks."""
        config = self.config()
        try:
            pauses = await paused(self.store)
        except PgcrondError as exc:
            log.warning("pauses_not_read", error=str(exc))
            pauses = {}
        for job in config.jobs.values():
            held = job.suspended or pause_of(pauses, job.code) is not None
            self.metrics.paused.labels(job.code).set(1 if held else 0)
        await self.scan(before=self._began, started=self._started)

    # -- the scan ----------------------------------------------------------------------

    async def scan(
        self,
        *,
        outage: tuple[datetime, datetime] | None = None,
        before: datetime | None = None,
        started: datetime | None = None,
    ) -> None:
        """Record the ticks no replica ran and run the catch-up ones; one replica at a time.

        A scan that finds another replica's running waits for it to end (or
        for its lease to lapse, if that replica died) and tries again: the
        other looks before its own start, which may be later than this
        replica's, so it may not see the gap this one sees. Waiting reads the
        other's lease row; it writes nothing.
        """
        config = self.config()
        plans: list[JobPlan] = []

        async def account(_: object) -> list[Miss]:
            log.info("catch_up_scan_started", jobs=len(config.jobs))
            plans[:] = await find_plan(
                self.store, config, outage=outage, before=before, started=started
            )
            return await record_plan(self.store, config, plans)

        waited_for: str | None = None
        while True:
            done: list[Miss] | NotAcquired | None = None
            try:
                holder = await running_scan(self.store, SCAN_CODE)
                if holder is None:
                    done = await self.store.run_exclusive(
                        scan_identity(self.clock()),
                        account,
                        timing=SCAN_TIMING,
                        overlap=FORBID,
                        retry_after=None,
                    )
            except PgcrondError as exc:
                log.warning("catch_up_scan_failed", error=str(exc))
                return
            if isinstance(done, list):
                break
            wait = self.overlap_wait
            if holder is not None:
                # A lapse is seen at the first look after it: no sooner is useful.
                wait = min(wait, holder.remaining)
                if holder.owner != waited_for:
                    waited_for = holder.owner
                    log.info(
                        "catch_up_scan_waiting",
                        holder=holder.owner,
                        lease_left_s=round(holder.remaining.total_seconds(), 1),
                    )
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.firing.stopping.wait(), wait.total_seconds())
            if self.firing.stopping.is_set():
                return
        self._found(done)
        log.info("catch_up_scan_done", jobs=len(plans), missed_recorded=len(done))
        recorded = {(miss.code, miss.identity.run_key) for miss in done}
        async for job_plan in _paced(plans):
            counts = {a: sum(p.action == a for p in job_plan.ticks) for a in ("run", "due")}
            # Only what this scan recorded: a later scan finds the same gap already filled.
            for kind in ("missed", "skipped"):
                counts[kind] = sum(
                    p.action == kind and (job_plan.code, p.run_key) in recorded
                    for p in job_plan.ticks
                )
            if any(counts.values()) or job_plan.dropped:
                log.info(
                    "ticks_accounted",
                    job=job_plan.code,
                    record_ended=None if job_plan.last is None else job_plan.last.isoformat(),
                    missed=counts["missed"],
                    skipped=counts["skipped"],
                    catch_up=counts["run"],
                    due=counts["due"],
                    beyond_window=job_plan.dropped,
                )
        jobs = dict(config.jobs)
        due: list[Fire] = []
        async for job_plan in _paced(plans):
            job = jobs[job_plan.code]
            for item in job_plan.ticks:
                if item.action == "due":
                    # Several due ticks of a job coalesce like the scheduler's late fires.
                    due.append(
                        Fire(
                            job,
                            # Its jittered fire time, as the scheduler's fire: the
                            # claim is refused not_due before it, and its window
                            # counts from it.
                            fire_time(job.code, item.tick, job.jitter),
                            Identity.schedule(job.code, item.run_key),
                            superseded_at=superseded_at(job, job.schedule.next_after(item.tick)),
                        )
                    )
            catch_up = [p for p in job_plan.ticks if p.action == "run"]
            if catch_up:
                self.spawn(run_catch_up(self.firing, jobs, catch_up))
        if due:
            # Together, as the scheduler hands a tick on: claimed in one call
            # where this replica is preferred, deferred where another is.
            self.fire_now(due)


def _process_age() -> float:
    """Seconds since this process began (Linux's /proc), 0 where that cannot be read.

    Most of a start is spent importing, before any of pgcrond's code runs.
    """
    try:
        fields = Path("/proc/self/stat").read_text().rsplit(")", 1)[1].split()
        began = int(fields[19]) / os.sysconf("SC_CLK_TCK")  # starttime: ticks since boot
        uptime = float(Path("/proc/uptime").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 0.0
    return max(uptime - began, 0.0)


async def _paced(items: Iterable[T]) -> AsyncIterator[T]:
    """``items``, giving the loop a turn every few ms: a walk over 10,000 jobs must not hold it."""
    mark = time.monotonic()
    for item in items:
        yield item
        if time.monotonic() - mark > YIELD_EVERY_S:
            await asyncio.sleep(0)
            mark = time.monotonic()


def _seconds(delta: timedelta) -> str:
    return f"{delta.total_seconds():.1f}s"
