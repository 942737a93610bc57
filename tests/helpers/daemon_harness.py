"""Real ``pgcrond run`` processes for acceptance tests.

Each replica is a subprocess whose JSON log goes to a file; tests wait for
log events (bounded), read the ledger table the jobs write, and signal the
processes (SIGKILL, SIGSTOP, SIGTERM, SIGHUP) like an operator or a crash would.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import psycopg
from psycopg.conninfo import conninfo_to_dict, make_conninfo
from psycopg.rows import dict_row

from tests.ledger_jobs import LEDGER_DDL

ROOT = Path(__file__).resolve().parents[2]
PGCROND = Path(sys.executable).parent / "pgcrond"
Event = dict[str, Any]


def wait_until(
    condition: Callable[[], Any], timeout: float, what: str, *, every: float = 0.05
) -> Any:
    """Poll ``condition`` until truthy; fail naming ``what`` after ``timeout`` seconds.

    A condition that starts a process (``podman logs``) polls less often
    (``every``): a poll then costs CPU the processes under test need.
    """
    deadline = time.monotonic() + timeout
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        time.sleep(every)


def settled(leases: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The lease rows if there are some and none is RUNNING, else none (for ``wait_until``).

    A job's effect lands before its outcome: a test that saw the effect waits
    for the finalize with this before it reads the outcome.
    """
    return leases if leases and all(row["status"] != "RUNNING" for row in leases) else []


def clear_of_a_minute_edge(margin_s: float = 10.0) -> None:
    """Wait, if need be, into a fresh minute: the default run key of a manual run
    is the UTC minute, so shells that straddle a minute's edge ask for two runs
    by design (a CI run went red on exactly that)."""
    left = 60 - time.time() % 60
    if left < margin_s:
        time.sleep(left + 0.05)


def quiet_cron() -> str:
    """A daily cron at the UTC minute twelve hours from now: a job that a test
    only asks for (trigger, detach) and that never fires by itself while the
    test runs, whenever the suite runs (a fixed '0 3 * * *' would fire inside a
    nightly build started at 03:00)."""
    moment = datetime.now(UTC) + timedelta(hours=12)
    return f"{moment.minute} {moment.hour} * * *"


@dataclass
class Replica:
    name: str
    config: Path
    log_path: Path
    env: dict[str, str]
    extra_args: list[str] = field(default_factory=list)
    # RLIMIT_NOFILE (soft and hard) to run under; None: the test process's own.
    nofile: int | None = None
    process: subprocess.Popen[bytes] | None = None
    # The log is read by offset: a wait polls every 50 ms, and re-parsing a
    # debug log from its start each time took CPU the replicas under test need.
    _read_to: int = field(default=0, init=False, repr=False)
    _partial: bytes = field(default=b"", init=False, repr=False)
    _parsed: list[Event] = field(default_factory=list, init=False, repr=False)

    def start(self) -> Replica:
        log = self.log_path.open("ab")
        # prlimit execs the daemon: the same process, under the limit.
        limit = [] if self.nofile is None else ["prlimit", f"--nofile={self.nofile}", "--"]
        self.process = subprocess.Popen(
            [
                *limit,
                str(PGCROND),
                "run",
                "-c",
                str(self.config),
                "--http",
                "127.0.0.1:0",
                "--log-format",
                "json",
                "--log-level",
                "debug",
                *self.extra_args,
            ],
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=log,
            env=self.env,
            cwd=ROOT,
        )
        log.close()
        return self

    @property
    def pid(self) -> int:
        assert self.process is not None
        return self.process.pid

    def events(self, name: str | None = None) -> list[Event]:
        """Every JSON event logged so far (across restarts), oldest first."""
        self._read_new_lines()
        return [e for e in self._parsed if name is None or e.get("event") == name]

    def _read_new_lines(self) -> None:
        with contextlib.suppress(FileNotFoundError), self.log_path.open("rb") as log:
            log.seek(self._read_to)
            chunk = log.read()
            self._read_to += len(chunk)
            *lines, self._partial = (self._partial + chunk).split(b"\n")
            for line in lines:
                if not line.startswith(b"{"):
                    continue
                with contextlib.suppress(json.JSONDecodeError):
                    self._parsed.append(json.loads(line.decode(errors="replace")))

    def wait_event(
        self, name: str, timeout: float = 20, where: Callable[[Event], bool] = lambda e: True
    ) -> Event:
        def match() -> Event | None:
            self._check_alive(name)
            return next((e for e in self.events(name) if where(e)), None)

        event: Event = wait_until(match, timeout, f"{self.name}: event {name}")
        return event

    def _check_alive(self, waiting_for: str) -> None:
        assert self.process is not None
        if self.process.poll() is not None and self.process.returncode not in (0, -9):
            raise AssertionError(
                f"{self.name} exited with {self.process.returncode} while waiting for "
                f"{waiting_for}:\n{self.log_path.read_text()[-3000:]}"
            )

    def http_address(self) -> str:
        return str(self.wait_event("daemon_ready")["http"])

    def signal(self, signum: signal.Signals) -> None:
        assert self.process is not None
        self.process.send_signal(signum)

    def wait_exit(self, timeout: float) -> int:
        assert self.process is not None
        return self.process.wait(timeout)

    def stop(self) -> None:
        if self.process is None or self.process.poll() is not None:
            return
        with contextlib.suppress(ProcessLookupError):
            os.kill(self.process.pid, signal.SIGCONT)
        self.process.kill()
        self.process.wait(10)


