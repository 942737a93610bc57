"""``http:`` jobs against a real local HTTP server, through the real lease guard."""

from __future__ import annotations

import contextlib
import http.server
import json
import textwrap
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
import structlog

from pgcrond.config.loader import load_config
from pgcrond.config.models import JobConfig
from pgcrond.core.actions import HttpAction
from pgcrond.core.keys import Identity
from pgcrond.core.schedule import run_key_for
from pgcrond.errors import ConfigError
from pgcrond.fire import Fire, Firing
from pgcrond.guard import Guards
from pgcrond.run.http_action import redact_headers
from pgcrond.storage.db import Database
from pgcrond.storage.leases import LeaseStore
from pgcrond.storage.migrate import migrate


@dataclass
class Recorded:
    """What the server saw, and what it answers next (a status, or a status and headers)."""

    answers: list[tuple[int, dict[str, str]]]
    requests: list[dict[str, Any]] = field(default_factory=list)


@contextlib.contextmanager
def server(answers: list[tuple[int, dict[str, str]]]) -> Iterator[tuple[str, Recorded]]:
    seen = Recorded(list(answers))

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            length = int(self.headers.get("Content-Length") or 0)
            seen.requests.append(
                {
                    "at": time.monotonic(),
                    "path": self.path,
                    "headers": dict(self.headers.items()),
                    "body": self.rfile.read(length).decode(),
                }
            )
            status, headers = seen.answers.pop(0) if seen.answers else (200, {})
            self.send_response(status)
            for name, value in headers.items():
                self.send_header(name, value)
            self.send_header("Content-Length", "0")
            self.end_headers()

        def log_message(self, format: str, *args: Any) -> None:
            pass

    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{httpd.server_address[1]}", seen
    finally:
        httpd.shutdown()
        httpd.server_close()
        thread.join(5)


def job(tmp_path: Path, dsn: str, schema: str, definition: str) -> JobConfig:
    path = tmp_path / "jobs.yaml"
    body = "".join(f"    {line}\n" for line in definition.splitlines())
    path.write_text(f"database: {{url: '{dsn}', schema: {schema}}}\njobs:\n  call:\n{body}")
    return load_config([path], environ={"API_TOKEN": "s3cret"}).jobs["call"]


async def fire(dsn: str, schema: str, job: JobConfig) -> tuple[str, list[Any], Identity, Any]:
    db = Database(dsn)
    await db.open()
    try:
        store = LeaseStore(db, schema=schema)
        await migrate(store)
        firing = Firing(guards=Guards(store, db).for_job, replica="t:1")
        tick = datetime.now(UTC).replace(microsecond=0)
        identity = Identity.schedule(job.code, run_key_for(tick))
        with structlog.testing.capture_logs() as logs:
            outcome = await firing.fire(Fire(job, tick, identity))
        row = await db.fetchone(
            f'SELECT status, attempt, fencing_token, error FROM "{schema}".leases '
            "WHERE code = 'call'"
        )
    finally:
        await db.close()
    return outcome, logs, identity, row


def definition(url: str, extra: str = "") -> str:
    return (
        'cron: "* * * * *"\n'
        "retries: 2\n"
        "retry_delay: 100ms\n"
        "env: {API_TOKEN: s3cret}\n"
        "http:\n"
        f"  url: {url}/invoices/run?token=abc\n"
        "  headers: {Authorization: 'Bearer ${API_TOKEN}', X-Api-Key: ak-7f3a9c, X-Team: billing}\n"
        '  body: \'{"since": "yesterday"}\'\n'
        "  timeout: 5s\n"
        f"{extra}"
    )


async def test_a_503_is_retried_under_the_same_key_and_the_run_succeeds(
    pg_dsn: str, schema: str, tmp_path: Path
) -> None:
    with server([(503, {"Retry-After": "1"})]) as (url, seen):
        call = job(tmp_path, pg_dsn, schema, definition(url))
        outcome, logs, identity, row = await fire(pg_dsn, schema, call)
    first, second = seen.requests
    assert "success" == outcome
    assert {"status": "SUCCESS", "attempt": 2} == {k: row[k] for k in ("status", "attempt")}
    assert identity.idempotency_key == first["headers"]["Idempotency-Key"]
    assert identity.idempotency_key == second["headers"]["Idempotency-Key"]
    # Each attempt carries its own claim's fencing token; the second's is newer.
    tokens = [int(r["headers"]["X-Fencing-Token"]) for r in (first, second)]
    assert tokens[0] < tokens[1] == row["fencing_token"]
    assert "Bearer s3cret" == second["headers"]["Authorization"]
    assert '{"since": "yesterday"}' == second["body"]
    # Retry-After: 1 beat the job's 100 ms retry delay.
    assert second["at"] - first["at"] >= 0.95
    statuses = [e["status"] for e in logs if e["event"] == "http_response"]
    assert [503, 200] == statuses
    assert all(e["duration_ms"] >= 0 for e in logs if e["event"] == "http_response")


