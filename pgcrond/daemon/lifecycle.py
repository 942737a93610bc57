"""``pgcrond run``: one replica. APScheduler fires, :mod:`pgcrond.fire` decides.

Every replica loads the same jobs and fires every tick at its intended fire
time; the tick's run key comes from the fire time APScheduler hands its
executor, never from the clock at run time, so every replica derives the same
identity. Between fires the replica sends no query: APScheduler keeps its jobs
in memory, and the only periodic work is a local liveness beat.

Signals: SIGTERM/SIGINT drain (no new fires; running jobs get
``shutdown_grace``, then the runner's stop sequence, then their leases are
released for a survivor); a second SIGINT skips the grace. SIGHUP reloads the
config; a bad one is rejected and the old jobs keep running.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import signal
import sys
import time
from collections.abc import Callable, Iterable, Sequence
from datetime import UTC, datetime, timedelta
from typing import Any

import structlog
from apscheduler.executors.base import BaseExecutor
from apscheduler.schedulers.asyncio import AsyncIOScheduler
from apscheduler.triggers.base import BaseTrigger

from pgcrond import catchup
from pgcrond.config.listen import parse_listen
from pgcrond.config.loader import load_config
from pgcrond.config.models import (
    Config,
    JobConfig,
    changed_fields,
    min_history_retention,
    prune_rules,
)
from pgcrond.core.jitter import fire_time
from pgcrond.core.keys import Identity
from pgcrond.core.redaction import redact
from pgcrond.core.replica import this_process
from pgcrond.core.schedule import OnceSchedule, Schedule, run_key_for, tick_of
from pgcrond.core.timing import MAX_STOP_GRACE
from pgcrond.daemon import interpreter, notify
from pgcrond.daemon.accounting import Accounting
from pgcrond.daemon.alerts import seed as seed_alerts
from pgcrond.daemon.hooks import FailureHooks
from pgcrond.daemon.http import HealthServer
from pgcrond.daemon.metrics import Metrics
from pgcrond.daemon.registry import Membership
from pgcrond.daemon.requests import Requests
from pgcrond.daemon.stall import StallProbe
from pgcrond.daemon.status_page import StatusPage
from pgcrond.daemon.watch import ConfigWatcher
from pgcrond.errors import ConfigError, DatabaseUnavailable, ExitCode, PgcrondError
from pgcrond.events import FanOut
from pgcrond.fire import FireOutcome, Firing
from pgcrond.guard import Guards
from pgcrond.guard.spread import Spread
from pgcrond.logs import configure
from pgcrond.run import box
from pgcrond.storage.claims import NotAcquired
from pgcrond.storage.db import Database
from pgcrond.storage.embedded import LocalServer, attach
from pgcrond.storage.history import abandon_stale, open_ticks, ping, prune
from pgcrond.storage.leases import LeaseStore
from pgcrond.storage.pooling import log_pooling
from pgcrond.storage.renames import apply_renames
from pgcrond.storage.requests import prune_requests
from pgcrond.storage.ticks import job_ticks

log = structlog.get_logger("pgcrond.daemon.lifecycle")

# The liveness beat: /healthz fails when the loop has not beaten for this long.
BEAT_INTERVAL_S = 1.0
STUCK_AFTER_S = 15.0
# Waiting for a run stopped at shutdown: the runner's stop sequence (for an
# in-process entrypoint: signal, stop grace, cancel, stop grace again) plus
# recording the release. Supervisors must allow shutdown_grace + this.
STOP_WAIT_S = 2 * MAX_STOP_GRACE.total_seconds() + 5.0
PRUNE_EVERY = timedelta(hours=1)
# How far back a starting replica looks for ticks left open (bounded by the
# query's LIMIT too): retries are followed past the misfire window.
RESUME_WITHIN = timedelta(hours=24)
# At shutdown, on_failure hooks still sending get this long.
HOOK_DRAIN_S = 3.0
# How long background tasks get to end once cancelled (psycopg's own cancel
# request is bounded by 5 s).
CLOSE_WAIT_S = 6.0
PRUNE_CODE = "pgcrond:prune"
# Fires handed on per loop turn when one schedule holds many jobs: a turn
# stays a few ms, and a chunk's claims still fill one statement.
FAN_OUT_CHUNK = 500
# Claims of a big fan-out waiting for their answer before the next chunk is
# handed on: two statements' worth, so one is answered while the next is out.
FAN_OUT_WINDOW = 2 * FAN_OUT_CHUNK


class ScheduleTrigger(BaseTrigger):  # type: ignore[misc]
    """An APScheduler trigger over our own schedule (cron(8) semantics, DST rule).

    APScheduler 3's crontab parser reads day-of-week 0 as Monday and ANDs the
    day fields, so it is never used.
    """

    def __init__(self, schedule: Schedule) -> None:
        self.schedule = schedule

    def get_next_fire_time(
        self, previous_fire_time: datetime | None, now: datetime
    ) -> datetime | None:
        return self.schedule.next_after(previous_fire_time or now)

    def __str__(self) -> str:
        return self.schedule.describe()


class FireExecutor(BaseExecutor):  # type: ignore[misc]
    """Hands each intended fire time straight to the daemon, on the loop."""

    def __init__(self, submit: Callable[[str, datetime], None]) -> None:
        super().__init__()
        self._submit = submit

    def _do_submit_job(self, job: Any, run_times: list[datetime]) -> None:
        for run_time in run_times:
            self._submit(job.id, run_time)
        # The run itself is tracked by the daemon, not by APScheduler's
        # instance count (which would otherwise refuse the next tick).
        self._run_job_success(job.id, [])


def _no_op() -> None:
    """APScheduler needs a callable per job; the executor never calls it."""


class Daemon:
    def __init__(
        self,
        config: Config,
        paths: Sequence[str],
        *,
        database_url: str | None = None,
        http_listen: str | None = None,
        replica: str | None = None,
    ) -> None:
        self.config = config
        self.paths = list(paths)
        self.database_url = database_url
        self.http_listen = config.http_listen if http_listen is None else http_listen
        # A name another live replica holds is refused at start, by the registry.
        named = this_process(replica)
        self.replica = named.name
        log.info("replica_named", replica=named.name, chosen_by=named.chosen_by)
        self._spread = Spread(self.replica, config.spread)
        self.metrics = Metrics()
        self.metrics.set_jobs(config.jobs, _alert_after(config))
        self._watcher = ConfigWatcher(self.paths)
        self.tasks: set[asyncio.Task[Any]] = set()
        self.fire_tasks: set[asyncio.Task[Any]] = set()
        self.stop_requested = asyncio.Event()
        self.stop_now = asyncio.Event()
        self._beat = time.monotonic()
        self._last_prune = -float("inf")
        self._server: LocalServer | None = None
        self._http: HealthServer | None = None
        self._scheduler: AsyncIOScheduler | None = None
        # APScheduler job id (a schedule's repr) -> the codes of the jobs on it.
        self._groups: dict[str, list[str]] = {}
        self._db: Database | None = None
        self._advisory_db: Database | None = None
        self._sql_db: Database | None = None
        self._firing: Firing | None = None
        self._hooks = FailureHooks(self.replica)
        self._store: LeaseStore | None = None
        self._accounting: Accounting | None = None
        self._membership: Membership | None = None
        self._started = False
        self._stall = StallProbe(lambda: bool(self.fire_tasks), self.metrics.loop_stall.set)

    # -- life cycle -----------------------------------------------------------

    async def run(self) -> int:
        loop = asyncio.get_running_loop()
        loop.add_signal_handler(signal.SIGTERM, self._on_stop_signal, "SIGTERM")
        loop.add_signal_handler(signal.SIGINT, self._on_stop_signal, "SIGINT")
        loop.add_signal_handler(signal.SIGHUP, self._spawn_reload)
        try:
            # Said once, before any job runs: where no cgroup can be made, limits
            # are rlimits per process.
            boxes = box.configure(self.config.cgroups)
            log.info("job_boxes", by=boxes.mode, reason=boxes.reason, limits=boxes.enforcement())
            if not await self._start():
                return 0
            # A changed file (or ConfigMap swap) reloads exactly as SIGHUP does.
            self._spawn(self._watcher.run(lambda: notify.reloading_while(self._reload())))
            interpreter.settle()
            notify.ready()
            notify.status(f"running {len(self.config.jobs)} jobs")
            log.info(
                "daemon_ready",
                replica=self.replica,
                jobs=len(self.config.jobs),
                http=self._http_address(),
            )
            await self.stop_requested.wait()
            await self._shutdown()
            # A forced stop is not a clean one: a supervisor or script can tell them apart.
            return ExitCode.INTERRUPTED if self.stop_now.is_set() else ExitCode.OK
        finally:
            await self._close()

    async def _start(self) -> bool:
        dsn = self._dsn()
        # The advisory pool is never prepared: its guard sends several
        # statements in one simple-protocol message.
        # Named so that operators find the replicas in pg_stat_activity.
        self._db = Database(
            dsn,
            min_size=1,
            max_size=4,
            application_name=f"pgcrond/{self.replica}",
            prepared=self.config.database.prepared_statements,
        )
        # One connection per running advisory-guarded job, held for the run.
        self._advisory_db = Database(
            dsn,
            min_size=0,
            max_size=_advisory_pool_size(self.config),
            application_name=f"pgcrond-advisory/{self.replica}",
        )
        # sql: jobs' transactions, each holding a connection while it runs:
        # never the connections the claims and heartbeats of other jobs need.
        self._sql_db = Database.for_sql_jobs(
            dsn,
            max_size=self.config.database.sql_connections,
            application_name=f"pgcrond-sql/{self.replica}",
        )
        await self._db.open()
        await self._advisory_db.open()
        await self._sql_db.open()
        store = LeaseStore(
            self._db,
            schema=self.config.database.schema,
            table=self.config.database.table,
            owner=self.replica,
            sql_db=self._sql_db,
        )
        self._store = store
        self._firing = Firing(
            guards=Guards(
                store,
                self._advisory_db,
                spread=self._spread,
                on_heartbeat_failure=self._count_heartbeat_failure,
            ).for_job,
            replica=self.replica,
        )
        accounting = self._accounting = Accounting(
            store=store,
            config=lambda: self.config,
            firing=self._firing,
            metrics=self.metrics,
            spawn=self._spawn,
            fire_now=self._spawn_fire,
            replica=self.replica,
        )
        self._firing.events = FanOut([self.metrics.events, accounting, self._hooks])
        self._start_beat()
        await self._start_http()
        if not await self._migrate(store):
            return False
        # Before anything fires: a name another live replica holds refuses the
        # start, and renamed jobs own their old codes' rows (run-once state too).
        self._membership = Membership(store, self.replica, self.config, self.metrics, self._spread)
        await self._membership.join()
        self._spawn(self._membership.run())
        await self._apply_renames(store, self.config)
        # One log line: is a pooler in front, in transaction mode? (in the background)
        # Then `trigger --detach` requests: LISTEN, or a slow poll behind one.
        requests = Requests(
            store=store,
            conninfo=dsn,
            config=lambda: self.config,
            firing=self._firing,
            tasks=self.fire_tasks,
            stopping=self.stop_requested,
            replica=self.replica,
        )
        self._spawn(requests.run(log_pooling(store.db)))
        await accounting.begin()
        self._start_scheduler()
        self._spawn(self._resume_open_ticks())
        # Ticks nobody ran while no replica was up: recorded, or caught up (once).
        self._spawn(accounting.start())
        # The alert gauges start from the table's truth (one query), not from zero.
        self._spawn(
            seed_alerts(
                self.metrics.alerts,
                # No miss is counted here: the window is empty.
                lambda codes: job_ticks(store, codes, misses_within=timedelta(0)),
                lambda: list(self.config.jobs),
                self.stop_requested,
            )
        )
        self._started = True
        return True

    def _dsn(self) -> str:
        database = self.config.database
        if not database.embedded and database.url is not None:
            # "" is libpq's own defaults: PGHOST, PGSERVICE, ... from the environment.
            log.info("database", url=redact(database.url) or "(libpq environment)")
            return database.url
        dsn, self._server = attach(database.state_dir)
        log.warning(
            "embedded_database",
            state_dir=str(database.state_dir),
            detail="single-node: this PostgreSQL lives on this machine only; replicas "
            "elsewhere cannot share it. Set database.url for a real cluster.",
        )
        return dsn

    async def _migrate(self, store: LeaseStore) -> bool:
        """Migrate, waiting out a database that is not up yet; False if stopped first."""
        delay = 0.5
        while not self.stop_requested.is_set():
            try:
                applied = await store.migrate()
            except DatabaseUnavailable as exc:
                log.warning(
                    "database_unavailable", operation="migrate", error=str(exc), retry_in_s=delay
                )
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self.stop_requested.wait(), delay)
                delay = min(delay * 2, 10.0)
                continue
            if applied:
                log.info("migrated", versions=applied)
            return True
        return False

    async def _apply_renames(self, store: LeaseStore, config: Config) -> None:
        renames = [(code, job.renamed_from) for code, job in config.jobs.items()]
        for moved in await apply_renames(store, renames):
            log.info(
                "job_renamed",
                job=moved.code,
                renamed_from=list(moved.old),
                ticks=moved.ticks,
                initial=moved.initial,
                paused=moved.paused,
            )

    def _start_scheduler(self) -> None:
        scheduler = AsyncIOScheduler(
            timezone=UTC,
            executors={"default": FireExecutor(self._on_fire_group)},
            job_defaults={"coalesce": False, "max_instances": 1, "misfire_grace_time": None},
        )
        self._scheduler = scheduler
        self._regroup(self.config.jobs.values())
        scheduler.start()
        self.metrics.next_fires.follow(self._next_ticks)

    def _next_ticks(self) -> list[tuple[list[str], datetime | None]]:
        """Each schedule's jobs and next tick, for a scrape (on the render's thread).

        APScheduler's ``get_jobs`` copies its store under its own lock; a
        reload replaces ``_groups`` whole, so one reference is a consistent map.
        A schedule added by a reload after the copy shows from the next scrape.
        """
        scheduler, groups = self._scheduler, self._groups
        if scheduler is None:
            return []
        return [(groups.get(entry.id, []), entry.next_run_time) for entry in scheduler.get_jobs()]

    def _regroup(self, started: Iterable[JobConfig]) -> None:
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
        for job in self.config.jobs.values():
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
        for job in started:
            if isinstance(job.schedule, OnceSchedule):
                self._spawn_fire(job, datetime.now(UTC), Identity.initial(job.code))

    def _on_fire_group(self, key: str, tick: datetime) -> None:
        codes = self._groups.get(key, ())
        if not codes:
            return
        self._stall.wake()
        # Once per schedule, not per job: when this tick is superseded.
        following = self.config.jobs[codes[0]].schedule.next_after(tick)
        if len(codes) <= FAN_OUT_CHUNK:
            for code in codes:
                self._on_fire(code, tick, following)
            return
        self._spawn(self._fan_out(list(codes), tick, following))

    async def _fan_out(self, codes: list[str], tick: datetime, following: datetime | None) -> None:
        """Hand on a big group's fires a chunk per loop turn, as claims are answered.

        10,000 jobs on one schedule handed on in one callback held the loop
        for a second: no claim answer, heartbeat or stop deadline was seen
        meanwhile. A chunk's claims still share a statement (one turn); the
        next chunk waits until fewer than ``FAN_OUT_WINDOW`` claims are out.
        """
        for start in range(0, len(codes), FAN_OUT_CHUNK):
            if start:
                await asyncio.sleep(0)
                if self._store is not None:
                    # Claims go out as fast as they are answered, no faster:
                    # 10,000 fires at once held 10,000 tasks' memory and made
                    # the loop's turns (and its collections) long.
                    await self._store.claim_room(FAN_OUT_WINDOW)
            for code in codes[start : start + FAN_OUT_CHUNK]:
                self._on_fire(code, tick, following)

    def _on_fire(self, code: str, tick: datetime, following: datetime | None) -> None:
        job = self.config.jobs.get(code)
        if job is None or self.stop_requested.is_set():
            return
        tick = tick.astimezone(UTC)
        # jitter: APScheduler keeps firing at the ticks (one monotonic next
        # fire per job, even when the jitter exceeds the gap between ticks);
        # the fire is handed on at tick + its stable shift, the same instant
        # on every replica. Misfire and lateness count from that instant.
        at = fire_time(code, tick, job.jitter)
        delay = (at - datetime.now(UTC)).total_seconds()
        if delay <= 0:
            self._fire_at(code, tick, at, following)
        else:
            asyncio.get_running_loop().call_later(delay, self._fire_at, code, tick, at, following)

    def _fire_at(self, code: str, tick: datetime, at: datetime, following: datetime | None) -> None:
        """Fire ``tick`` of ``code`` as due at ``at`` (its jittered fire time)."""
        job = self.config.jobs.get(code)
        if job is None or self.stop_requested.is_set():
            return  # removed by a reload while its shift ran, or stopping
        self._spawn_fire(
            job,
            at,
            Identity.schedule(code, run_key_for(tick)),
            superseded_at=catchup.superseded_at(job, following),
        )

    def _spawn_fire(
        self,
        job: JobConfig,
        tick: datetime,
        identity: Identity,
        *,
        started: bool = False,
        superseded_at: datetime | None = None,
    ) -> None:
        assert self._firing is not None
        if self._firing.in_flight(identity):
            # This replica already follows the tick (say, the scheduler's fire
            # still retrying through an outage when start-up or catch-up finds
            # the same tick): Firing would join it; no task is needed for that.
            return
        # No task name: formatting one per fire cost more than the task.
        task = asyncio.create_task(
            self._fire(job, tick, identity, started=started, superseded_at=superseded_at)
        )
        self.fire_tasks.add(task)
        task.add_done_callback(self.fire_tasks.discard)

    async def _resume_open_ticks(self) -> None:
        """Follow the ticks other replicas started and nobody finished (one query, at start).

        A started tick is followed until it is done: a retry whose scheduler
        died, or a takeover of an owner that died with it, is then taken by
        this replica if nobody else does.
        """
        assert self._store is not None
        jobs = {
            code: job
            for code, job in self.config.jobs.items()
            if job.guard == "lease" and not isinstance(job.schedule, OnceSchedule)
        }
        if not jobs:
            return
        try:
            ticks = await open_ticks(self._store, list(jobs), within=RESUME_WITHIN)
        except PgcrondError as exc:
            log.warning("resume_failed", error=str(exc))
            return
        for open_tick in ticks:
            job, tick = jobs[open_tick.code], tick_of(open_tick.run_key)
            if tick is not None:
                tick = fire_time(job.code, tick, job.jitter)  # its window starts there
            if tick is None:
                continue  # a manual run: its caller follows it
            log.info(
                "tick_resumed", job=job.code, run_key=open_tick.run_key, status=open_tick.status
            )
            self._spawn_fire(
                job,
                tick,
                Identity.schedule(job.code, open_tick.run_key, open_tick.key_code),
                started=True,
            )

    async def _fire(
        self,
        job: JobConfig,
        tick: datetime,
        identity: Identity,
        *,
        started: bool,
        superseded_at: datetime | None,
    ) -> None:
        assert self._firing is not None
        # An unexpected error is Firing's to record and log (fire_crashed).
        # Its lines name the job and run key themselves: binding them as
        # context variables for every fire cost more than the lines.
        outcome: FireOutcome = await self._firing.fire(
            job, tick, identity, started=started, superseded_at=superseded_at
        )
        if identity.type == "INITIAL":
            # Says, on every replica and at every start, what became of the
            # run-once job here ("lose" once another replica has it done).
            log.info("initial_attempted", job=job.code, outcome=outcome)
        if outcome in ("success", "fail", "timeout"):
            self._maybe_prune()

    # -- retention --------------------------------------------------------------

    def _maybe_prune(self) -> None:
        """Prune history at most hourly, after a run: an idle replica sends no query."""
        now = time.monotonic()
        if now - self._last_prune < PRUNE_EVERY.total_seconds():
            return
        self._last_prune = now
        self._spawn(self._prune())

    async def _prune(self) -> None:
        assert self._store is not None
        store = self._store
        hour = datetime.now(UTC).replace(minute=0, second=0, microsecond=0)
        identity = Identity.schedule(PRUNE_CODE, run_key_for(hour))

        async def prune_history(_: object) -> tuple[int, int, int]:
            abandoned = await abandon_stale(store, min_history_retention(self.config.jobs))
            deleted = 0
            for rule in prune_rules(self.config):
                deleted += await prune(
                    store, rule.older_than, only=rule.only, excluding=rule.excluding
                )
            # Finished requests go with the history of the same age.
            requests = await prune_requests(store, self.config.history_retention)
            return abandoned, deleted, requests

        try:
            done = await store.run_exclusive(identity, prune_history, retry_after=None)
        except PgcrondError as exc:
            log.warning("prune_failed", error=str(exc))
            return
        if not isinstance(done, NotAcquired):
            log.info(
                "history_pruned",
                abandoned=done[0],
                deleted=done[1],
                requests=done[2],
                older_than_s=self.config.history_retention.total_seconds(),
            )

    # -- signals, reload, shutdown -----------------------------------------------

    def _on_stop_signal(self, name: str) -> None:
        if self.stop_requested.is_set():
            if name == "SIGINT":
                log.warning("shutdown_forced", signal=name)
                self.stop_now.set()
            return
        log.info(
            "shutdown_requested",
            signal=name,
            grace_s=self.config.shutdown_grace.total_seconds(),
            running=len(self._running()),
        )
        self.stop_requested.set()

    def _spawn_reload(self) -> None:
        self._spawn(notify.reloading_while(self._reload()))

    async def _reload(self) -> None:
        try:
            new = await asyncio.to_thread(load_config, self.paths, database_url=self.database_url)
        except ConfigError as exc:
            log.error(
                "config_reload_rejected",
                errors=[str(issue) for issue in exc.issues],
                detail="the previous configuration stays in force",
            )
            return
        if self.stop_requested.is_set() or self._scheduler is None:
            return
        if new.database != self.config.database:
            log.warning("config_reload_partial", detail="database settings change only on restart")
        if self._store is not None:
            # Before the new jobs fire: a job renamed by this reload owns its old rows.
            try:
                await self._apply_renames(self._store, new)
            except PgcrondError as exc:
                log.error(
                    "config_reload_rejected",
                    errors=[f"renamed_from: {exc}"],
                    detail="the previous configuration stays in force",
                )
                return
        # The reload's own time on the loop (its file reading is on a thread):
        # said in its log line, and measured at 10,000 jobs in bench.reload.
        began = time.perf_counter()
        old_jobs, self.config = self.config.jobs, new
        self._spread.delay = new.spread
        added = [code for code in new.jobs if code not in old_jobs]
        removed = [code for code in old_jobs if code not in new.jobs]
        changed = [
            code for code in new.jobs if code in old_jobs and new.jobs[code] != old_jobs[code]
        ]
        self._regroup([new.jobs[code] for code in added + changed])
        self.metrics.set_jobs(new.jobs, _alert_after(new))
        # How each changed: the names of its fields that differ (schedule, timeout, ...).
        changes = {code: changed_fields(old_jobs[code], new.jobs[code]) for code in changed}
        interpreter.settle()
        loop_s = time.perf_counter() - began
        if self._advisory_db is not None:
            await self._advisory_db.resize(_advisory_pool_size(new))
        if self._membership is not None:
            await self._membership.reloaded(new)
        log.info(
            "config_reloaded",
            added=added,
            removed=removed,
            changed=changed,
            changes=changes,
            loop_ms=round(loop_s * 1000, 1),
        )

    def _running(self) -> list[str]:
        if self._firing is None:
            return []
        return [f"{identity}#{attempt}" for identity, attempt in self._firing.running]

    async def _shutdown(self) -> None:
        notify.stopping()
        if self._scheduler is not None:
            self._scheduler.shutdown(wait=False)
        if self._firing is not None:
            self._firing.stopping.set()
        await self._drain(self.config.shutdown_grace.total_seconds())
        pending = {task for task in self.fire_tasks if not task.done()}
        if pending:
            log.warning("stopping_runs", runs=self._running())
            for cancellation in list(self._firing.running.values() if self._firing else []):
                cancellation.cancel("shutdown")
            _, pending = await asyncio.wait(pending, timeout=STOP_WAIT_S)
        for task in pending:
            task.cancel()
        # Failure hooks of the last runs: bounded, inside the supervisor's wait.
        await self._hooks.drain(HOOK_DRAIN_S)
        if self._membership is not None:
            await self._membership.leave()
        self._stall.stop()
        log.info(
            "daemon_stopped",
            replica=self.replica,
            loop_stall_max_s=round(self._stall.longest_s, 4),
        )

    async def _drain(self, grace: float) -> None:
        """Wait for running fires for up to ``grace`` seconds, or until a second SIGINT."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + grace
        forced = asyncio.create_task(self.stop_now.wait())
        try:
            while not self.stop_now.is_set():
                pending = {task for task in self.fire_tasks if not task.done()}
                remaining = deadline - loop.time()
                if not pending or remaining <= 0:
                    return
                await asyncio.wait(
                    pending | {forced}, timeout=remaining, return_when=asyncio.FIRST_COMPLETED
                )
        finally:
            forced.cancel()

    async def _close(self) -> None:
        tasks = list(self.tasks)
        for task in tasks:
            task.cancel()
        if tasks:
            # A task cancelled inside a statement makes psycopg send the server a
            # cancel request: let it finish before the process exits (one cut
            # off mid-way crashes PgBouncer 1.18: "bad client state").
            await asyncio.wait(tasks, timeout=CLOSE_WAIT_S)
        if self._http is not None:
            await self._http.stop()
        for db in (self._db, self._advisory_db, self._sql_db):
            if db is not None:
                await db.close()
        if self._server is not None:
            await asyncio.to_thread(self._server.stop)

    # -- health -------------------------------------------------------------------

    def _spawn(self, coro: Any) -> None:
        task = asyncio.create_task(coro)
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)

    def _start_beat(self) -> None:
        self._spawn(self._beat_loop())

    async def _beat_loop(self) -> None:
        watchdog = notify.watchdog_interval()
        last_ping = 0.0
        while True:
            self._beat = time.monotonic()
            if watchdog is not None and self._beat - last_ping >= watchdog:
                notify.watchdog()
                last_ping = self._beat
            await asyncio.sleep(min(BEAT_INTERVAL_S, watchdog or BEAT_INTERVAL_S))

    def _count_heartbeat_failure(self, identity: Identity) -> None:
        self.metrics.heartbeat_failures.labels(identity.code).inc()

    def healthy(self) -> bool:
        return time.monotonic() - self._beat < STUCK_AFTER_S

    async def ready(self) -> bool:
        if (
            not self._started
            or self._db is None
            or self._store is None
            or self.stop_requested.is_set()
        ):
            return False
        try:
            await ping(self._store)
        except PgcrondError:
            return False
        return True

    async def _start_http(self) -> None:
        if not self.http_listen:
            return
        self._http = HealthServer(
            self.http_listen,
            health=self.healthy,
            ready=self.ready,
            # Stale jobs are named in /readyz's body; they do not fail readiness.
            ready_detail=self.metrics.alerts.readiness_detail,
            registry=self.metrics.registry,
            # Read-only pages from the current config and the store, once started.
            status_page=StatusPage(
                config=lambda: self.config,
                store=lambda: self._store if self._started else None,
                replica=self.replica,
            ),
        )
        await self._http.start()

    def _http_address(self) -> str | None:
        if self._http is None:
            return None
        listen = parse_listen(self.http_listen)
        host = "0.0.0.0" if listen is None else listen.display_host  # noqa: S104
        return f"{host}:{self._http.port}"


