"""One log stream: every line a real ``pgcrond run`` writes is one JSON object, redacted.

The daemon runs against a database nobody listens on, and against one that is
stopped and started under it; stdout and stderr go to one file, and every line
of it must parse as JSON (the libraries' warnings, psycopg_pool's multi-line
connection errors and Python ``warnings`` included) and hold no fragment of
the DSN's distinctive password.
"""

from __future__ import annotations

import json
import os
import pty
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from pgcrond.storage.embedded import LocalServer, free_port
from tests.helpers.daemon_harness import ROOT, Replica, wait_until

pytestmark = pytest.mark.slow

PASSWORD = "Hx7qPw2LmZ"
# Any 4 consecutive characters of the password count as a leak.
FRAGMENTS = {PASSWORD[i : i + 4] for i in range(len(PASSWORD) - 3)}

NOISY_JOBS = """
import warnings


def warn(context):
    # A library warning that quotes a DSN: it must come out as JSON, redacted.
    warnings.warn("deprecated: connect('postgresql://app:Hx7qPw2LmZ@db/app')", UserWarning)
"""


def parse_all(path: Path) -> list[dict[str, Any]]:
    """Every line of the file as JSON; fails naming the first line that is not."""
    events = []
    for number, line in enumerate(path.read_text().splitlines(), 1):
        try:
            event = json.loads(line)
        except json.JSONDecodeError:
            pytest.fail(f"{path.name}:{number} is not JSON: {line!r}")
        assert isinstance(event, dict), line
        events.append(event)
    return events


def assert_no_password(path: Path) -> None:
    text = path.read_text()
    leaked = sorted(fragment for fragment in FRAGMENTS if fragment in text)
    assert [] == leaked


def replica(tmp_path: Path, dsn: str, jobs: str) -> Replica:
    config = tmp_path / "jobs.yaml"
    config.write_text(f'database:\n  url: "{dsn}"\n  schema: logs_test\njobs:\n{jobs}')
    (tmp_path / "noisy_jobs.py").write_text(NOISY_JOBS)
    env = {k: v for k, v in os.environ.items() if not k.startswith("PGCROND_")}
    env["PYTHONPATH"] = f"{tmp_path}{os.pathsep}{ROOT}"
    return Replica("replica", config, tmp_path / "replica.log", env)


def stop(daemon: Replica) -> None:
    daemon.signal(signal.SIGTERM)
    assert 0 == daemon.wait_exit(60)


@pytest.mark.usefixtures("system_processes")
def test_against_an_unreachable_database_every_line_is_redacted_json(tmp_path: Path) -> None:
    dsn = f"postgresql://pgcrond:{PASSWORD}@127.0.0.1:{free_port()}/app"
    daemon = replica(tmp_path, dsn, '  tick:\n    cron: "* * * * * *"\n    shell: "true"\n')
    daemon.start()
    try:
        daemon.wait_event("database_unavailable", timeout=30)
        wait_until(
            lambda: len([e for e in daemon.events() if e.get("logger") == "psycopg.pool"]) >= 2,
            30,
            "psycopg_pool's connection errors",
        )
        stop(daemon)
    finally:
        daemon.stop()
    events = parse_all(daemon.log_path)
    pool = [e for e in events if e.get("logger") == "psycopg.pool"]
    # The driver's multi-line message is one JSON string now, not lines of text.
    assert all(e["level"] == "warning" and "\n" in e["event"] for e in pool), pool[:2]
    assert "postgresql://pgcrond:***@" in next(e for e in events if e["event"] == "database")["url"]
    assert_no_password(daemon.log_path)


def test_through_a_flapping_database_every_line_is_redacted_json(
    tmp_path: Path, own_server: LocalServer
) -> None:
    # Trust authentication ignores the password; it is there to be leaked, or not.
    dsn = own_server.dsn.replace("postgres@", f"postgres:{PASSWORD}@", 1)
    daemon = replica(
        tmp_path,
        dsn,
        '  tick:\n    cron: "* * * * * *"\n    shell: "true"\n'
        '  warn:\n    cron: "* * * * * *"\n    entrypoint: "noisy_jobs:warn"\n',
    )
    daemon.start()
    try:
        daemon.wait_event("daemon_ready", timeout=30)
        daemon.wait_event("run_finished", timeout=20, where=lambda e: e["outcome"] == "success")
        before = len(daemon.events())
        own_server.stop()
        wait_until(
            lambda: [e for e in daemon.events()[before:] if e.get("level") in ("warning", "error")],
            30,
            "a warning while the database is down",
        )
        own_server.start()
        restarted = len(daemon.events())
        daemon.wait_event(
            "run_finished",
            timeout=60,
            where=lambda e: e["outcome"] == "success" and daemon.events().index(e) > restarted,
        )
        stop(daemon)
    finally:
        daemon.stop()
    events = parse_all(daemon.log_path)
    warned = [e for e in events if e.get("logger") == "py.warnings"]
    assert warned, "the job's UserWarning was not logged"
    assert "postgresql://app:***@db/app" in warned[0]["event"]
    outage = events[before:restarted]
    assert [e for e in outage if e["level"] in ("warning", "error")]
    assert_no_password(daemon.log_path)


CONSOLE_PROBE = """
import logging, warnings, structlog
from pgcrond.logs import configure
configure("auto")
structlog.get_logger("pgcrond.probe").info("probe_event", url="postgresql://u:Hx7qPw2LmZ@h/d")
logging.getLogger("psycopg.pool").warning("error connecting: password=Hx7qPw2LmZ")
warnings.warn("careful", UserWarning)
"""


@pytest.mark.usefixtures("subprocesses")
def test_on_a_terminal_the_same_lines_are_rendered_for_people(tmp_path: Path) -> None:
    """stderr a TTY: the console renderer, still redacted, libraries and warnings included."""
    leader, follower = pty.openpty()
    try:
        process = subprocess.run(
            [sys.executable, "-c", CONSOLE_PROBE],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=follower,
            timeout=60,
            check=False,
        )
        os.close(follower)
        chunks = []
        while True:
            try:
                chunk = os.read(leader, 65536)
            except OSError:  # EIO: the writer side is closed and drained
                break
            if not chunk:
                break
            chunks.append(chunk)
    finally:
        os.close(leader)
    output = b"".join(chunks).decode(errors="replace")
    assert 0 == process.returncode, output
    lines = [line for line in output.splitlines() if line.strip()]
    assert not any(line.lstrip().startswith("{") for line in lines), output
    assert [] == [w for w in ("probe_event", "error connecting", "careful") if w not in output]
    assert "postgresql://u:***@h/d" in output
    assert not any(fragment in output for fragment in FRAGMENTS), output
