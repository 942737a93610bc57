"""The nemesis: real replicas, a real server, and a seeded schedule of faults.

Three ``pgcrond run`` replicas reach a PostgreSQL server that this module
started itself (``throwaway``), each through a fault proxy of its own (a
network fault of the cluster hits all three); their jobs
(tests/faults/ledger.py) write the ledger straight to the server. A seeded
schedule then, one fault at a time, with quiet gaps between:

* ``kill``: SIGKILL a replica, restart it a moment later;
* ``pause``: SIGSTOP a replica for longer than the lease, then SIGCONT;
* ``sql_pause`` / ``sql_cut``: SIGSTOP the replica inside an ``sql:`` job's
  transaction (of ``sql-stall``, lease 3 s, or of ``sql-slow``, the suite's
  default lease), or hold every byte of its own network (its proxy), past
  that lease: the tick must be taken over, once, by a live peer;
* ``pg_restart``: stop the server, start it again;
* ``cut``: close every proxied connection;
* ``partition``: hold every byte for 3-6 s, then deliver it all;
* ``blackhole``: drop every byte and refuse connections for 2-4 s;
* ``clock_skew``: restart a replica (SIGTERM) under the clock shim, its wall
  clock 2 s fast (the first time) or fast or slow (later), for 8-15 s, then
  restart it with the true clock;
* ``job_pause``: ``pgcrond pause`` one job (or every job, ``*``) for 3-6 s,
  mostly just after one of its attempts failed (a retry is pending) or while
  one runs, whose replica is then killed half of the time (its takeover is
  due while paused), then ``pgcrond resume``.

``kill`` and ``pause`` mostly hit a replica that is in the middle of a run.
Before most faults a detached request (``pgcrond trigger --detach``, in the
background, straight to the server) asks for a manual run of an entrypoint,
command or ``sql:`` job, so that it is taken and run during the fault.

The jobs are in-process entrypoints, one ``command:`` (a child process) and
``sql:`` jobs, whose effect is the ledger row their statements insert in the
transaction that records their SUCCESS.

The first faults are one of each kind, shuffled; then kinds are drawn at
random until the duration is over. Every fault is logged with its start and
end by the database clock. After the last one the cluster settles (every
tick of the window past its misfire grace, no row RUNNING), and
:func:`observe` returns the rows for :func:`tests.faults.checker.check`.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import random
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import psycopg
from psycopg.rows import dict_row

from pgcrond.testing import LocalServer, throwaway
from tests.faults import checker
from tests.faults.clockshift import build, shifted
from tests.faults.ledger import HISTORY_DDL, LEDGER_DDL
from tests.faults.proxy import Proxy
from tests.helpers.daemon_harness import PGCROND, ROOT, Replica, wait_until

SCHEMA = "faults"
TABLE = "leases"
LEASE = timedelta(seconds=2)
GRACE = timedelta(seconds=8)
LONG_SLEEP_S = 3.0
ENTRYPOINT = "tests.faults.ledger:record"
LEDGER_MODULE = "tests.faults.ledger"
SQL_RETRIES = {"retries": "5", "retry_delay": "300ms"}
# The longest chain of retries of a tick that started in the window (sql-flaky's
# 1.5-3, 3-6, 6-12 s): how much longer settling may wait for pending retries.
RETRIES_S = 25.0
KINDS = (
    "kill",
    "pause",
    "sql_pause",
    "sql_cut",
    "pg_restart",
    "cut",
    "partition",
    "blackhole",
    "clock_skew",
    "job_pause",
)
SKEW_MS = 2000
# The sql: jobs sql_pause and sql_cut hit, with their leases: a short one, and
# the suite's default.
STALLED_SQL = {"sql-stall": timedelta(seconds=3), "sql-slow": LEASE}
# What `pgcrond pause` targets ("*": every job): a job with retries, a long
# job (takeovers), an sql: job with retries.
PAUSED = ("flaky", "long", "sql-flaky", "*")
# What detached requests ask for: jobs that allow overlap (never skipped).
REQUESTED = ("tick-a", "long", "cmd", "sql-tick")
REQUEST_EVERY_FAULT = 0.7  # the chance of a request before each fault
# A request taken by a replica that died before its claim is taken again after
# pgcrond.daemon.requests.RETAKE_AFTER (1 min): settling waits that long for it.
REQUEST_SETTLE = timedelta(seconds=75)
Progress = Callable[[str], None]


@dataclass(frozen=True)
class Job:
    code: str
    every_s: int | None  # None: run-once
    forbid: bool = False
    sleep_s: float = 0.0
    extra: dict[str, str] = field(default_factory=dict)
    env: dict[str, str] = field(default_factory=dict)
    # The action: the ledger entrypoint in-process (default), as a child
    # process ("command"), or these statements before the ledger insert ("sql").
    action: str = "entrypoint"
    sql_before: tuple[str, ...] = ()
    # Its overlap policy's bound on running ticks (replace: 1, max_concurrent:
    # N), checked (checker: above_bound); the policy itself is in ``extra``.
    bound: int | None = None

    def spec(self) -> checker.JobSpec:
        return checker.JobSpec(
            self.code,
            self.every_s,
            GRACE,
            forbid=self.forbid,
            sql=self.action == "sql",
            bound=self.bound,
        )

    def yaml(self) -> str:
        lines = [f"  {self.code}:"]
        if self.every_s is None:
            lines.append("    once: true")
        else:
            seconds = "*" if self.every_s == 1 else f"*/{self.every_s}"
            lines.append(f'    cron: "{seconds} * * * * *"')
        if self.action == "sql":
            lines.append("    sql: |")
            for statement in (*self.sql_before, ledger_insert(self.code)):
                lines += [f"      {line}" for line in f"{statement};".splitlines()]
        elif self.action == "command":
            lines.append(f"    command: {json.dumps([sys.executable, '-m', LEDGER_MODULE])}")
        else:
            lines.append(f"    entrypoint: {ENTRYPOINT}")
        if self.forbid:
            lines.append("    concurrency: forbid")
        lines += [f"    {key}: {value}" for key, value in self.extra.items()]
        env = dict(self.env)
        if self.sleep_s:
            env["FAULT_SLEEP"] = str(self.sleep_s)
        if env:
            pairs = ", ".join(f'{key}: "{value}"' for key, value in env.items())
            lines.append(f"    env: {{{pairs}}}")
        return "\n".join(lines) + "\n"


JOBS = (
    # Short per-second jobs: every tick must run, exactly once.
    Job("tick-a", 1),
    Job("tick-b", 1),
    # A short forbid job: SKIPPED only while an earlier tick holds a live lease.
    Job("tick-forbid", 2, forbid=True),
    # Fails its first attempt; the retry goes through the lease, 3-6 s later
    # (longer than `pgcrond pause` takes: job_pause finds a retry pending).
    Job("flaky", 3, extra={"retries": "2", "retry_delay": "6s"}, env={"FAULT_FAIL_ATTEMPTS": "1"}),
    # Long jobs on a 2 s lease: they live on heartbeats.
    Job("long", 4, sleep_s=LONG_SLEEP_S),
    Job("long-forbid", 2, forbid=True, sleep_s=LONG_SLEEP_S),
    # Overlap policies held in the database across replicas: a 3 s job every
    # second, at most two at once; a 3 s job every 2 s, each tick stopping
    # the one before (its owner sees the mark at a heartbeat and stops it).
    Job("long-bounded", 1, sleep_s=LONG_SLEEP_S, extra={"max_concurrent": "2"}, bound=2),
    Job("long-replace", 2, sleep_s=LONG_SLEEP_S, extra={"concurrency": "replace"}, bound=1),
    Job("seed", None, sleep_s=1.0),
    # A child process: killed with its replica (PDEATHSIG), SIGTERMed when stopped.
    Job("cmd", 2, sleep_s=1.0, action="command"),
    # sql: jobs, exactly-once by their transaction. Retried: a fault that breaks
    # the transaction fails the attempt (its outcome unknown), and the retry
    # (same key) must commit the effect once.
    Job("sql-tick", 1, action="sql", extra=SQL_RETRIES),
    Job("sql-slow", 3, action="sql", extra=SQL_RETRIES, sql_before=("SELECT pg_sleep(0.4)",)),
    # No retries: a tick whose owner stalls (sql_pause, sql_cut) must be taken
    # over by a peer, never end FAIL.
    Job(
        "sql-stall",
        2,
        action="sql",
        extra={"lease": "3s", "heartbeat": "1s"},
        sql_before=("SELECT pg_sleep(0.4)",),
    ),
    Job(
        "sql-flaky",
        3,
        action="sql",
        extra={"retries": "4", "retry_delay": "3s"},
        # Division by zero on the first attempt: rolled back, retried.
        sql_before=("SELECT 1 / (CASE WHEN :attempt <= 1 THEN 0 ELSE 1 END)",),
    ),
)


def ledger_insert(code: str) -> str:
    """An sql: job's effect: its ledger row, in the transaction of its SUCCESS.

    The pid is its replica's, read from the lease row it holds locked (its
    owner ``host:pid``); ``local_at`` is the server's clock (no local one).
    """
    return (
        f"INSERT INTO {SCHEMA}.ledger (job, run_key, tick, idempotency_key, attempt,\n"
        "    fencing_token, pid, replica, phase, local_at)\n"
        f"SELECT '{code}', :run_key, :fire_time, :idempotency_key, :attempt, :fencing_token,\n"
        "    coalesce(substring(l.owner from '[0-9]+$')::integer, 0), coalesce(l.owner, ''),\n"
        "    'end', extract(epoch FROM clock_timestamp())\n"
        f"FROM (SELECT 1) one LEFT JOIN {SCHEMA}.{TABLE} l ON l.code = '{code}'\n"
        "    AND l.type = 'SCHEDULE' AND l.run_key = :run_key AND l.fencing_token = :fencing_token"
    )


def config_text(jobs: tuple[Job, ...] = JOBS) -> str:
    return (
        "database:\n"
        "  url: ${PGCROND_DATABASE_URL}\n"
        f"  schema: {SCHEMA}\n"
        f"  table: {TABLE}\n"
        "shutdown_grace: 3s\n"
        "defaults:\n"
        f"  lease: {int(LEASE.total_seconds())}s\n"
        "  heartbeat: 500ms\n"
        f"  misfire_grace: {int(GRACE.total_seconds())}s\n"
        # The checker counts a tick inside its window that did not run as lost.
        "  late_ticks: all\n"
        "  concurrency: allow\n"
        "jobs:\n" + "".join(job.yaml() for job in jobs)
    )


@dataclass
class FaultRecord:
    kind: str
    start: datetime  # database clock
    end: datetime
    replica: str = ""
    pids: list[int] = field(default_factory=list)
    detail: str = ""

    def fault(self) -> checker.Fault:
        return checker.Fault(
            self.kind, self.start, self.end, frozenset(self.pids), self.replica, self.detail
        )


@dataclass
class Spawn:
    replica: str
    pid: int
    skew_ms: int
    log: Path


@dataclass
class Observations:
    """Everything the checker needs, read after the cluster settled."""

    jobs: list[checker.JobSpec]
    ledger: list[checker.LedgerRow]
    leases: list[checker.LeaseRow]
    history: list[checker.LeaseVersion]
    faults: list[checker.Fault]
    window: checker.Window
    spawns: list[Spawn]
    workdir: Path
    requests: list[checker.Request] = field(default_factory=list)
    pauses: list[checker.Pause] = field(default_factory=list)
    crashes: list[checker.Crash] = field(default_factory=list)
    abandons: list[checker.Abandon] = field(default_factory=list)

    def check(self) -> checker.Report:
        return checker.check(
            self.jobs,
            self.ledger,
            self.leases,
            self.faults,
            self.window,
            self.history,
            requests=self.requests,
            pauses=self.pauses,
            crashes=self.crashes,
            abandons=self.abandons,
            replicas=frozenset(spawn.pid for spawn in self.spawns),
        )

    def logs_about(self, job: str, run_key: str, limit: int = 20) -> list[str]:
        """The replicas' log events about one tick, oldest first: to explain a violation."""
        found: list[tuple[str, str]] = []
        if not job or not run_key:  # a crash outside any fire: its detail says it all
            return []
        for spawn in self.spawns:
            with contextlib.suppress(FileNotFoundError):
                for line in spawn.log.read_text(errors="replace").splitlines():
                    if f'"{run_key}"' not in line or f'"{job}"' not in line:
                        continue
                    with contextlib.suppress(json.JSONDecodeError):
                        event = json.loads(line)
                        found.append(
                            (
                                str(event.get("timestamp", "")),
                                f"{spawn.replica}/{spawn.pid}: {line}",
                            )
                        )
        return [text for _, text in sorted(found)][:limit]


