"""Every way of running leaves the same attempt record: retries, entrypoints, ``sql:``, ``http:``.

Each job is run by the real CLI (``pgcrond trigger``: one run here, through the
lease guard, its own retries followed) and its records are read back with
``pgcrond logs --json`` and ``pgcrond history --json``.
"""

from __future__ import annotations

import json
import os
import subprocess
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import psycopg
import pytest

from pgcrond.run.output import HTTP_BODY_BYTES
from tests.helpers.daemon_harness import PGCROND, ROOT, wait_until
from tests.jobs_fixture import docs_example

pytestmark = pytest.mark.usefixtures("subprocesses")

# Entrypoints for the jobs below, importable by the CLI (PYTHONPATH).
JOBS_MODULE = """
import sys


def in_process(ctx):
    print("in-process out, attempt", ctx.attempt, file=ctx.stdout)
    ctx.stderr.write("in-process err\\n")
    raise ValueError("boom")


def isolated(ctx):
    print("isolated out")
    print("isolated err", file=sys.stderr)
    raise RuntimeError("isolated boom")
"""


class Server:
    """Answers every request 500 with a cookie and a long body."""

    BODY = b"<h1>down</h1>" + b"." * 3000

    def __init__(self) -> None:
        body = self.BODY

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                self.rfile.read(int(self.headers.get("Content-Length", "0")))
                self.send_response(500)
                self.send_header("Set-Cookie", "session=very-secret-cookie")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args: object) -> None:
                pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}/run"


@pytest.fixture
def server() -> Iterator[Server]:
    found = Server()
    thread = threading.Thread(target=found.httpd.serve_forever, daemon=True)
    thread.start()
    yield found
    found.httpd.shutdown()


@pytest.fixture
def setup(pg_dsn: str, schema: str, tmp_path: Path, server: Server) -> Path:
    (tmp_path / "attempt_jobs.py").write_text(JOBS_MODULE)
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        conn.execute(f'CREATE SCHEMA IF NOT EXISTS "{schema}"')
        conn.execute(f'CREATE TABLE "{schema}".things (n int)')
        conn.execute(
            f'CREATE FUNCTION "{schema}".noisy() RETURNS int LANGUAGE plpgsql AS '
            "$$BEGIN RAISE NOTICE 'hello from sql'; RETURN 1; END$$"
        )
    path = tmp_path / "jobs.yaml"
    path.write_text(
        f"""\
database: {{url: "${{PGCROND_DATABASE_URL}}", schema: {schema}}}
jobs:
  retried:
    cron: "0 0 1 1 *"
    shell: |
      echo "try $PGCRON_ATTEMPT"
      echo "failing $PGCRON_ATTEMPT" >&2
      [ "$PGCRON_ATTEMPT" -ge 2 ]
    retries: 1
    retry_delay: 100ms
  in-process:
    cron: "0 0 1 1 *"
    entrypoint: attempt_jobs:in_process
  isolated:
    cron: "0 0 1 1 *"
    entrypoint: attempt_jobs:isolated
    isolate: true
  sql-job:
    cron: "0 0 1 1 *"
    sql: 'SELECT "{schema}".noisy(); INSERT INTO "{schema}".things SELECT generate_series(1, 3)'
  http-job:
    cron: "0 0 1 1 *"
    http: {{url: "{server.url}", timeout: 5s}}
"""
    )
    migrated = pgcrond(path, pg_dsn, "migrate")
    assert 0 == migrated.returncode, migrated.stderr
    return path


def pgcrond(path: Path, pg_dsn: str, *args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("PGCROND_")}
    env["PGCROND_DATABASE_URL"] = pg_dsn
    env["PYTHONPATH"] = f"{path.parent}{os.pathsep}{ROOT}"
    return subprocess.run(
        [str(PGCROND), *args, "-c", str(path)],
        capture_output=True,
        text=True,
        timeout=60,
        env=env,
        check=False,
    )


def logs(path: Path, pg_dsn: str, code: str, *args: str) -> dict[str, Any]:
    done = pgcrond(path, pg_dsn, "logs", code, "--json", *args)
    assert 0 == done.returncode, done.stderr
    entry: dict[str, Any] = json.loads(done.stdout)
    return entry