def _alert_after(config: Config) -> dict[str, timedelta | None]:
    return {code: job.alert_after for code, job in config.jobs.items()}


def _advisory_pool_size(config: Config) -> int:
    """One connection per advisory-guarded job (each holds one while it runs), and a spare."""
    return max(2, 1 + sum(1 for job in config.jobs.values() if job.guard == "advisory"))


def run_command(args: argparse.Namespace) -> int:
    """``pgcrond run``: exit 2 on a bad config (all errors printed), 0 after a clean stop,
    130 after a second SIGINT cut the drain short."""
    configure(args.log_format, args.log_level, args.color)
    interpreter.tune()
    logging.getLogger("apscheduler").setLevel(logging.WARNING)
    try:
        config = load_config(args.config, database_url=args.database_url)
    except ConfigError as exc:
        print(str(exc), file=sys.stderr)
        print(
            "pgcrond did not start: fix these and run `pgcrond check` to verify.", file=sys.stderr
        )
        return ExitCode.ERROR
    try:
        # Inside: a PGCROND_REPLICA that cannot name a replica is refused here.
        daemon = Daemon(
            config,
            args.config,
            database_url=args.database_url,
            http_listen=args.http,
            replica=args.replica,
        )
        return asyncio.run(daemon.run())
    except PgcrondError as exc:
        log.error("daemon_failed", error=str(exc))
        return ExitCode.FAILED
