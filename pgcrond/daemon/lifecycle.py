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

import asyncio
import contextlib
import signal
import time
from collections.abc import Coroutine, Sequence
from datetime import timedelta
from typing import Any

import structlog

from pgcrond.config.listen import parse_listen
from pgcrond.config.loader import load_config
from pgcrond.config.models import Config, changed_fields
from pgcrond.core.keys import Identity
from pgcrond.core.redaction import redact
from pgcrond.core.replica import this_process
from pgcrond.core.timing import MAX_STOP_GRACE
from pgcrond.daemon import interpreter, notify, observers
from pgcrond.daemon.accounting import Accounting
from pgcrond.daemon.alerts import seed as seed_alerts
from pgcrond.daemon.hooks import Hooks
from pgcrond.daemon.http import HealthServer
from pgcrond.daemon.metrics import Metrics
from pgcrond.daemon.pruning import Pruning
from pgcrond.daemon.registry import Membership
from pgcrond.daemon.requests import Requests
from pgcrond.daemon.resume import resume_open_ticks
from pgcrond.daemon.scheduling import Scheduling
from pgcrond.daemon.stall import StallProbe
from pgcrond.daemon.status_page import StatusPage
from pgcrond.daemon.watch import ConfigWatcher
from pgcrond.decide import FireOutcome
from pgcrond.deferral import Deferral
from pgcrond.errors import ConfigError, DatabaseUnavailable, ExitCode, PgcrondError
from pgcrond.events import FanOut
from pgcrond.fire import Fire, Firing
from pgcrond.guard import Guards
from pgcrond.guard.spread import Spread
from pgcrond.run import box
from pgcrond.storage.db import Database
from pgcrond.storage.embedded import LocalServer, attach, state_home
from pgcrond.storage.history import ping
from pgcrond.storage.leases import LeaseStore
from pgcrond.storage.migrate import migrate
from pgcrond.storage.pooling import log_pooling
from pgcrond.storage.renames import apply_renames
from pgcrond.storage.ticks import job_ticks
from pgcrond.tickplan import CLAIM_AHEAD_MAX

log = structlog.get_logger("pgcrond.daemon.lifecycle")

# The liveness beat: /healthz fails when the loop has not beaten for this long.
BEAT_INTERVAL_S = 1.0
STUCK_AFTER_S = 15.0
# Waiting for a run stopped at shutdown: the runner's stop sequence (for an
# in-process entrypoint: signal, stop grace, cancel, stop grace again) plus
# recording the release. Supervisors must allow shutdown_grace + this.
STOP_WAIT_S = 2 * MAX_STOP_GRACE.total_seconds() + 5.0
# At shutdown, on_failure hooks still sending get this long.
HOOK_DRAIN_S = 3.0
# How long background tasks get to end once cancelled (psycopg's own cancel
# request is bounded by 5 s).
CLOSE_WAIT_S = 6.0


