"""Three listening replicas through their first idle minute, on a server of their own.

What an idle replica sends is judged twice: it listens for requests and sends
no statement while it waits (tests/test_requests.py), and its one timed
statement is the registry touch, once a minute (tests/test_config_changes.py).
Both need the server's log of every statement (``log_statement = all``) over
an idle stretch, and the touch needs a whole minute of it: one scenario, run
once per session (the ``idle_minute`` fixture), gives both their evidence.

The minute costs no CPU, so it need not hold up the suite: the scenario runs
as a process of its own (``python -m tests.helpers.idle``), started with the first
system-tier test of a session that selected either test (tests/conftest.py),
and the fixture collects its result when the first of them runs. Nothing it
judges depends on load: which statements its own server logged, and that a
request was taken within a generous bound.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import psycopg

from pgcrond.daemon.registry import SETTLE_S
from pgcrond.storage import registry
from pgcrond.storage.embedded import LocalServer, throwaway
from tests.helpers.daemon_harness import PGCROND, ROOT, cluster, quiet_cron, wait_until
from tests.jobs_fixture import is_alive, poll

REPLICAS = 3
# Past the last replica's first touch: a statement that followed it would show.
AFTER_TOUCH_S = 3.0


@dataclass(frozen=True)
class IdleMinute:
    replicas: int
    # Every statement logged from the end of start-up to a few seconds past
    # each replica's first touch (the server logs a statement's first line).
    idle: list[str]
    # What the server logged once a detached request was made, and the
    # replicas' request_done events for it.
    after_request: list[str]
    request_done: list[dict[str, Any]]


def statements(server: LocalServer, mark: int) -> list[str]:
    """The statements the server logged (log_statement = all) after byte ``mark``."""
    with server.log_file.open(errors="replace") as server_log:
        server_log.seek(mark)
        return [line for line in server_log if "statement: " in line or "execute " in line]


def sql_count(dsn: str, query: str) -> int:
    with psycopg.connect(dsn, autocommit=True) as conn:
        row = conn.execute(query).fetchone()
    return 0 if row is None else int(row[0])


def log_every_statement(dsn: str) -> None:
    """``log_statement = all``, in effect for the replicas' backends when this returns.

    A fresh session sees the reloaded setting only once the postmaster has
    read the file, and it signals every backend before that: so each of the
    replicas' backends applies it before its next statement (no sleep needed).
    """
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("ALTER SYSTEM SET log_statement = 'all'")
        conn.execute("SELECT pg_reload_conf()")

    def in_effect() -> bool:
        with psycopg.connect(dsn, autocommit=True) as fresh:
            row = fresh.execute("SHOW log_statement").fetchone()
        return row is not None and row[0] == "all"

    wait_until(in_effect, 10, "log_statement = all to be in effect")


def first_minute(workdir: Path) -> IdleMinute:
    schema = "idle"
    with (
        throwaway(prefix="pgcrond-test-") as server,
        cluster(server.dsn, schema, workdir) as running,
    ):
        path = running.write_config(
            "database:\n"
            "  url: ${PGCROND_DATABASE_URL}\n"
            f"  schema: {schema}\n"
            "jobs:\n"
            f'  report: {{cron: "{quiet_cron()}", entrypoint: tests.ledger_jobs:record}}\n'
        )
        replicas = running.start(path, REPLICAS)
        for replica in replicas:
            replica.wait_event("requests_listening", timeout=10)
            # Start-up work ends with the scan for missed ticks (one at a time).
            replica.wait_event("catch_up_scan_done", timeout=20)
        # Each replica touches once SETTLE_S after its start (its peers then
        # known to spread), then once a minute: the minute is judged from the
        # settle touches on, as the registry's own rows show them.
        settled = f"last_seen >= started_at + interval '{SETTLE_S - 1} seconds'"
        wait_until(
            lambda: (
                REPLICAS
                == sql_count(
                    server.dsn, f'SELECT count(*) FROM "{schema}".leases_replicas WHERE {settled}'
                )
            ),
            SETTLE_S + 30,
            "every replica's settle touch",
        )
        log_every_statement(server.dsn)
        mark = server.log_file.stat().st_size
        touches_due = (
            max(
                datetime.fromisoformat(r.events("registry_joined")[0]["timestamp"])
                for r in replicas
            )
            + timedelta(seconds=SETTLE_S)
            + registry.TOUCH_EVERY
        )
        # The whole first idle minute of each replica, up to its touch.
        wait_until(
            lambda: sum("registry" in line for line in statements(server, mark)) >= REPLICAS,
            (touches_due - datetime.now(UTC)).total_seconds() + 15,
            "every replica's registry touch",
        )
        time.sleep(AFTER_TOUCH_S)  # the window past the touches is the subject
        idle = statements(server, mark)
        # Still listening: a request now is taken at once, and the log shows it.
        asked = subprocess.run(
            [str(PGCROND), "trigger", "-c", str(path), "report", "--detach"],
            env=running.env(),
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
        assert 0 == asked.returncode, asked.stderr
        done = wait_until(
            lambda: [e for r in replicas for e in r.events("request_done")],
            10,
            "the request to run",
        )
        return IdleMinute(REPLICAS, idle, statements(server, mark), done)


class Background:
    """The scenario in a process of its own, shared by every process of a test
    session (each pytest-xdist worker, or the one pytest) through ``home``: the
    first to ask starts it, any of them reads its result, and the session's
    controller stops it (``stop``) once every worker is done."""

    def __init__(self, home: Path) -> None:
        self.home = home
        self.result_path = home / "result.json"
        self.failed_path = home / "failed"
        self.log_path = home / "scenario.log"
        self.pid_path = home / "pid"
        self.process: subprocess.Popen[bytes] | None = None

    def start_once(self) -> None:
        """Start the scenario unless a process of this session already has."""
        if self.process is not None:
            return
        try:
            os.close(os.open(self.home / "claimed", os.O_CREAT | os.O_EXCL | os.O_WRONLY))
        except FileExistsError:
            return
        with self.log_path.open("wb") as log:
            self.process = subprocess.Popen(
                [sys.executable, "-m", "tests.helpers.idle", str(self.home / "cluster"),
                 str(self.result_path)],
                cwd=ROOT,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                # Its own session: a signal at the suite's terminal is not its to take.
                start_new_session=True,
            )  # fmt: skip
        self.pid_path.write_text(str(self.process.pid))

    def result(self, timeout: float = 180) -> IdleMinute:
        """Wait for the scenario's outcome; its own failure is raised with its output."""
        self.start_once()

        def ended() -> bool:
            if self.process is not None and self.process.poll() is not None:
                return True
            return self.result_path.exists() or self.failed_path.exists()

        wait_until(ended, timeout, "the idle scenario", every=0.2)
        if not self.result_path.exists():
            raise AssertionError(f"the idle scenario failed:\n{self.log_path.read_text()[-4000:]}")
        return IdleMinute(**json.loads(self.result_path.read_text()))

    def stop(self) -> None:
        """End the scenario if it still runs (it stops its replicas and server), and clean up.

        Under pytest-xdist the worker that started it may be gone: the process is
        found by the pid it left, signalled as a group, and awaited by polling.
        """
        with contextlib.suppress(FileNotFoundError, ValueError, ProcessLookupError):
            pid = int(self.pid_path.read_text())
            if is_alive(pid):
                os.killpg(pid, signal.SIGTERM)
                if not poll(lambda: not is_alive(pid), 60):
                    os.killpg(pid, signal.SIGKILL)
        if self.process is not None:
            self.process.wait(10)
        shutil.rmtree(self.home, ignore_errors=True)


def main(workdir: str, result_path: str) -> None:
    # SIGTERM unwinds like an exception: the replicas and the server are stopped.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    Path(workdir).mkdir()
    try:
        found = first_minute(Path(workdir))
    except BaseException:
        # Seen by a session process that did not start the scenario (pytest-xdist).
        Path(result_path).with_name("failed").touch()
        raise
    partial = Path(result_path + ".partial")
    partial.write_text(json.dumps(dataclasses.asdict(found)))
    partial.rename(result_path)  # whole or absent


if __name__ == "__main__":
    main(*sys.argv[1:])