async def test_secrets_in_headers_and_the_url_never_reach_the_log(
    pg_dsn: str, schema: str, tmp_path: Path
) -> None:
    with server([]) as (url, _):
        call = job(tmp_path, pg_dsn, schema, definition(url))
        with structlog.testing.capture_logs():
            _, logs, identity, _ = await fire(pg_dsn, schema, call)
    text = json.dumps(logs, default=str)
    assert "s3cret" not in text and "ak-7f3a9c" not in text and "token=abc" not in text
    (sent,) = [e for e in logs if e["event"] == "http_request"]
    assert "***" == sent["headers"]["Authorization"] == sent["headers"]["X-Api-Key"]
    assert "billing" == sent["headers"]["X-Team"]
    assert identity.idempotency_key == sent["headers"]["Idempotency-Key"]
    assert sent["url"].endswith("/invoices/run?token=***")


def test_headers_are_redacted_by_name() -> None:
    shown = redact_headers(
        {
            "Authorization": "a",
            "Cookie": "b",
            "Set-Cookie": "c",
            "X-Auth-Token": "d",
            "Api-Key": "e",
            "Idempotency-Key": "v2:x",
            "Accept": "f",
        },
        keep=("Idempotency-Key",),
    )
    assert {
        "Authorization": "***",
        "Cookie": "***",
        "Set-Cookie": "***",
        "X-Auth-Token": "***",
        "Api-Key": "***",
        "Idempotency-Key": "v2:x",
        "Accept": "f",
    } == shown


async def test_a_client_error_is_not_retried(pg_dsn: str, schema: str, tmp_path: Path) -> None:
    with server([(400, {})]) as (url, seen):
        call = job(tmp_path, pg_dsn, schema, definition(url))
        outcome, _, _, row = await fire(pg_dsn, schema, call)
    assert "fail" == outcome
    assert 1 == len(seen.requests)
    assert ("FAIL", 1) == (row["status"], row["attempt"])
    assert row["error"].startswith("http: 400 Bad Request (not retried")


async def test_expect_names_the_statuses_that_mean_success(
    pg_dsn: str, schema: str, tmp_path: Path
) -> None:
    with server([(202, {})]) as (url, seen):
        call = job(tmp_path, pg_dsn, schema, definition(url, "  expect: [202]\n"))
        outcome, _, _, row = await fire(pg_dsn, schema, call)
    assert ("success", "SUCCESS", 1) == (outcome, row["status"], len(seen.requests))


async def test_a_refused_connection_is_transient_and_retried(
    pg_dsn: str, schema: str, tmp_path: Path
) -> None:
    with server([]) as (url, _):
        pass  # the port is closed again: connections are refused
    call = job(tmp_path, pg_dsn, schema, definition(url))
    outcome, logs, _, row = await fire(pg_dsn, schema, call)
    failed = [e for e in logs if e["event"] == "http_failed"]
    assert "fail" == outcome
    assert 3 == row["attempt"] == len(failed)
    assert failed[0]["error"].startswith("http: ConnectError")


def test_http_config_is_checked_field_by_field(tmp_path: Path) -> None:
    path = tmp_path / "jobs.yaml"
    path.write_text(
        "database: {url: 'postgresql://u@db/app'}\n"
        "jobs:\n"
        "  call:\n"
        '    cron: "* * * * *"\n'
        "    http:\n"
        "      url: ftp://x\n"
        "      methd: GET\n"
        "      expect: [200, 700]\n"
        "      max_response: 16\n"
    )
    with pytest.raises(ConfigError) as caught:
        load_config([path])
    found = [(i.line, i.field, i.message) for i in caught.value.issues]
    assert [
        (6, "http", "url: must start with http:// or https://, got 'ftp://x'"),
        (7, "http", "unknown key 'methd'; did you mean 'method'?"),
        (8, "http", "expect: must be HTTP status codes (100-599), got a number (700)"),
        (9, "http", "max_response: '16' is not a size with a unit, like 512MiB, 2GiB or 500MB"),
    ] == sorted(found)


def test_the_configuration_docs_example_of_max_response_loads(tmp_path: Path) -> None:
    text = (Path(__file__).resolve().parent.parent / "docs" / "configuration.md").read_text()
    section = text[text.index("### Actions") :]
    example = section[section.index("```yaml\n") + 8 : section.index("```\n", 8)]
    path = tmp_path / "jobs.yaml"
    path.write_text("database: {url: 'postgresql://x@127.0.0.1/x'}\n" + textwrap.dedent(example))
    action = load_config([path]).jobs["refresh"].action
    assert isinstance(action, HttpAction)
    assert 1 << 20 == action.max_response


def test_an_http_action_has_its_defaults(tmp_path: Path) -> None:
    call = job(
        tmp_path, "postgresql://u@db/app", "s", 'cron: "* * * * *"\nhttp: {url: "https://x"}'
    )
    assert HttpAction("https://x") == call.action
    assert isinstance(call.action, HttpAction)
    assert ("POST", timedelta(seconds=30)) == (call.action.method, call.action.timeout)