def trigger(path: Path, pg_dsn: str, code: str) -> int:
    return pgcrond(path, pg_dsn, "trigger", "--here", code, "--run-key", "by-test").returncode


def test_a_retried_tick_keeps_both_attempts_records(setup: Path, pg_dsn: str) -> None:
    assert 0 == trigger(setup, pg_dsn, "retried"), "the retry succeeded"
    first = logs(setup, pg_dsn, "retried", "--run-key", "by-test", "--attempt", "1")
    second = logs(setup, pg_dsn, "retried", "--run-key", "by-test")
    assert ("fail", 1, "exit status 1") == (first["status"], first["exit_code"], first["error"])
    assert "try 1\n" == first["output"]["stdout"]["text"]
    assert "failing 1\n" == first["output"]["stderr"]["text"]
    assert (2, "success", 0) == (second["attempt"], second["status"], second["exit_code"])
    assert "try 2\n" == second["output"]["stdout"]["text"]
    assert "SUCCESS" == second["tick_status"]
    history = pgcrond(setup, pg_dsn, "history", "--job", "retried", "--json")
    [tick] = json.loads(history.stdout)
    assert [(1, "fail"), (2, "success")] == [(a["attempt"], a["status"]) for a in tick["attempts"]]


def test_an_in_process_entrypoint_keeps_what_it_wrote_to_its_contexts_streams(
    setup: Path, pg_dsn: str
) -> None:
    assert 1 == trigger(setup, pg_dsn, "in-process")
    entry = logs(setup, pg_dsn, "in-process")
    assert ("fail", "ValueError: boom") == (entry["status"], entry["error"])
    assert "in-process out, attempt 1\n" == entry["output"]["stdout"]["text"]
    assert "in-process err\n" == entry["output"]["stderr"]["text"]


def test_an_isolated_entrypoint_keeps_its_processs_output(setup: Path, pg_dsn: str) -> None:
    assert 1 == trigger(setup, pg_dsn, "isolated")
    entry = logs(setup, pg_dsn, "isolated")
    assert "fail" == entry["status"]
    assert "RuntimeError: isolated boom" in entry["error"]
    assert "isolated out\n" == entry["output"]["stdout"]["text"]
    assert entry["output"]["stderr"]["text"].startswith("isolated err\n")


def test_an_sql_jobs_record_holds_its_command_tags_and_notices(setup: Path, pg_dsn: str) -> None:
    assert 0 == trigger(setup, pg_dsn, "sql-job")
    entry = logs(setup, pg_dsn, "sql-job")
    assert "success" == entry["status"]
    assert (
        "statement 1: SELECT 1 (1 row)\nstatement 2: INSERT 0 3 (3 rows)\n"
        == entry["output"]["stdout"]["text"]
    )
    assert "NOTICE: hello from sql\n" == entry["output"]["stderr"]["text"]


def test_an_http_jobs_record_holds_the_status_line_redacted_headers_and_the_first_kib(
    setup: Path, pg_dsn: str, server: Server
) -> None:
    assert 1 == trigger(setup, pg_dsn, "http-job")
    entry = logs(setup, pg_dsn, "http-job")
    text = entry["output"]["stdout"]["text"]
    head, _, body = text.partition("\n\n")
    assert head.startswith("HTTP/1.0 500 Internal Server Error\n"), head
    assert "set-cookie: ***" in head
    assert "very-secret-cookie" not in text
    assert body.startswith(Server.BODY[:HTTP_BODY_BYTES].decode())
    assert body.endswith(f"[… {len(Server.BODY) - HTTP_BODY_BYTES} more bytes of body …]")
    assert entry["error"].startswith("http: 500 Internal Server Error")