class Daemon:
    def __init__(
        self,
        config: Config,
        paths: Sequence[str],
        *,
        database_url: str | None = None,
        replica: str | None = None,
    ) -> None:
        self.config = config
        self.paths = list(paths)
        self.database_url = database_url
        # Bound once; a reload's config is judged against this listener (`run --http`'s).
        self.http_listen = config.http_listen
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
        self._big_ticks = interpreter.BigTicks()
        self.stop_requested = asyncio.Event()
        self.stop_now = asyncio.Event()
        self._beat = time.monotonic()
        self._server: LocalServer | None = None
        self._http: HealthServer | None = None
        self._scheduling: Scheduling | None = None
        self._pruning: Pruning | None = None
        self._db: Database | None = None
        self._advisory_db: Database | None = None
        self._sql_db: Database | None = None
        self._firing: Firing | None = None
        self._deferral: Deferral | None = None
        self._hooks = Hooks(self.replica)
        self._store: LeaseStore | None = None
        self._accounting: Accounting | None = None
        self._membership: Membership | None = None
        self._started = False
        self._stall = StallProbe(lambda: bool(self.fire_tasks), self.metrics.loop_stall.set)

    # -- life cycle -----------------------------------------------------------

    def new_loop(self) -> asyncio.AbstractEventLoop:
        """The event loop to :meth:`run` on: one whose turns the stall probe times."""
        return self._stall.new_loop()

    async def run(self) -> int:
        loop = asyncio.get_running_loop()
        loop.add_signal_handler(signal.SIGTERM, self._on_stop_signal, "SIGTERM")
        loop.add_signal_handler(signal.SIGINT, self._on_stop_signal, "SIGINT")
        loop.add_signal_handler(signal.SIGHUP, self._spawn_reload)
        interpreter.watch_children()
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
            claim_ahead=CLAIM_AHEAD_MAX,
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
            # Late-bound: a reload replaces self.config.
            jobs=lambda code: self.config.jobs.get(code),  # noqa: PLW0108
            spawn=self._spawn_run,
        )
        self._deferral = Deferral(
            self._firing, self._claim_tick, self._spawn, lambda: self._spread.delay
        )
        accounting = self._accounting = Accounting(
            store=store,
            config=lambda: self.config,
            firing=self._firing,
            metrics=self.metrics,
            spawn=self._spawn,
            fire_now=self._fire_tick,
            replica=self.replica,
        )
        self._firing.events = FanOut(
            [
                self.metrics.events,
                accounting,
                *observers.subscribers(store, self._hooks, self.metrics, self.replica),
            ]
        )
        self._pruning = Pruning(store, lambda: self.config, self._spawn)
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
        self._start_scheduler(store)
        # Looked at together, claimed where a claim could take them (deferral.py).
        self._spawn(resume_open_ticks(store, lambda: self.config, self._deferral.follow))
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
        home, blocked = state_home(database.state_dir)
        if blocked is not None:
            log.info(
                "embedded_state_moved",
                state_dir=str(database.state_dir),
                moved_to=str(home),
                why=f"PostgreSQL runs as 'nobody' under root, which cannot enter {blocked}",
            )
        dsn, self._server = attach(home)
        log.warning(
            "embedded_database",
            state_dir=str(home),
            detail="single-node: this PostgreSQL lives on this machine only; replicas "
            "elsewhere cannot share it. Set database.url for a real cluster.",
        )
        return dsn

    async def _migrate(self, store: LeaseStore) -> bool:
        """Migrate, waiting out a database that is not up yet; False if stopped first."""
        delay = 0.5
        while not self.stop_requested.is_set():
            try:
                applied = await migrate(store)
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
        once = {code for code, job in config.jobs.items() if job.is_once}
        for moved in await apply_renames(store, renames, once):
            log.info(
                "job_renamed",
                job=moved.code,
                renamed_from=list(moved.old),
                ticks=moved.ticks,
                initial=moved.initial,
                paused=moved.paused,
            )

    def _start_scheduler(self, store: LeaseStore) -> None:
        scheduling = self._scheduling = Scheduling(
            config=lambda: self.config,
            fire=self._fire_tick,
            stopping=self.stop_requested.is_set,
        )
        scheduling.start()
        self.metrics.next_fires.follow(scheduling.next_ticks)

    def _fire_tick(self, fires: list[Fire]) -> None:
        """A wave of a tick: deferred where another live replica is preferred, else claimed."""
        assert self._firing is not None and self._deferral is not None
        self._big_ticks.tick(len(fires))
        if fires:
            self._track(
                asyncio.create_task(self._firing.fire_tick(fires, defer=self._deferral.offer))
            )

    def _claim_tick(self, fires: list[Fire]) -> None:
        """Fires of a tick claimed together: one task, whose runs are tasks of their own."""
        assert self._firing is not None
        if fires:
            self._track(asyncio.create_task(self._firing.fire_tick(fires)))

    def _spawn_run(self, fire: Fire, carry: Coroutine[Any, Any, FireOutcome]) -> None:
        # No task name: formatting one per fire cost more than the task.
        self._track(asyncio.create_task(self._fire(fire, carry)))

    def _track(self, task: asyncio.Task[Any]) -> None:
        self.fire_tasks.add(task)
        task.add_done_callback(self._fire_done)

    def _fire_done(self, task: asyncio.Task[Any]) -> None:
        self.fire_tasks.discard(task)
        if self.fire_tasks:
            return
        # Not once the replica is stopping: the process is about to end anyway.
        if self._big_ticks.idle() and not self.stop_requested.is_set():
            # What its fires freed goes back to the system (RSS after a
            # 10,000-job tick: see interpreter.trim), off the loop.
            self._spawn(asyncio.to_thread(interpreter.trim))

    async def _fire(self, fire: Fire, carry: Coroutine[Any, Any, FireOutcome]) -> None:
        assert self._pruning is not None
        # An unexpected error is Firing's to record and log (fire_crashed).
        # Its lines name the job and run key themselves: binding them as
        # context variables for every fire cost more than the lines.
        outcome = await carry
        if fire.identity.type == "INITIAL":
            # Says, on every replica and at every start, what became of the
            # run-once job here ("lose" once another replica has it done).
            log.info("initial_attempted", job=fire.job.code, outcome=outcome)
        if outcome in ("success", "fail", "timeout"):
            self._pruning.maybe_prune()

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
        if self._http is not None:
            # A renewed certificate is taken up whether or not the config changed.
            self._http.reload_tls()
        try:
            new = await asyncio.to_thread(
                load_config, self.paths, database_url=self.database_url, listen=self.http_listen
            )
        except ConfigError as exc:
            log.error(
                "config_reload_rejected",
                errors=[str(issue) for issue in exc.issues],
                detail="the previous configuration stays in force",
            )
            return
        if self.stop_requested.is_set() or self._scheduling is None:
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
        self._scheduling.regroup([new.jobs[code] for code in added + changed])
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
        if self._scheduling is not None:
            self._scheduling.shutdown()
        if self._firing is not None:
            self._firing.stop()
        await self._drain(self.config.shutdown_grace.total_seconds())
        if self._firing is not None:
            # Grace over, or forced: a claim won ahead and not started is released.
            self._firing.halt()
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
        self._big_ticks.resume()
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
        listen = parse_listen(self.http_listen)
        host = None if listen is None else listen.host
        access = self.config.page_access
        if access.enabled and not access.served_on(host):
            # `run --http` may open a listener the config's check never saw.
            log.info(
                "status_page_withheld",
                listen=self.http_listen,
                detail="not loopback and no http.users, http.trusted_proxies or "
                "status_page: public; serving /healthz, /readyz and /metrics only",
            )
        self._http = HealthServer(
            self.http_listen,
            health=self.healthy,
            ready=self.ready,
            # Stale jobs are named in /readyz's body; they do not fail readiness.
            ready_detail=self.metrics.alerts.readiness_detail,
            registry=self.metrics.registry,
            busy=lambda: self._big_ticks.in_flight,
            # Pages from the current config and the store, once started.
            status_page=StatusPage(
                config=lambda: self.config,
                store=lambda: self._store if self._started else None,
                replica=self.replica,
                host=host,
            ),
            limits=self.config.http_limits,
            tls=self.config.http_tls,
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
    return max(2, 1 + sum(1 for job in config.jobs.values() if job.guard_holds_connection))
