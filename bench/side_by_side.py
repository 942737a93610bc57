"""pgcrond and procrastinate side by side: the same periodic jobs, one PostgreSQL, one table.

    .venv/bin/python -m bench.side_by_side [--replicas 3] [--jobs 50] [--seconds 60]
        [--every second|minute] [--fault kill-one] [--idle 15] [--write-docs]
    .venv/bin/python -m bench.side_by_side --scale [--write-docs]

Needs the ``bench`` extra (``.venv/bin/pip install -e '.[bench]'``: procrastinate).

One throwaway PostgreSQL; the scenario runs against pgcrond, then against
procrastinate: N replicas (``pgcrond run``, ``procrastinate worker``) of J
periodic jobs firing every second (or minute). Every run calls the same job
body (bench/ledger_job.py): one ledger row (job, tick, pid, clock_timestamp())
inserted through the job's own small pool into a database of its own, so the
scheduler's database counts only the scheduler's transactions.

Measured, the same way for both:

* duplicates and misses: the ledger against every (job, tick) due in the
  window (ticks from two seconds after the last replica is ready, for
  ``--seconds``); runs are given a tail to finish before the replicas stop;
* lateness p50/p99: ``inserted_at - tick`` of the window's rows (what a job's
  effect sees; it includes the job's own pool);
* statements per job-tick by name (``pg_stat_statements``, bench/statements.py):
  pgcrond's claims, finalizes, looks, heartbeats and the rest; all of a peer's;
* database transactions per job-tick: ``pg_stat_database`` of the scheduler's
  database from before the replicas start to after they exit (so every backend
  has flushed its counters; autovacuum of the scheduler's tables included),
  over the distinct job-ticks that ran; the ledger's own insert (one
  transaction per row, in its own database) is *not* in "own" and is added,
  counted as rows, in "incl. ledger";
* replica CPU (user + sys) and max RSS from each replica's rusage (``wait4``);
* PostgreSQL CPU: the whole server's process group (every backend, the
  postmaster's reaped children, background workers) before and after;
* runs per replica (how evenly a tick's work is spread);
* idle: statements the server logs (``log_statement = all``) while the same
  replicas hold jobs that never fire, and the replicas' CPU meanwhile
  (``/proc/PID/stat``, in 10 ms ticks).

``--profile FILE`` records py-spy (``.venv/bin/pip install py-spy``) over
pgcrond's replica 0 for the window, in py-spy's raw format;
``python -m bench.profile_shares FILE`` says where its samples went.

``--fault kill-one`` SIGKILLs, at the middle tick of the window, the replica
that inserted that tick's first ledger row, the moment it appears (so it dies
inside the tick's burst), and reports the misses and duplicates that follow.
pgcrond's survivors take the tick over once its lease expires, so the fault
run gives pgcrond ``--lease`` (10s unless set) and waits a lease past the window.

``--scale`` runs pgcrond alone at 100 / 1,000 / 10,000 per-minute jobs on 1 / 3
/ 6 replicas, one tick each (the jobs' second field is chosen so the tick
comes a few seconds after the replicas are ready): statements per tick,
lateness, RSS, and start-to-ready (spawn to the ``daemon_ready`` log event).

Progress goes to stderr; the table to stdout: aligned text on a terminal, one
JSON line per row otherwise. ``--write-docs`` rewrites this scenario's table
of docs/performance.md (``bench.docs``: the run's date, commit, machine, load
and command above the table).
"""

from __future__ import annotations

import argparse
import compileall
import contextlib
import functools
import json
import math
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import psycopg

from bench import ledger_job, statements
from bench.docs import header, load_note, write_docs
from pgcrond.testing import LocalServer, throwaway

ROOT = Path(__file__).resolve().parent.parent
BIN = Path(sys.executable).parent
CLOCK_TICK = os.sysconf("SC_CLK_TCK")
NEVER = "0 0 1 1 *"  # Jan 1st, midnight: holds the jobs without firing in the window
TAIL_S = 3.0  # after the window's last tick, for its runs to finish