def test_the_jobs_md_example_leaves_the_record_the_page_shows(
    pg_dsn: str, schema: str, tmp_path: Path
) -> None:
    """docs/jobs.md "What a job leaves behind": its job, run, and `pgcrond logs` as shown."""
    path = tmp_path / "export.yaml"
    path.write_text(
        f'database: {{url: "${{PGCROND_DATABASE_URL}}", schema: {schema}}}\n'
        + docs_example("leaves-behind")
    )
    assert 0 == pgcrond(path, pg_dsn, "migrate").returncode
    ran = pgcrond(path, pg_dsn, "trigger", "--here", "export", "--run-key", "2026-12-02T02:30:00Z")
    assert 1 == ran.returncode, ran.stderr
    shown = pgcrond(path, pg_dsn, "logs", "export")
    assert 0 == shown.returncode, shown.stderr
    command, header, why, started, *body = docs_example("leaves-behind-logs").splitlines()
    assert "$ pgcrond logs export" == command
    lines = shown.stdout.splitlines()
    # The header names a replica, the next lines why it ran and its times.
    assert lines[0].startswith(header.split(" on ")[0] + " on ")
    outcome = ": FAIL: exit status 3"
    assert header.endswith(outcome) and lines[0].endswith(outcome)
    assert "trigger manual" == why == lines[1]
    assert lines[2].startswith("started ") and started.startswith("started ")
    assert body == lines[3:]


def test_logs_follow_says_it_cannot_stream_waits_for_the_attempt_and_prints_its_output(
    pg_dsn: str, schema: str, tmp_path: Path
) -> None:
    fifo = tmp_path / "release"
    os.mkfifo(fifo)
    path = tmp_path / "held.yaml"
    path.write_text(
        f'database: {{url: "${{PGCROND_DATABASE_URL}}", schema: {schema}}}\n'
        "jobs:\n"
        "  held:\n"
        '    cron: "0 0 1 1 *"\n'
        "    shell: |\n"
        "      echo waiting\n"
        '      read line < "$RELEASE"\n'
        '      echo "released: $line"\n'
        f'    env: {{RELEASE: "{fifo}"}}\n'
    )
    assert 0 == pgcrond(path, pg_dsn, "migrate").returncode
    env = {k: v for k, v in os.environ.items() if not k.startswith("PGCROND_")}
    env["PGCROND_DATABASE_URL"] = pg_dsn
    command = [str(PGCROND), "-c", str(path)]
    with subprocess.Popen(
        [*command[:1], "trigger", "--here", "held", "--run-key", "by-test", *command[1:]],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    ) as trigger_run:
        # A failed assertion must not leave the job blocked on its FIFO (and
        # --follow waiting for it) forever: both are killed after a minute.
        started: list[subprocess.Popen[Any]] = [trigger_run]

        def stop_all() -> None:
            for process in started:
                process.kill()

        stopper = threading.Timer(60, stop_all)
        stopper.start()
        wait_until(lambda: _running(pg_dsn, schema), 20, "the attempt to start")
        shown = pgcrond(path, pg_dsn, "logs", "held")
        assert "(still running: its output is stored when it ends" in shown.stdout
        with subprocess.Popen(
            [*command[:1], "logs", "held", "--follow", *command[1:]],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        ) as follow:
            started.append(follow)
            assert follow.stderr is not None
            said = follow.stderr.readline()  # said before it waits
            assert "cannot be streamed from here" in said
            assert "job_output events" in said
            with fifo.open("w") as release:
                release.write("go\n")
            out, _ = follow.communicate(timeout=30)
        assert 0 == trigger_run.wait(30)
        stopper.cancel()
    assert 0 == follow.returncode
    assert "--- stdout\nwaiting\nreleased: go" in out
    assert "SUCCESS" in out


def _running(pg_dsn: str, schema: str) -> bool:
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        found = conn.execute(
            f"SELECT 1 FROM \"{schema}\".leases_attempts WHERE status = 'running'"
        ).fetchone()
    return found is not None


def test_pruning_a_tick_prunes_its_attempt_records(setup: Path, pg_dsn: str, schema: str) -> None:
    assert 0 == trigger(setup, pg_dsn, "retried")
    assert 2 == _records(pg_dsn, schema)
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        # The tick finished two hours ago, as far as pruning can tell.
        conn.execute(f"UPDATE \"{schema}\".leases SET finished_at = now() - interval '2h'")
    pruned = pgcrond(setup, pg_dsn, "prune", "--older-than", "1h")
    assert 0 == pruned.returncode, pruned.stderr
    assert 0 == _records(pg_dsn, schema)


def _records(pg_dsn: str, schema: str) -> int:
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        found = conn.execute(f'SELECT count(*) FROM "{schema}".leases_attempts').fetchone()
    assert found is not None
    return int(found[0])