@dataclass
class Cluster:
    """N replicas of one config against one database, plus the ledger they write."""

    dsn: str
    schema: str
    workdir: Path
    replicas: list[Replica] = field(default_factory=list)
    # Where jobs write the ledger; the daemon's own DSN unless a test needs them apart.
    ledger_dsn: str | None = None

    @property
    def ledger(self) -> str:
        return f'"{self.schema}".ledger'

    def prepare(self) -> None:
        with psycopg.connect(self.dsn, autocommit=True) as conn:
            conn.execute(f'CREATE SCHEMA IF NOT EXISTS "{self.schema}"')
            conn.execute(LEDGER_DDL.format(table=self.ledger))

    @property
    def config_path(self) -> Path:
        return self.workdir / "jobs.yaml"

    def write_config(self, text: str) -> Path:
        self.config_path.write_text(text)
        return self.config_path

    def env(self) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith("PGCROND_")}
        env.update(
            PGCROND_DATABASE_URL=self.dsn,
            # In key=value form: a variable holding the daemon's own URL is kept
            # out of every job's environment, and the ledger jobs need this one.
            LEDGER_DSN=make_conninfo("", **conninfo_to_dict(self.ledger_dsn or self.dsn)),
            LEDGER_TABLE=self.ledger,
            PYTHONPATH=str(ROOT),
            # Jobs inherit only what they are given: the ledger jobs need these.
            PGCROND_ENV_PASSTHROUGH="LEDGER_*,PYTHONPATH",
        )
        return env

    def start(self, config: Path, count: int = 1, *, first: int = 0) -> list[Replica]:
        started = [
            Replica(f"replica-{n}", config, self.workdir / f"replica-{n}.log", self.env()).start()
            for n in range(first, first + count)
        ]
        self.replicas.extend(started)
        for replica in started:
            replica.wait_event("daemon_ready", timeout=30)
        return started

    def rows(self, query: str, *params: object) -> list[dict[str, Any]]:
        with psycopg.connect(self.dsn, autocommit=True, row_factory=dict_row) as conn:
            # Job rows only: the daemon's own hourly history pruning and its
            # start-up tick accounting claim rows of their own ("pgcrond:…").
            leases = (
                f'(SELECT * FROM "{self.schema}".leases '
                "WHERE code NOT LIKE 'pgcrond:%%') AS leases"
            )
            return conn.execute(query.format(ledger=self.ledger, leases=leases), params).fetchall()

    def stop_all(self) -> None:
        for replica in self.replicas:
            replica.stop()