def progress(line: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {line}", file=sys.stderr, flush=True)


# -- processes ----------------------------------------------------------------


@dataclass
class Replica:
    process: subprocess.Popen[bytes]
    log: Path
    spawned: float  # wall clock
    ready: float = 0.0  # wall clock, when the ready line was seen
    ready_cpu_s: float = 0.0  # CPU when the ready line was seen: the start's
    cpu_s: float = 0.0
    max_rss_mib: float = 0.0
    exit_status: int | None = None

    @property
    def pid(self) -> int:
        return self.process.pid

    def reap(self, timeout: float) -> None:
        """Wait for the exit (SIGKILL after ``timeout``) and keep its rusage."""
        deadline = time.monotonic() + timeout
        while True:
            pid, status, usage = os.wait4(self.pid, os.WNOHANG)
            if pid:
                break
            if time.monotonic() > deadline:
                progress(f"replica {self.pid} did not exit in {timeout:g}s: SIGKILL")
                self.process.kill()
                pid, status, usage = os.wait4(self.pid, 0)
                break
            time.sleep(0.05)
        self.exit_status = os.waitstatus_to_exitcode(status)
        # Popen must not wait for a pid that is gone.
        self.process.returncode = self.exit_status
        self.cpu_s = usage.ru_utime + usage.ru_stime
        self.max_rss_mib = usage.ru_maxrss / 1024  # KiB on Linux


def spawn(argv: Sequence[str], env: dict[str, str], log: Path) -> Replica:
    with log.open("wb") as out:
        process = subprocess.Popen(
            list(argv), stdout=out, stderr=subprocess.STDOUT, env=env, cwd=ROOT
        )
    return Replica(process, log, time.time())


def wait_ready(replicas: Sequence[Replica], marker: str, timeout: float = 120) -> None:
    """Until every replica has logged ``marker``; each one's ``ready`` is when it was seen."""
    deadline = time.monotonic() + timeout
    waiting = [r for r in replicas if not r.ready]
    while waiting:
        for replica in list(waiting):
            if marker in replica.log.read_text(errors="replace"):
                replica.ready = time.time()
                replica.ready_cpu_s = cpu_seconds(replica.pid)
                waiting.remove(replica)
            elif replica.process.poll() is not None or time.monotonic() > deadline:
                tail = replica.log.read_text(errors="replace")[-3000:]
                raise SystemExit(f"replica {replica.pid} did not get ready:\n{tail}")
        time.sleep(0.02)


def cpu_seconds(pid: int) -> float:
    """User + system CPU of a live process so far (``/proc/PID/stat``)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / CLOCK_TICK


def stop(replicas: Sequence[Replica], timeout: float = 60) -> None:
    for replica in replicas:
        if replica.exit_status is None:
            replica.process.send_signal(signal.SIGTERM)
    for replica in replicas:
        if replica.exit_status is None:
            replica.reap(timeout)


def base_env(**extra: str) -> dict[str, str]:
    """A replica's environment: this one without pgcrond's and the benches' own variables."""
    _bytecode()
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PGCROND_", "BENCH_"))}
    env.update(PYTHONPATH=str(ROOT), **extra)
    return env


@functools.cache
def _bytecode() -> None:
    """pgcrond's modules compiled, once: replicas start as an installed package does.

    pip compiles a package's bytecode when it installs it; a source tree under
    PYTHONDONTWRITEBYTECODE (this machine's shell sets it) is compiled again at
    every start, ~0.2 s of a replica's start-up here that no installed replica pays.
    """
    compileall.compile_dir(ROOT / "pgcrond", quiet=1)


# -- the server ---------------------------------------------------------------


def with_db(dsn: str, dbname: str) -> str:
    return psycopg.conninfo.make_conninfo(dsn, dbname=dbname)


def sql(dsn: str, query: str, params: Sequence[Any] = ()) -> list[tuple[Any, ...]]:
    with psycopg.connect(dsn, autocommit=True) as conn:
        cur = conn.execute(query, params)
        return cur.fetchall() if cur.description else []


def transactions(server: LocalServer) -> dict[str, int]:
    """Committed + rolled back transactions per database, read from ``postgres``."""
    time.sleep(0.6)  # backends that just exited have flushed; let the server see it
    rows = sql(
        server.dsn,
        "SELECT datname, xact_commit + xact_rollback FROM pg_stat_database "
        "WHERE datname IS NOT NULL",
    )
    return {str(name): int(count) for name, count in rows}


def server_cpu(server: LocalServer) -> float:
    """CPU seconds of the whole server: its process group, plus the postmaster's reaped children."""
    postmaster = int((server.data_dir / "postmaster.pid").read_text().split()[0])
    total = 0
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            fields = (proc / "stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[2]) != postmaster:  # pgrp: the server runs in its own session
            continue
        total += int(fields[11]) + int(fields[12])
        if int(proc.name) == postmaster:
            total += int(fields[13]) + int(fields[14])
    return total / CLOCK_TICK


@contextlib.contextmanager
def statement_log(server: LocalServer) -> Iterator[Callable[[], list[str]]]:
    """``log_statement = all`` inside the block; yields a reader of what was logged since."""
    sql(server.dsn, "ALTER SYSTEM SET log_statement = 'all'")
    sql(server.dsn, "SELECT pg_reload_conf()")
    time.sleep(1)
    mark = server.log_file.stat().st_size

    def logged() -> list[str]:
        with server.log_file.open(errors="replace") as log:
            log.seek(mark)
            return [line for line in log if "statement: " in line or "execute " in line]

    try:
        yield logged
    finally:
        sql(server.dsn, "ALTER SYSTEM RESET log_statement")
        sql(server.dsn, "SELECT pg_reload_conf()")


# -- the schedulers -----------------------------------------------------------


@dataclass(frozen=True)
class Scenario:
    replicas: int
    jobs: int
    seconds: float
    every: str  # "second" | "minute"
    fault: str | None
    lease: str | None
    idle: float
    concurrency: str = "forbid"  # pgcrond's job concurrency (its default: forbid)
    spread: str | None = None  # pgcrond's top-level spread (its default: 25ms)

    def ticks(self, first: int) -> list[int]:
        """The window's ticks (epoch seconds) from ``first`` on."""
        step = 1 if self.every == "second" else 60
        start = math.ceil(first / step) * step
        return list(range(start, first + int(self.seconds), step))


class Scheduler:
    name = ""
    ready_marker = ""
    # Logged once start-up work is over (after ready): the idle window starts there.
    settled_marker = ""

    def __init__(self, server: LocalServer, workdir: Path, scenario: Scenario) -> None:
        self.server = server
        self.workdir = workdir
        self.scenario = scenario
        self.db = f"sched_{self.name}"
        sql(server.dsn, f'CREATE DATABASE "{self.db}"')
        self.dsn = with_db(server.dsn, self.db)
        statements.enable(self.dsn)

    def prepare(self) -> None:
        """Create the scheduler's schema (outside the measured window, for both)."""

    def start(self, tag: str, idle: bool) -> list[Replica]:
        raise NotImplementedError


class Pgcrond(Scheduler):
    name = "pgcrond"
    ready_marker = '"daemon_ready"'
    settled_marker = '"catch_up_scan_done"'

    def env(self) -> dict[str, str]:
        return base_env(
            PGCROND_DATABASE_URL=self.dsn,
            BENCH_LEDGER_DSN=with_db(self.server.dsn, "ledger"),
        )

    def prepare(self) -> None:
        subprocess.run(
            [str(BIN / "pgcrond"), "migrate"],
            env=self.env(),
            check=True,
            cwd=ROOT,
            stdout=subprocess.DEVNULL,
        )

    def config(self, tag: str, cron: str) -> Path:
        lines = ["database: {url: '${PGCROND_DATABASE_URL}'}"]
        if self.scenario.spread is not None:
            lines.append(f"spread: {self.scenario.spread}")
        lines += [
            "defaults:",
            f"  concurrency: {self.scenario.concurrency}",
            # The ledger job reads its database from the run's environment.
            "  env_passthrough: [BENCH_LEDGER_DSN, PYTHONPATH]",
        ]
        if self.scenario.lease:  # pgcrond's default is 1m
            lines.append(f"  lease: {self.scenario.lease}")
        lines.append("jobs:")
        lines += [
            f"  job-{n:05d}: {{cron: '{cron}', entrypoint: 'bench.ledger_job:record'}}"
            for n in range(self.scenario.jobs)
        ]
        path = self.workdir / f"pgcrond-{tag}.yaml"
        path.write_text("\n".join(lines) + "\n")
        return path

    def start(self, tag: str, idle: bool, cron: str | None = None) -> list[Replica]:
        if cron is None:
            cron = (
                NEVER
                if idle
                else ("* * * * * *" if self.scenario.every == "second" else "0 * * * * *")
            )
        config = self.config(tag, cron)
        argv = [
            str(BIN / "pgcrond"),
            "run",
            "-c",
            str(config),
            "--http",
            "",
            "--log-format",
            "json",
        ]
        return [
            spawn(argv, self.env(), self.workdir / f"pgcrond-{tag}-{n}.log")
            for n in range(self.scenario.replicas)
        ]


class Procrastinate(Scheduler):
    name = "procrastinate"
    ready_marker = "Starting worker"

    def env(self, cron: str) -> dict[str, str]:
        return base_env(
            BENCH_PROCRASTINATE_DSN=self.dsn,
            BENCH_LEDGER_DSN=with_db(self.server.dsn, "ledger"),
            BENCH_JOBS=str(self.scenario.jobs),
            BENCH_CRON=cron,
        )

    def argv(self, *command: str) -> list[str]:
        return [
            str(BIN / "python"),
            "-m",
            "procrastinate",
            "--app=bench.procrastinate_app.app",
            *command,
        ]

    def prepare(self) -> None:
        subprocess.run(
            self.argv("schema", "--apply"),
            env=self.env(NEVER),
            check=True,
            cwd=ROOT,
            capture_output=True,
        )

    def start(self, tag: str, idle: bool) -> list[Replica]:
        # croniter reads a sixth field as seconds (last, unlike pgcrond's first).
        cron = (
            NEVER if idle else ("* * * * * *" if self.scenario.every == "second" else "* * * * *")
        )
        argv = self.argv("--log-level", "info", "worker", "--concurrency", str(self.scenario.jobs))
        return [
            spawn(argv, self.env(cron), self.workdir / f"procrastinate-{tag}-{n}.log")
            for n in range(self.scenario.replicas)
        ]


# -- one scheduler's run ------------------------------------------------------


@dataclass
class Result:
    name: str
    expected: int = 0
    ran: int = 0
    duplicates: int = 0
    misses: int = 0
    lateness_p50_ms: float = 0.0
    lateness_p99_ms: float = 0.0
    lateness_max_ms: float = 0.0
    job_ticks: int = 0  # distinct (job, tick) over the whole run
    transactions: int = 0  # the scheduler's database, whole run
    statements: dict[str, int] = field(default_factory=dict)  # by name, whole run
    rows: int = 0  # ledger rows over the whole run: one insert transaction each
    replica_cpu_s: float = 0.0
    cpu_by_replica: list[float] = field(default_factory=list)
    start_cpu_by_replica: list[float] = field(default_factory=list)
    server_cpu_s: float = 0.0
    max_rss_mib: float = 0.0
    runs_per_replica: list[int] = field(default_factory=list)
    killed: int | None = None
    idle_statements: int | None = None
    idle_seconds: float = 0.0
    idle_cpu_s: float = 0.0  # all replicas, over idle_seconds
    daemon_lateness_ms: tuple[float, float] | None = None  # pgcrond: tick -> run_started
    skipped: dict[str, int] = field(default_factory=dict)  # pgcrond: tick_skipped by reason
    ready_s: list[float] = field(default_factory=list)

    @property
    def per_job_tick(self) -> float:
        return self.transactions / self.job_ticks if self.job_ticks else math.nan

    def statements_per_job_tick(self) -> str:
        """Claims / finalizes / looks / heartbeats / other (the last: every statement of a peer)."""
        if not self.job_ticks:
            return "-"
        parts = [calls / self.job_ticks for calls in statements.split(self.statements)]
        return " / ".join(f"{part:.3f}" for part in parts) + f" ({sum(parts):.3f})"

    @property
    def with_ledger(self) -> float:
        """Own transactions plus the jobs' own inserts (one per ledger row)."""
        return (self.transactions + self.rows) / self.job_ticks if self.job_ticks else math.nan


def ledger_figures(
    ledger: str, jobs: int, ticks: list[int], result: Result, pids: dict[int, int]
) -> None:
    first, last = ticks[0], ticks[-1]
    window = "tick >= to_timestamp(%s) AND tick <= to_timestamp(%s)"
    ((ran, distinct, p50, p99, worst),) = sql(
        ledger,
        "SELECT count(*), count(DISTINCT (job, tick)),"
        " percentile_cont(0.5) WITHIN GROUP (ORDER BY inserted_at - tick),"
        " percentile_cont(0.99) WITHIN GROUP (ORDER BY inserted_at - tick),"
        f" max(inserted_at - tick) FROM bench_ledger WHERE {window}",
        (first, last),
    )
    result.expected = jobs * len(ticks)
    result.ran = int(ran)
    result.duplicates = int(ran) - int(distinct)
    result.misses = result.expected - int(distinct)
    if ran:
        result.lateness_p50_ms = p50.total_seconds() * 1000
        result.lateness_p99_ms = p99.total_seconds() * 1000
        result.lateness_max_ms = worst.total_seconds() * 1000
    ((rows, all_distinct),) = sql(
        ledger, "SELECT count(*), count(DISTINCT (job, tick)) FROM bench_ledger"
    )
    result.rows, result.job_ticks = int(rows), int(all_distinct)
    counts = dict(
        sql(
            ledger,
            f"SELECT pid, count(*) FROM bench_ledger WHERE {window} GROUP BY pid",
            (first, last),
        )
    )
    result.runs_per_replica = [
        int(counts.get(pid, 0)) for pid in sorted(pids, key=pids.__getitem__)
    ]


def kill_in_burst(ledger: str, tick: int, replicas: Sequence[Replica]) -> int | None:
    """SIGKILL the replica whose row for ``tick`` lands first; its index."""
    by_pid = {r.pid: n for n, r in enumerate(replicas)}
    with psycopg.connect(ledger, autocommit=True) as conn:
        while time.time() < tick - 0.05:
            time.sleep(0.01)
        deadline = tick + 5
        while time.time() < deadline:
            row = conn.execute(
                "SELECT pid FROM bench_ledger WHERE tick = to_timestamp(%s) "
                "ORDER BY inserted_at LIMIT 1",
                (tick,),
            ).fetchone()
            if row is not None and row[0] in by_pid:
                victim = replicas[by_pid[row[0]]]
                victim.process.send_signal(signal.SIGKILL)
                victim.reap(10)
                return by_pid[row[0]]
            time.sleep(0.002)
    return None


def skipped_ticks(replicas: Sequence[Replica], ticks: list[int]) -> dict[str, int]:
    """pgcrond's ``tick_skipped`` events in the window, by reason (e.g. overlap under forbid)."""
    reasons: dict[str, int] = {}
    for replica in replicas:
        for line in replica.log.read_text(errors="replace").splitlines():
            if '"tick_skipped"' not in line:
                continue
            event = json.loads(line)
            tick = datetime.fromisoformat(event["run_key"]).timestamp()
            if ticks[0] <= tick <= ticks[-1]:
                reason = str(event.get("reason"))
                reasons[reason] = reasons.get(reason, 0) + 1
    return reasons


def daemon_lateness(replicas: Sequence[Replica], ticks: list[int]) -> tuple[float, float] | None:
    first, last = ticks[0], ticks[-1]
    values = []
    for replica in replicas:
        for line in replica.log.read_text(errors="replace").splitlines():
            if '"run_started"' not in line:
                continue
            event = json.loads(line)
            tick = datetime.fromisoformat(event["tick"]).timestamp()
            if first <= tick <= last:
                values.append(float(event["lateness_ms"]))
    return (percentile(values, 0.5), percentile(values, 0.99)) if values else None


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def profiler(pid: int, out: Path) -> subprocess.Popen[bytes]:
    """py-spy on a replica (``--profile``), stopped with SIGINT when the measure is over."""
    argv = [str(BIN / "py-spy"), "record", "--pid", str(pid), "--format", "raw", "-r", "100"]
    return subprocess.Popen([*argv, "-o", str(out)], stdout=subprocess.DEVNULL)


def run_one(scheduler: Scheduler, server: LocalServer, profile: Path | None = None) -> Result:
    scenario = scheduler.scenario
    ledger = with_db(server.dsn, "ledger")
    sql(ledger, "TRUNCATE bench_ledger")
    scheduler.prepare()
    result = Result(scheduler.name)
    # Read before the transactions are: the reads are not among them.
    reader = statements.as_reader(scheduler.dsn)
    named, named_rows = statements.statements(reader), statements.statements(reader, "rows")
    counts, cpu = transactions(server), server_cpu(server)
    progress(f"{scheduler.name}: starting {scenario.replicas} replicas x {scenario.jobs} jobs")
    replicas = scheduler.start("busy", idle=False)
    wait_ready(replicas, scheduler.ready_marker)
    result.ready_s = [r.ready - r.spawned for r in replicas]
    ticks = scenario.ticks(math.floor(max(r.ready for r in replicas)) + 2)
    if not ticks:
        raise SystemExit("the window holds no tick: give --seconds at least one period")
    progress(
        f"{scheduler.name}: ready; window {len(ticks)} ticks, "
        f"{datetime.fromtimestamp(ticks[0], UTC):%H:%M:%S} .. "
        f"{datetime.fromtimestamp(ticks[-1], UTC):%H:%M:%S}"
    )
    spy = None
    if profile is not None and isinstance(scheduler, Pgcrond):
        spy = profiler(replicas[0].pid, profile)
    tail = TAIL_S
    if scenario.fault == "kill-one":
        tick = ticks[len(ticks) // 2]
        result.killed = kill_in_burst(ledger, tick, replicas)
        progress(
            f"{scheduler.name}: killed replica {result.killed} in the burst of "
            f"{datetime.fromtimestamp(tick, UTC):%H:%M:%S}"
        )
        if isinstance(scheduler, Pgcrond):
            # The dead winner's tick is taken over once its lease expires.
            tail = max(tail, tick + lease_seconds(scenario.lease) + TAIL_S - ticks[-1])
    end = ticks[-1] + tail
    while (left := end - time.time()) > 0:
        rows = sql(ledger, "SELECT count(*) FROM bench_ledger")[0][0]
        progress(f"{scheduler.name}: {rows} ledger rows, {left:.0f}s to go")
        time.sleep(min(10.0, max(left, 0.0)))
    if spy is not None:
        spy.send_signal(signal.SIGINT)
        spy.wait(60)
    stop(replicas)
    after = transactions(server)
    result.statements = statements.made(named, statements.statements(reader))
    rows_made = statements.made(named_rows, statements.statements(reader, "rows"))
    made = sorted(((calls, name) for name, calls in result.statements.items()), reverse=True)
    progress(
        f"{scheduler.name}: statements made (rows): "
        + ", ".join(f"{name} {calls} ({rows_made.get(name, 0)})" for calls, name in made if calls)
    )
    result.server_cpu_s = server_cpu(server) - cpu
    result.transactions = after[scheduler.db] - counts[scheduler.db]
    result.cpu_by_replica = [r.cpu_s for r in replicas]
    result.start_cpu_by_replica = [r.ready_cpu_s for r in replicas]
    result.replica_cpu_s = sum(result.cpu_by_replica)
    result.max_rss_mib = max(r.max_rss_mib for r in replicas)
    ledger_figures(ledger, scenario.jobs, ticks, result, {r.pid: n for n, r in enumerate(replicas)})
    if isinstance(scheduler, Pgcrond):
        result.daemon_lateness_ms = daemon_lateness(replicas, ticks)
        result.skipped = skipped_ticks(replicas, ticks)
    bad = [r.exit_status for r in replicas if r.exit_status not in (0, -signal.SIGKILL)]
    if bad:
        progress(f"{scheduler.name}: replicas exited with {bad}; logs in {scheduler.workdir}")
    progress(
        f"{scheduler.name}: {result.ran} runs in the window, {result.misses} missed, "
        f"{result.duplicates} duplicated, lateness p50 {result.lateness_p50_ms:.1f} ms"
    )
    if scenario.idle > 0:
        replicas = scheduler.start("idle", idle=True)
        wait_ready(replicas, scheduler.ready_marker)
        if scheduler.settled_marker:
            for replica in replicas:
                replica.ready = 0.0
            wait_ready(replicas, scheduler.settled_marker)
        time.sleep(1)  # start-up statements are not idle ones
        with statement_log(server) as logged:
            before = sum(cpu_seconds(replica.pid) for replica in replicas)
            time.sleep(scenario.idle)
            result.idle_statements = len(logged())
            result.idle_cpu_s = sum(cpu_seconds(replica.pid) for replica in replicas) - before
        result.idle_seconds = scenario.idle
        stop(replicas)
        progress(f"{scheduler.name}: idle {scenario.idle:g}s: {result.idle_statements} statements")
    return result


def lease_seconds(lease: str | None) -> float:
    if lease is None:
        return 60.0
    units = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0}
    for unit in sorted(units, key=len, reverse=True):
        if lease.endswith(unit):
            return float(lease[: -len(unit)]) * units[unit]
    raise SystemExit(f"--lease {lease!r}: give a unit (s, m, h)")


# -- the table ----------------------------------------------------------------


def ratio(a: float, b: float) -> str:
    if not a or math.isnan(a) or math.isnan(b):
        return "-"
    return f"{b / a:.2f}x"


def cpu_split(result: Result) -> str:
    """Each replica's CPU, and of it the start's (to its ready line)."""
    each = " / ".join(f"{cpu:.2f}" for cpu in result.cpu_by_replica)
    starts = " / ".join(f"{cpu:.2f}" for cpu in result.start_cpu_by_replica)
    return f"each {each}; to ready {starts}"


def table(ours: Result, peer: Result) -> list[dict[str, str]]:
    """Rows of metric / pgcrond / procrastinate / procrastinate ÷ pgcrond."""

    def row(metric: str, a: str, b: str, r: str = "") -> dict[str, str]:
        return {"metric": metric, "pgcrond": a, "procrastinate": b, "ratio": r}

    def spread(result: Result) -> str:
        text = " / ".join(f"{n:,}" for n in result.runs_per_replica)
        fair = result.ran / max(1, len(result.runs_per_replica))
        top = max(result.runs_per_replica, default=0)
        return f"{text} (max {top / fair:.2f}x fair)" if fair else text

    rows = [
        row(
            "runs in the window (expected)",
            f"{ours.ran:,} ({ours.expected:,})",
            f"{peer.ran:,} ({peer.expected:,})",
        ),
        row(
            "duplicates / misses",
            f"{ours.duplicates} / {ours.misses}",
            f"{peer.duplicates} / {peer.misses}",
        ),
        row(
            "lateness p50 (ledger insert - tick)",
            f"{ours.lateness_p50_ms:.1f} ms",
            f"{peer.lateness_p50_ms:.1f} ms",
            ratio(ours.lateness_p50_ms, peer.lateness_p50_ms),
        ),
        row(
            "lateness p99",
            f"{ours.lateness_p99_ms:.1f} ms",
            f"{peer.lateness_p99_ms:.1f} ms",
            ratio(ours.lateness_p99_ms, peer.lateness_p99_ms),
        ),
        row("lateness max", f"{ours.lateness_max_ms:.1f} ms", f"{peer.lateness_max_ms:.1f} ms"),
        row(
            "db transactions per job-tick, own (ledger excluded)",
            f"{ours.per_job_tick:.2f}",
            f"{peer.per_job_tick:.2f}",
            ratio(ours.per_job_tick, peer.per_job_tick),
        ),
        row(
            "db transactions per job-tick, incl. ledger row",
            f"{ours.with_ledger:.2f}",
            f"{peer.with_ledger:.2f}",
            ratio(ours.with_ledger, peer.with_ledger),
        ),
        row(
            "statements per job-tick: claims / finalizes / looks / heartbeats / other (all)",
            ours.statements_per_job_tick(),
            peer.statements_per_job_tick(),
        ),
        row(
            "replica CPU, all replicas (user+sys)",
            f"{ours.replica_cpu_s:.2f} s ({cpu_split(ours)})",
            f"{peer.replica_cpu_s:.2f} s ({cpu_split(peer)})",
            ratio(ours.replica_cpu_s, peer.replica_cpu_s),
        ),
        row(
            "PostgreSQL CPU (whole server)",
            f"{ours.server_cpu_s:.2f} s",
            f"{peer.server_cpu_s:.2f} s",
            ratio(ours.server_cpu_s, peer.server_cpu_s),
        ),
        row(
            "max replica RSS",
            f"{ours.max_rss_mib:.0f} MiB",
            f"{peer.max_rss_mib:.0f} MiB",
            ratio(ours.max_rss_mib, peer.max_rss_mib),
        ),
        row("runs per replica", spread(ours), spread(peer)),
        row(
            "start to ready, slowest replica",
            f"{max(ours.ready_s):.2f} s",
            f"{max(peer.ready_s):.2f} s",
            ratio(max(ours.ready_s), max(peer.ready_s)),
        ),
    ]
    if ours.idle_statements is not None:

        def per_minute(result: Result, value: float | None, unit: float, fmt: str) -> str:
            if value is None or not result.idle_seconds:
                return "-"  # not run (--only)
            return fmt.format(60 * value / result.idle_seconds * unit)

        rows.append(
            row(
                "idle: statements per minute (log_statement = all)",
                per_minute(ours, ours.idle_statements, 1, "{:.1f}"),
                per_minute(peer, peer.idle_statements, 1, "{:.1f}"),
            )
        )
        rows.append(
            row(
                "idle: replica CPU per minute, all replicas",
                per_minute(ours, ours.idle_cpu_s, 1000, "{:.0f} ms"),
                per_minute(peer, peer.idle_cpu_s, 1000, "{:.0f} ms"),
            )
        )
    if ours.daemon_lateness_ms:
        p50, p99 = ours.daemon_lateness_ms
        rows.append(
            row("pgcrond only: tick -> run_started p50 / p99", f"{p50:.1f} / {p99:.1f} ms", "-")
        )
    if ours.daemon_lateness_ms:
        text = ", ".join(f"{n} {reason}" for reason, n in sorted(ours.skipped.items()))
        rows.append(row("pgcrond only: ticks skipped (tick_skipped, by reason)", text or "0", "-"))
    if ours.killed is not None or peer.killed is not None:
        rows.append(row("killed replica (index)", str(ours.killed), str(peer.killed)))
    return rows


def text_table(rows: list[dict[str, str]], columns: Sequence[str]) -> str:
    widths = [max(len(c), *(len(r[c]) for r in rows)) for c in columns]
    lines = ["  ".join(c.ljust(w) for c, w in zip(columns, widths, strict=True))]
    lines += ["  ".join(r[c].ljust(w) for c, w in zip(columns, widths, strict=True)) for r in rows]
    return "\n".join(lines)


def markdown_table(
    rows: list[dict[str, str]], columns: Sequence[str], headers: Sequence[str]
) -> str:
    lines = ["| " + " | ".join(headers) + " |", "|" + "---|" * len(headers)]
    lines += ["| " + " | ".join(r[c] for c in columns) + " |" for r in rows]
    return "\n".join(lines)


def emit(rows: list[dict[str, str]], columns: Sequence[str]) -> None:
    if sys.stdout.isatty():
        print(text_table(rows, columns))
    else:
        for r in rows:
            print(json.dumps(r))


# -- scale --------------------------------------------------------------------


def scale(
    server: LocalServer, workdir: Path, job_counts: list[int], replica_counts: list[int]
) -> list[dict[str, str]]:
    rows = []
    ledger = with_db(server.dsn, "ledger")
    ready_s: dict[int, float] = {}
    for jobs in job_counts:
        for replicas in replica_counts:
            scenario = Scenario(replicas, jobs, 60, "minute", None, None, 0)
            sql(server.dsn, 'DROP DATABASE IF EXISTS "sched_pgcrond"')
            scheduler = Pgcrond(server, workdir, scenario)
            scheduler.prepare()
            sql(ledger, "TRUNCATE bench_ledger")
            # Per-minute jobs whose second field puts the tick just after start-up,
            # guessed from the last start-up at this size (replicas share 2 cores).
            estimate = ready_s.get(jobs, 1 + jobs / 1000) * max(1.0, replicas / 2) * 1.5
            guess = time.time() + 3 + estimate
            second = math.ceil(guess) % 60
            counts = transactions(server)
            progress(f"scale: {replicas} x {jobs} jobs, tick at second {second}")
            started = scheduler.start(
                f"scale-{jobs}-{replicas}", idle=False, cron=f"{second} * * * * *"
            )
            wait_ready(started, scheduler.ready_marker, timeout=300)
            ready = max(r.ready for r in started)
            ready_s[jobs] = (ready - min(r.spawned for r in started)) / max(1.0, replicas / 2)
            ready_counts = transactions(server)
            tick = math.ceil(guess)
            if tick < ready + 1:
                tick += 60 * math.ceil((ready + 1 - tick) / 60)
                progress(f"scale: ready after the tick; waiting for {tick - time.time():.0f}s")
            deadline = tick + 30 + jobs / 200
            while time.time() < deadline:
                done = sql(
                    ledger,
                    "SELECT count(*) FROM bench_ledger WHERE tick = to_timestamp(%s)",
                    (tick,),
                )[0][0]
                if time.time() > tick and done >= jobs:
                    break
                time.sleep(0.5)
            time.sleep(1)
            stop(started)
            after = transactions(server)
            result = Result("pgcrond")
            ledger_figures(ledger, jobs, [tick], result, {r.pid: n for n, r in enumerate(started)})
            started_p50, started_p99 = daemon_lateness(started, [tick]) or (math.nan, math.nan)
            tick_statements = after[scheduler.db] - ready_counts[scheduler.db]
            startup = ready_counts[scheduler.db] - counts[scheduler.db]
            rows.append(
                {
                    "jobs": f"{jobs:,}",
                    "replicas": str(replicas),
                    "duplicates / misses": f"{result.duplicates} / {result.misses}",
                    "statements per tick": str(tick_statements),
                    "per job": f"{tick_statements / jobs:.3f}",
                    "start-up statements": str(startup),
                    "lateness p50 / p99 / max": f"{result.lateness_p50_ms:.0f} / "
                    f"{result.lateness_p99_ms:.0f} / {result.lateness_max_ms:.0f} ms",
                    "tick -> run_started p50 / p99": f"{started_p50:.0f} / {started_p99:.0f} ms",
                    "max RSS": f"{max(r.max_rss_mib for r in started):.0f} MiB",
                    "start to ready": f"{max(r.ready - r.spawned for r in started):.2f} s",
                }
            )
            progress(f"scale: {rows[-1]}")
    return rows


# -- the docs -----------------------------------------------------------------


# -- main ---------------------------------------------------------------------


def counts(text: str) -> list[int]:
    return [int(part) for part in text.split(",")]


def main() -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--replicas", type=int, default=3)
    parser.add_argument("--jobs", type=int, default=50)
    parser.add_argument("--seconds", type=float, default=60, help="length of the window")
    parser.add_argument("--every", choices=["second", "minute"], default="second")
    parser.add_argument("--fault", choices=["kill-one"])
    parser.add_argument("--lease", help="pgcrond's lease (default 1m; 10s with --fault)")
    parser.add_argument(
        "--idle", type=float, default=15, help="idle window per scheduler (0: none)"
    )
    parser.add_argument("--only", choices=["pgcrond", "procrastinate"], help="run one side only")
    parser.add_argument("--scale", action="store_true", help="pgcrond alone at 100..10,000 jobs")
    parser.add_argument("--scale-jobs", type=counts, default=[100, 1000, 10000])
    parser.add_argument("--scale-replicas", type=counts, default=[1, 3, 6])
    parser.add_argument(
        "--concurrency",
        choices=["forbid", "allow"],
        default="forbid",
        help="pgcrond's job concurrency (forbid, its default, skips the ticks that follow a "
        "dead replica's tick until its lease expires)",
    )
    parser.add_argument("--keep", type=Path, help="copy the replicas' logs and configs here")
    parser.add_argument("--spread", help="pgcrond's spread (default 25ms; 0 turns it off)")
    parser.add_argument("--write-docs", action="store_true", help="rewrite docs/performance.md")
    parser.add_argument("--profile", type=Path, help="py-spy pgcrond's replica 0 into this file")
    args = parser.parse_args()
    if args.profile is not None and not (BIN / "py-spy").exists():
        parser.error("--profile records with py-spy: .venv/bin/pip install py-spy, then run again")
    if args.scale and args.write_docs:
        parser.error("--scale prints its table; docs/performance.md's scale table is bench.scale's")
    lease = args.lease or ("10s" if args.fault else None)
    scenario = Scenario(
        args.replicas,
        args.jobs,
        args.seconds,
        args.every,
        args.fault,
        lease,
        args.idle,
        args.concurrency,
        args.spread,
    )
    shown = list(sys.argv[1:])
    for where in ("--keep", "--profile"):  # where output went is no part of the scenario
        if where in shown:
            at = shown.index(where)
            del shown[at : at + 2]
    command = " ".join([".venv/bin/python -m bench.side_by_side", *shown])
    load = load_note()
    progress(f"load (1-minute average): {load}")
    with throwaway(max_connections=300, prefix="pgcrond-side-") as server:
        workdir = server.data_dir.parent
        try:
            return measure(args, scenario, server, workdir, command, load)
        finally:
            if args.keep:
                args.keep.mkdir(parents=True, exist_ok=True)
                for path in [*workdir.glob("*.log"), *workdir.glob("*.yaml")]:
                    shutil.copy(path, args.keep)


def measure(
    args: argparse.Namespace,
    scenario: Scenario,
    server: LocalServer,
    workdir: Path,
    command: str,
    load: str,
) -> int:
    statements.count_statements(server)
    sql(server.dsn, "CREATE DATABASE ledger")
    sql(with_db(server.dsn, "ledger"), ledger_job.SCHEMA)
    if args.scale:
        rows = scale(server, workdir, args.scale_jobs, args.scale_replicas)
        columns = list(rows[0])
        emit(rows, columns)
        return 0
    results: dict[str, Result] = {}
    for kind in (Pgcrond, Procrastinate):
        if args.only in (None, kind.name):
            results[kind.name] = run_one(kind(server, workdir, scenario), server, args.profile)
    empty = Result("-", ready_s=[0.0])
    rows = table(results.get("pgcrond", empty), results.get("procrastinate", empty))
    columns = ["metric", "pgcrond", "procrastinate", "ratio"]
    emit(rows, columns)
    if args.write_docs:
        section = "fault" if args.fault else "side-by-side"
        headers = ["", "pgcrond", "procrastinate", "procrastinate ÷ pgcrond"]
        write_docs(
            section,
            header(server.dsn, command, load) + "\n" + markdown_table(rows, columns, headers),
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