class Cluster:
    """The server, the proxy, the replicas and the fault log of one nemesis run."""

    def __init__(
        self,
        server: LocalServer,
        workdir: Path,
        seed: int,
        progress: Progress,
        package: Path | None = None,
    ):
        self.server = server
        # Where the replicas import pgcrond from: a snapshot (see snapshot()), or
        # this working tree.
        self.package = package
        self.workdir = workdir
        self.rng = random.Random(seed)
        self.progress = progress
        self.direct = server.dsn
        # A proxy per replica name, made at its first spawn.
        self.proxies: dict[str, Proxy] = {}
        self.config = workdir / "jobs.yaml"
        self.config.write_text(config_text())
        self.shim = build(workdir / "shim")
        self.replicas: dict[str, Replica] = {}
        self.spawns: list[Spawn] = []
        self.faults: list[FaultRecord] = []
        self.pauses: list[checker.Pause] = []
        # Detached requests whose `pgcrond trigger --detach` has not returned 0 yet.
        self.asking: list[tuple[str, str, subprocess.Popen[bytes]]] = []
        self.requested = 0
        self.began = time.monotonic()

    # -- set-up -----------------------------------------------------------------

    def prepare(self) -> None:
        env = self._base_env("migrate", self.direct)
        subprocess.run(
            [str(PGCROND), "migrate", "-c", str(self.config)],
            env=env,
            cwd=ROOT,
            check=True,
            capture_output=True,
            timeout=60,
        )
        with psycopg.connect(self.direct, autocommit=True) as conn:
            conn.execute(LEDGER_DDL.format(schema=SCHEMA))
            conn.execute(HISTORY_DDL.format(schema=SCHEMA, table=TABLE))

    def _base_env(self, name: str, dsn: str) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith("PGCROND_")}
        env.update(
            PGCROND_DATABASE_URL=dsn,
            LEDGER_DSN=self.direct,
            LEDGER_TABLE=f"{SCHEMA}.ledger",
            PYTHONPATH=f"{self.package}:{ROOT}" if self.package else str(ROOT),
            FAULT_REPLICA=name,
            # Jobs inherit only what they are given: the ledger job needs these.
            PGCROND_ENV_PASSTHROUGH="LEDGER_*,PYTHONPATH,FAULT_*",
        )
        return env

    def spawn(self, name: str, skew_ms: int = 0) -> Replica:
        proxy = self.proxies.get(name)
        if proxy is None:
            proxy = self.proxies[name] = Proxy.for_dsn(self.direct).start()
        env = self._base_env(name, proxy.dsn(self.direct))
        if skew_ms:
            env = shifted(env, self.shim, skew_ms)
        log = self.workdir / f"{name}.{len(self.spawns)}.log"
        replica = Replica(name, self.config, log, env).start()
        self.spawns.append(Spawn(name, replica.pid, skew_ms, log))
        self.replicas[name] = replica
        replica.wait_event("daemon_ready", timeout=60)
        return replica

    def start(self, count: int = 3) -> None:
        for n in range(count):
            self.spawn(f"replica-{n}")

    def close(self) -> None:
        for replica in self.replicas.values():
            replica.stop()
        for proxy in self.proxies.values():
            proxy.close()

    # -- operator commands ----------------------------------------------------------

    def _command(self, *args: str) -> list[str]:
        return [str(PGCROND), *args, "-c", str(self.config)]

    def _operator_env(self) -> dict[str, str]:
        """An operator's shell: straight to the server, never through the fault proxy."""
        return self._base_env("operator", self.direct)

    def operate(self, *args: str) -> None:
        """Run ``pgcrond ARGS`` to success, retried through a server restart."""

        def done() -> bool:
            finished = subprocess.run(
                self._command(*args),
                env=self._operator_env(),
                cwd=ROOT,
                capture_output=True,
                timeout=60,
                check=False,
            )
            return finished.returncode == 0

        wait_until(done, 60, f"pgcrond {' '.join(args)}")

    def request(self) -> None:
        """Ask for a detached run of a job, in the background: it is taken during the next fault."""
        self.requested += 1
        self._ask(self.rng.choice(REQUESTED), f"request:{self.requested}")

    def _ask(self, code: str, run_key: str) -> None:
        process = subprocess.Popen(
            self._command("trigger", code, "--detach", "--run-key", run_key),
            env=self._operator_env(),
            cwd=ROOT,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        self.asking.append((code, run_key, process))

    def collect_requests(self, *, wait: bool = False) -> None:
        """Reap the request commands; ask again for those that failed (the server was down)."""
        asking, self.asking = self.asking, []
        for code, run_key, process in asking:
            if wait:
                process.wait(60)
            if process.poll() is None:
                self.asking.append((code, run_key, process))
            elif process.returncode != 0:
                self._ask(code, run_key)

    # -- clocks -------------------------------------------------------------------

    def db_now(self) -> datetime:
        """The database clock (a direct connection), retried through a restart."""

        def read() -> datetime | None:
            with (
                contextlib.suppress(psycopg.OperationalError),
                psycopg.connect(self.direct, autocommit=True, connect_timeout=3) as conn,
            ):
                row = conn.execute("SELECT clock_timestamp()").fetchone()
                assert row is not None
                moment: datetime = row[0]
                return moment
            return None

        moment: datetime = wait_until(read, 30, "the database clock")
        return moment

    def elapsed(self) -> float:
        return time.monotonic() - self.began

    # -- faults ---------------------------------------------------------------------

    def inject(self, kind: str) -> FaultRecord:
        record: FaultRecord = getattr(self, f"_{kind}")()
        self.faults.append(record)
        took = (record.end - record.start).total_seconds()
        where = f" {record.replica}" if record.replica else ""
        self.progress(
            f"[{self.elapsed():6.1f}s] fault {len(self.faults)}: {kind}{where} "
            f"{took:.1f}s {record.detail}".rstrip()
        )
        return record

    def _victim(self) -> Replica:
        """Mostly a replica in the middle of a run (its takeover is the point), else any."""
        names = sorted(self.replicas)
        busy = self._running_owners()
        if busy and self.rng.random() < 0.7:
            pid = self.rng.choice(sorted(busy))
            names = [name for name in names if self.replicas[name].pid == pid] or names
        return self.replicas[self.rng.choice(names)]

    def _running_owners(self, codes: list[str] | None = None) -> set[int]:
        """The pids of the replicas holding a live lease (of ``codes``; None: of any job)."""
        with (
            contextlib.suppress(psycopg.OperationalError),
            psycopg.connect(self.direct, autocommit=True, connect_timeout=3) as conn,
        ):
            rows = conn.execute(
                f"SELECT owner FROM {SCHEMA}.{TABLE} WHERE status = 'RUNNING' "
                "AND expires_at > clock_timestamp() AND code NOT LIKE 'pgcrond:%%' "
                "AND (%s::text[] IS NULL OR code = ANY(%s::text[]))",
                (codes, codes),
            ).fetchall()
            return {pid for (owner,) in rows if (pid := checker.owner_pid(owner)) is not None}
        return set()

    def _kill(self) -> FaultRecord:
        return self._kill_replica(self._victim())

    def _kill_replica(self, victim: Replica) -> FaultRecord:
        pid = victim.pid
        start = self.db_now()
        victim.signal(signal.SIGKILL)
        victim.wait_exit(10)
        time.sleep(self.rng.uniform(0.5, 2.0))  # the replica's down time
        skew = next(s.skew_ms for s in reversed(self.spawns) if s.replica == victim.name)
        self.spawn(victim.name, skew)
        return FaultRecord("kill", start, self.db_now(), victim.name, [pid])

    def _pause(self) -> FaultRecord:
        victim = self._victim()
        hold = LEASE.total_seconds() + self.rng.uniform(1.0, 3.0)
        start = self.db_now()
        victim.signal(signal.SIGSTOP)
        time.sleep(hold)  # stopped past its lease
        victim.signal(signal.SIGCONT)
        return FaultRecord(
            "pause", start, self.db_now(), victim.name, [victim.pid], f"SIGSTOP {hold:.1f}s"
        )

    def _pg_restart(self) -> FaultRecord:
        down = self.rng.uniform(0.5, 2.0)
        start = self.db_now()
        self.server.stop()
        time.sleep(down)  # the server's down time
        self.server.start()
        return FaultRecord("pg_restart", start, self.db_now(), detail=f"down {down:.1f}s")

    def _cut(self) -> FaultRecord:
        start = self.db_now()
        closed = sum(proxy.cut() for proxy in self.proxies.values())
        return FaultRecord("cut", start, self.db_now(), detail=f"{closed} connections")

    def _partition(self) -> FaultRecord:
        return self._network("partition", "partition", self.rng.uniform(3.0, 6.0))

    def _blackhole(self) -> FaultRecord:
        return self._network("blackhole", "blackhole", self.rng.uniform(2.0, 4.0))

    def _network(self, kind: str, mode: str, seconds: float) -> FaultRecord:
        """``mode`` (a Proxy method) on every replica's network at once."""
        start = self.db_now()
        healed = [getattr(proxy, mode)(seconds) for proxy in self.proxies.values()]
        assert all(event.wait(seconds + 10) for event in healed), f"{kind} did not heal"
        return FaultRecord(kind, start, self.db_now(), detail=f"{seconds:.1f}s")

    def _sql_pause(self) -> FaultRecord:
        victim, code, hold, start = self._sql_holder()
        victim.signal(signal.SIGSTOP)
        time.sleep(hold)  # stopped mid-transaction, past the job's lease
        victim.signal(signal.SIGCONT)
        detail = f"SIGSTOP {hold:.1f}s in {code}"
        return FaultRecord("sql_pause", start, self.db_now(), victim.name, [victim.pid], detail)

    def _sql_cut(self) -> FaultRecord:
        victim, code, hold, start = self._sql_holder()
        healed = self.proxies[victim.name].partition(hold)
        assert healed.wait(hold + 10), "sql_cut did not heal"
        detail = f"its network held {hold:.1f}s in {code}"
        return FaultRecord("sql_cut", start, self.db_now(), victim.name, [victim.pid], detail)

    def _sql_holder(self) -> tuple[Replica, str, float, datetime]:
        """A replica inside an sql: job's transaction (the job's lease row is locked), the
        job, how long to hold it (past that job's lease) and now; any replica if none
        is found in a few seconds."""
        code = self.rng.choice(sorted(STALLED_SQL))
        hold = STALLED_SQL[code].total_seconds() + self.rng.uniform(1.0, 3.0)
        deadline = time.monotonic() + 6.0
        while time.monotonic() < deadline:
            with (
                contextlib.suppress(psycopg.OperationalError),
                psycopg.connect(self.direct, autocommit=True, connect_timeout=3) as conn,
            ):
                rows = conn.execute(
                    f"SELECT owner FROM {SCHEMA}.{TABLE} WHERE code = %s AND status = 'RUNNING' "
                    f"AND id NOT IN (SELECT id FROM {SCHEMA}.{TABLE} WHERE code = %s "
                    "AND status = 'RUNNING' FOR KEY SHARE SKIP LOCKED)",
                    (code, code),
                ).fetchall()
                for (owner,) in rows:
                    pid = checker.owner_pid(owner)
                    for replica in self.replicas.values():
                        if replica.pid == pid:
                            return replica, code, hold, self.db_now()
            time.sleep(0.02)
        return self._victim(), code, hold, self.db_now()

    def _clock_skew(self) -> FaultRecord:
        victim = self._victim()
        # The first skew is the fast one (it could run ticks early); then either.
        first = not any(f.kind == "clock_skew" for f in self.faults)
        skew = SKEW_MS if first else self.rng.choice((SKEW_MS, -SKEW_MS))
        hold = self.rng.uniform(8.0, 15.0)
        self._stop_gracefully(victim)
        start = self.db_now()
        skewed = self.spawn(victim.name, skew)
        time.sleep(hold)  # the skewed replica's time in the cluster
        self._stop_gracefully(skewed)
        end = self.db_now()
        self.spawn(victim.name)
        return FaultRecord(
            "clock_skew", start, end, victim.name, [skewed.pid], f"{skew:+d}ms for {hold:.1f}s"
        )

    def _job_pause(self) -> FaultRecord:
        target = self.rng.choice(PAUSED)
        codes = [job.code for job in JOBS] if target == checker.ALL_JOBS else [target]
        hold = self.rng.uniform(3.0, 6.0)
        # Mostly just after an attempt failed (its retry is due while paused), or
        # while one runs (its owner may die: the takeover is due while paused).
        self._await_row(
            codes, "status = 'FAIL' AND retry_at > clock_timestamp() + interval '1.5 s'", 4.0
        )
        begin = self.db_now()
        self.operate(*(("pause", "--all") if target == checker.ALL_JOBS else ("pause", target)))
        paused, lift_at = self.db_now(), time.monotonic() + hold
        detail = f"{target} for {hold:.1f}s"
        owners = self._running_owners(codes)
        if owners and self.rng.random() < 0.5:
            pid = self.rng.choice(sorted(owners))
            victim = next((r for r in self.replicas.values() if r.pid == pid), None)
            if victim is not None:
                self.faults.append(self._kill_replica(victim))
                detail += f", its run's owner {victim.name} killed"
        time.sleep(max(0.0, lift_at - time.monotonic()))
        lifting = self.db_now()
        self.operate(*(("resume", "--all") if target == checker.ALL_JOBS else ("resume", target)))
        lifted = self.db_now()
        self.pauses.append(checker.Pause(target, begin, paused, lifting, lifted))
        return FaultRecord("job_pause", begin, lifted, detail=detail)

    def _await_row(self, codes: list[str], condition: str, timeout: float) -> bool:
        """Wait (bounded) for a lease row of ``codes`` matching ``condition``, or one RUNNING."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            with (
                contextlib.suppress(psycopg.OperationalError),
                psycopg.connect(self.direct, autocommit=True, connect_timeout=3) as conn,
            ):
                row = conn.execute(
                    f"SELECT 1 FROM {SCHEMA}.{TABLE} WHERE code = ANY(%s) AND "
                    f"(({condition}) OR (status = 'RUNNING' AND expires_at > clock_timestamp()))",
                    (codes,),
                ).fetchone()
                if row is not None:
                    return True
            time.sleep(0.05)
        return False

    def _stop_gracefully(self, replica: Replica) -> None:
        replica.signal(signal.SIGTERM)
        try:
            replica.wait_exit(40)
        except subprocess.TimeoutExpired:
            replica.stop()

    # -- the schedule -----------------------------------------------------------------

    def schedule(self, duration: float) -> None:
        """One of each kind first (shuffled), then random kinds until ``duration``."""
        first = list(KINDS)
        self.rng.shuffle(first)
        began = time.monotonic()
        while first or time.monotonic() - began < duration:
            kind = first.pop() if first else self.rng.choice(KINDS)
            if self.rng.random() < REQUEST_EVERY_FAULT:
                self.request()
            self.inject(kind)
            self.collect_requests()
            time.sleep(self.rng.uniform(1.0, 3.0))  # a quiet gap between faults
        while self.asking:
            self.collect_requests(wait=True)

    def settle(self, window_end: datetime) -> None:
        """Wait until the window's ticks and the requests are done, each within its bound.

        The window's ticks: past their grace, no row RUNNING, no retry pending.
        The requests: each done, no row RUNNING. The bounds only stop the wait
        for what a defect left undone; settling ends as soon as nothing is left.
        """
        for proxy in self.proxies.values():
            proxy.heal()
        for replica in self.replicas.values():
            replica.signal(signal.SIGCONT)
        quiet_from = window_end + GRACE + timedelta(seconds=1)
        ticks_by = quiet_from + 2 * LEASE + timedelta(seconds=LONG_SLEEP_S + 5 + RETRIES_S)
        requests_by = self.db_now() + REQUEST_SETTLE
        last_key = _key(window_end)

        def open_rows(conn: psycopg.Connection[Any], which: str) -> int:
            """Rows of ``which`` ticks still RUNNING or with a retry pending."""
            row = conn.execute(
                f"SELECT count(*) FROM {SCHEMA}.{TABLE} "
                "WHERE (status = 'RUNNING' OR (status = 'FAIL' AND retry_at IS NOT NULL)) "
                f"AND code NOT LIKE 'pgcrond:%%' AND {which}",
                {"last_key": last_key},
            ).fetchone()
            assert row is not None
            return int(row[0])

        def settled() -> bool:
            now = self.db_now()
            if now < quiet_from:
                return False
            with psycopg.connect(self.direct, autocommit=True) as conn:
                ticks = now >= ticks_by or not open_rows(
                    conn, "(run_key IS NULL OR run_key <= %(last_key)s)"
                )
                undone = conn.execute(
                    f"SELECT count(*) FROM {SCHEMA}.{TABLE}_requests WHERE done_at IS NULL"
                ).fetchone()
                requests = now >= requests_by or (
                    undone is not None
                    and undone[0] == 0
                    and not open_rows(conn, "run_key LIKE 'request:%%'")
                )
            return ticks and requests

        bound = max(ticks_by, requests_by) - self.db_now()
        wait_until(settled, bound.total_seconds() + 30, "the cluster to settle")

    # -- observing ----------------------------------------------------------------------

    def observe(self, window: checker.Window) -> Observations:
        with psycopg.connect(self.direct, autocommit=True, row_factory=dict_row) as conn:
            ledger = conn.execute(f"SELECT * FROM {SCHEMA}.ledger ORDER BY id").fetchall()
            leases = conn.execute(
                f"SELECT * FROM {SCHEMA}.{TABLE} WHERE code NOT LIKE 'pgcrond:%' ORDER BY id"
            ).fetchall()
            history = conn.execute(f"SELECT * FROM {SCHEMA}.lease_history ORDER BY id").fetchall()
            requests = conn.execute(
                f"SELECT * FROM {SCHEMA}.{TABLE}_requests ORDER BY requested_at"
            ).fetchall()
        crashes = [
            crash
            for spawn in self.spawns
            for crash in checker.crashes_in_log(
                spawn.log.read_text(errors="replace") if spawn.log.exists() else "",
                spawn.replica,
                spawn.pid,
            )
        ]
        abandons = [
            abandon
            for spawn in self.spawns
            for abandon in checker.abandons_in_log(
                spawn.log.read_text(errors="replace") if spawn.log.exists() else "", spawn.pid
            )
        ]
        dump = {
            "window": [window.start.isoformat(), window.end.isoformat()],
            "faults": [asdict(f) for f in self.faults],
            "spawns": [asdict(s) for s in self.spawns],
            "ledger": ledger,
            "leases": leases,
            "history": history,
            "requests": requests,
            "pauses": [asdict(p) for p in self.pauses],
            "crashes": [asdict(c) for c in crashes],
            "abandons": [asdict(a) for a in abandons],
        }
        (self.workdir / "observations.json").write_text(json.dumps(dump, default=str, indent=1))
        return Observations(
            jobs=[job.spec() for job in JOBS],
            ledger=[
                checker.LedgerRow(
                    r["job"],
                    r["run_key"],
                    r["attempt"],
                    r["fencing_token"],
                    r["pid"],
                    r["phase"],
                    r["at"],
                    r["replica"],
                )
                for r in ledger
            ],
            leases=[
                checker.LeaseRow(
                    r["code"],
                    r["run_key"],
                    r["status"],
                    r["attempt"],
                    r["fencing_token"],
                    r["owner"],
                    r.get("reason"),
                    r.get("type", "SCHEDULE"),
                )
                for r in leases
            ],
            history=[_version(h) for h in history if h["row"].get("code") != "pgcrond:prune"],
            faults=[f.fault() for f in self.faults],
            window=window,
            spawns=list(self.spawns),
            workdir=self.workdir,
            requests=[
                checker.Request(r["code"], r["run_key"], r["requested_at"]) for r in requests
            ],
            pauses=list(self.pauses),
            crashes=crashes,
            abandons=abandons,
        )


def _version(history: dict[str, Any]) -> checker.LeaseVersion:
    row = history["row"]
    return checker.LeaseVersion(
        row["code"],
        row.get("run_key"),
        row["status"],
        int(row["fencing_token"]),
        row.get("owner", ""),
        row.get("reason"),
        history["at"],
        history["op"],
        _instant(row.get("expires_at")),
        history.get("stmt_at"),
    )


def _instant(value: str | None) -> datetime | None:
    """A timestamptz as to_jsonb wrote it."""
    return None if value is None else datetime.fromisoformat(value)


def _key(moment: datetime) -> str:
    return moment.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _whole_second(moment: datetime, *, up: bool) -> datetime:
    seconds = moment.timestamp()
    return datetime.fromtimestamp(math.ceil(seconds) if up else math.floor(seconds), UTC)


def snapshot(ref: str, workdir: Path) -> Path:
    """The ``pgcrond`` package as committed at ``ref``, unpacked under ``workdir``.

    Replicas import it instead of the working tree, so a run is not disturbed by
    edits in progress (and can test any commit). Returns the directory to put
    first on PYTHONPATH.
    """
    target = workdir / f"pgcrond-{ref.replace('/', '_')}"
    target.mkdir(parents=True, exist_ok=True)
    archive = subprocess.run(
        ["git", "-C", str(ROOT), "archive", ref, "pgcrond"], check=True, capture_output=True
    ).stdout
    subprocess.run(["tar", "-x", "-C", str(target)], input=archive, check=True)
    return target


@contextlib.contextmanager
def cluster(
    workdir: Path, seed: int, progress: Progress = print, ref: str | None = None
) -> Iterator[Cluster]:
    """A server of its own, the proxy and three started replicas; all removed afterwards."""
    package = snapshot(ref, workdir) if ref else None
    with throwaway(prefix="pgcrond-faults-") as server:
        running = Cluster(server, workdir, seed, progress, package)
        try:
            running.prepare()
            running.start()
            yield running
        finally:
            running.close()


def run(
    duration: float,
    seed: int,
    workdir: Path,
    progress: Progress = print,
    ref: str | None = None,
) -> Observations:
    """The whole nemesis: start, inject faults for ``duration`` s, settle, observe.

    ``ref``: run the replicas on the package as committed there (``HEAD``, a
    branch, a commit) instead of the working tree.
    """
    workdir.mkdir(parents=True, exist_ok=True)
    with cluster(workdir, seed, progress, ref) as running:
        progress(f"[{running.elapsed():6.1f}s] 3 replicas ready; seed {seed}, {duration:g}s")
        window_start = _whole_second(running.db_now(), up=True) + timedelta(seconds=1)
        wait_until(lambda: running.db_now() >= window_start, 5, "the window to open")
        running.schedule(duration)
        window_end = _whole_second(running.db_now(), up=False)
        progress(f"[{running.elapsed():6.1f}s] {len(running.faults)} faults; settling")
        running.settle(window_end)
        observations = running.observe(checker.Window(window_start, window_end))
        progress(
            f"[{running.elapsed():6.1f}s] observed {len(observations.ledger)} ledger rows, "
            f"{len(observations.requests)} requests, {len(observations.pauses)} pauses, "
            f"{len(observations.crashes)} crashes in the logs"
        )
        return observations