@contextlib.contextmanager
def cluster(dsn: str, schema: str, workdir: Path) -> Iterator[Cluster]:
    running = Cluster(dsn, schema, workdir)
    running.prepare()
    try:
        yield running
    finally:
        running.stop_all()


# -- configs of ledger jobs, and the CLI against a cluster ------------------------------

LEDGER = "tests.ledger_jobs:record"


def config(schema: str, jobs: str, *, defaults: str = "", extra: str = "") -> str:
    return (
        "database:\n"
        "  url: ${PGCROND_DATABASE_URL}\n"
        f"  schema: {schema}\n"
        f"{extra}"
        "defaults:\n"
        "  misfire_grace: 30s\n"
        # Every tick inside its window runs, late or not: these tests judge the
        # lease's once-per-tick guarantee, not coalescing (tests/test_late_ticks.py).
        "  late_ticks: all\n"
        # Below misfire_grace, so that a dead winner's tick can be taken over.
        "  lease: 20s\n"
        f"{defaults}"
        "jobs:\n"
        f"{jobs}"
    )


# A replica's start under the suite's load (imports, three xdist workers, the
# image build) can take seconds, and a job with no row yet starts its record at
# its first tick after the scheduler starts (docs/operations.md, "Every tick
# accounted for"): an ``at:`` instant that passed during the start is not its.
# Instants are put this much further out.
START_SLACK_S = 4.0


def at(seconds: float) -> str:
    """An ``at:`` instant ``seconds`` (plus the start's slack) from now, whole seconds, UTC."""
    moment = datetime.now(UTC) + timedelta(seconds=seconds + START_SLACK_S)
    return moment.replace(microsecond=0).strftime("%Y-%m-%dT%H:%M:%SZ")


def one_shot(
    schema: str,
    *,
    seconds: float,
    sleep: float,
    lease: str,
    heartbeat: str,
    defaults: str = "",
    extra: str = "",
    sleeping_attempts: int | None = None,
) -> str:
    limit = "" if sleeping_attempts is None else f', LEDGER_SLEEP_ATTEMPTS: "{sleeping_attempts}"'
    return config(
        schema,
        f"  long:\n"
        f'    at: "{at(seconds)}"\n'
        f"    entrypoint: {LEDGER}\n"
        f"    lease: {lease}\n"
        f"    heartbeat: {heartbeat}\n"
        f'    env: {{LEDGER_SLEEP: "{sleep}"{limit}}}\n',
        defaults=defaults,
        extra=extra,
    )


def first_start(running: Cluster) -> dict[str, Any]:
    """The ledger's first 'start' row, once a run has started."""
    rows: list[dict[str, Any]] = wait_until(
        lambda: running.rows("SELECT * FROM {ledger} WHERE phase = 'start' ORDER BY id"),
        20,
        "a run to start",
    )
    return rows[0]


def attempted_initial(replica: Replica) -> bool:
    return bool(replica.events("initial_attempted") or replica.events("claim_lost"))


def cli(running: Cluster, *args: str) -> tuple[int, str, str]:
    done = subprocess.run(
        [str(PGCROND), *args],
        env=running.env(),
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    return done.returncode, done.stdout, done.stderr


async def until(
    condition: Callable[[], Any], within: float = 5.0, what: str = "the condition"
) -> Any:
    """Poll ``condition`` on the loop until it is truthy (and return it); fail after ``within``."""
    deadline = asyncio.get_running_loop().time() + within
    while not (value := condition()):
        if asyncio.get_running_loop().time() > deadline:
            raise AssertionError(f"timed out after {within}s waiting for {what}")
        await asyncio.sleep(0.02)
    return value
