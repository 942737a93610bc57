"""An ``http:`` header secret never leaks through an error's text.

A ``${VAR}`` header value read from a Secret written with ``echo`` ends in a
newline, and an HTTP library's error for an illegal header value quotes it
(``LocalProtocolError: Illegal header value b'Bearer <token>\\n'``): that text
would be logged, stored in the lease row, shown by status/history and sent to
the failure webhook, on every retry. So one trailing newline of a ``${VAR}``
value is dropped, any other control character is refused with an error that
does not quote the value, and every header secret is scrubbed from whatever
error text an attempt ends with.

A real daemon, a real local HTTP server as the job's target (it answers 500
with the token echoed in its reason phrase where asked to) and a real local
webhook receiver; the token is then looked for in every log line, every row
of every table of the schema, and every webhook body.
"""

from __future__ import annotations

import contextlib
import json
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import psycopg
import pytest

from pgcrond.core.actions import HttpAction
from pgcrond.run.attempt import RunRequest
from pgcrond.run.http_action import HeaderValueRefused, request_headers
from tests.helpers.daemon_harness import Replica, at, cluster, config, wait_until

# Starts replicas or servers: the system tier.
pytestmark = pytest.mark.usefixtures("system_processes")

NEWLINE_TOKEN = "tok-nl-5f1e0c9a7b"
CONTROL_TOKEN = "tok-ctl-9d3b2a18e4"
ECHOED_TOKEN = "tok-echo-77a0c3e1f2"
TOKENS = (NEWLINE_TOKEN, CONTROL_TOKEN, ECHOED_TOKEN)


@dataclass
class Seen:
    requests: list[dict[str, str]] = field(default_factory=list)
    hooks: list[dict[str, Any]] = field(default_factory=list)


@contextlib.contextmanager
def servers() -> Iterator[tuple[str, str, Seen]]:
    """The jobs' target (``/echo`` answers 500 quoting the Authorization header) and a webhook."""
    seen = Seen()

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            length = int(self.headers.get("Content-Length") or 0)
            body = self.rfile.read(length)
            if self.path == "/hook":
                seen.hooks.append(json.loads(body))
                self.send_response(200)
            else:
                seen.requests.append({"path": self.path, **dict(self.headers.items())})
                if self.path == "/echo":
                    # Some servers quote what they refuse; pgcrond must not pass it on.
                    self.send_response(500, f"refused {self.headers['Authorization']}")
                else:
                    self.send_response(200)
            self.send_header("Content-Length", "0")
            self.end_headers()

        def log_message(self, format: str, *args: Any) -> None:
            pass

    httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    base = f"http://127.0.0.1:{httpd.server_address[1]}"
    try:
        yield base, f"{base}/hook", seen
    finally:
        httpd.shutdown()
        httpd.server_close()
        thread.join(5)


def http_job(code: str, url: str, hook: str, header: str) -> str:
    return (
        f"  {code}:\n"
        f'    at: "{at(4)}"\n'
        "    retries: 1\n"
        "    retry_delay: 200ms\n"
        # The tokens are pgcrond's own variables: a job inherits only those it names.
        '    env_passthrough: ["*_TOKEN"]\n'
        f"    http: {{url: '{url}', timeout: 5s, headers: {{{header}}}}}\n"
        f"    on_failure: {{webhook: '{hook}', timeout: 5s}}\n"
    )


def stored_rows(dsn: str, schema: str) -> str:
    """Every row of every table of the schema, as JSON text."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        tables = [
            name
            for (name,) in conn.execute(
                "SELECT table_name FROM information_schema.tables WHERE table_schema = %s",
                (schema,),
            )
        ]
        rows = [
            str(row)
            for table in tables
            for (row,) in conn.execute(f'SELECT row_to_json(t) FROM "{schema}"."{table}" t')
        ]
    assert rows, "the daemon recorded nothing"
    return "\n".join(rows)


@pytest.mark.slow
def test_a_header_secret_reaches_no_log_line_no_stored_row_and_no_webhook_body(
    pg_dsn: str, schema: str, tmp_path: Path
) -> None:
    with servers() as (base, hook, seen), cluster(pg_dsn, schema, tmp_path) as running:
        jobs = (
            http_job("newline", f"{base}/ok", hook, "Authorization: 'Bearer ${NEWLINE_TOKEN}'")
            + http_job("control", f"{base}/ok", hook, "X-Api: '${CONTROL_TOKEN}'")
            + http_job("echoed", f"{base}/echo", hook, "Authorization: 'Bearer ${ECHOED_TOKEN}'")
        )
        path = running.write_config(config(schema, jobs))
        env = {
            **running.env(),
            # As `echo "$TOKEN" > secret` writes them: one newline at the end.
            "NEWLINE_TOKEN": f"{NEWLINE_TOKEN}\n",
            # One newline is forgiven, the second is a character the header cannot hold.
            "CONTROL_TOKEN": f"{CONTROL_TOKEN}\n\n",
            "ECHOED_TOKEN": f"{ECHOED_TOKEN}\r\n",
        }
        replica = Replica("replica-0", path, tmp_path / "replica-0.log", env)
        running.replicas.append(replica.start())
        replica.wait_event("daemon_ready", timeout=30)
        wait_until(lambda: len(seen.hooks) >= 2, 30, "the failure webhooks of two jobs")
        replica.wait_event("run_finished", where=lambda e: e.get("job") == "newline")
        replica.wait_event("hook_sent", where=lambda e: e.get("job") == "echoed")
        replica.wait_event("hook_sent", where=lambda e: e.get("job") == "control")
        log_text = replica.log_path.read_text()
        rows = stored_rows(pg_dsn, schema)
    hooks = {body["job"]: body for body in seen.hooks}
    webhook_text = json.dumps(seen.hooks)
    assert [] == [t for t in TOKENS if t in log_text], "a token in the daemon's log"
    assert [] == [t for t in TOKENS if t in rows], "a token in a stored row"
    assert [] == [t for t in TOKENS if t in webhook_text], "a token in a webhook body"
    # The newline was the echo's: dropped, and the request went out and succeeded.
    (sent,) = [r for r in seen.requests if r["path"] == "/ok"]
    assert f"Bearer {NEWLINE_TOKEN}" == sent["Authorization"]
    assert {"control", "echoed"} == set(hooks)
    # Refused before sending, without a retry (the environment will not change),
    # and the error says what to fix without the value.
    assert 1 == hooks["control"]["attempt"]
    assert (
        "http: header X-Api: the value from ${CONTROL_TOKEN} holds a control character "
        "(only one trailing newline is dropped); the value is not shown"
    ) == hooks["control"]["error"]
    # The server quoted the token back: the error keeps the status, not the secret.
    assert 2 == hooks["echoed"]["attempt"]
    assert "http: 500 refused ***" == hooks["echoed"]["error"]
    assert 2 == len([r for r in seen.requests if r["path"] == "/echo"])


def run_request() -> RunRequest:
    from datetime import UTC, datetime

    return RunRequest(
        job="j",
        action=HttpAction("http://x"),
        run_key="k",
        fire_time=datetime(2026, 1, 1, tzinfo=UTC),
        attempt=1,
        idempotency_key="v2:k",
        idempotency_key_hex="00",
        fencing_token=7,
    )


@pytest.mark.parametrize(
    ("value", "sent"),
    [
        ("s3cret\n", "Bearer s3cret"),
        ("s3cret\r\n", "Bearer s3cret"),
        ("s3cret", "Bearer s3cret"),
    ],
)
def test_one_trailing_newline_of_a_variable_is_dropped(value: str, sent: str) -> None:
    action = HttpAction("http://x", headers={"Authorization": "Bearer ${T}"})
    headers = request_headers(action, run_request(), {"T": value})
    assert sent == headers["Authorization"]


@pytest.mark.parametrize(
    "value",
    ["s3cret\n\n", "s3\ncret", "s3cret\r", "s3\x00cret", "s3\x7fcret", "s3\x1bcret", "s3crét"],
)
def test_any_other_character_a_header_cannot_carry_is_refused_without_the_value(
    value: str,
) -> None:
    action = HttpAction("http://x", headers={"Authorization": "Bearer ${T}"})
    with pytest.raises(HeaderValueRefused) as caught:
        request_headers(action, run_request(), {"T": value})
    assert "s3" not in str(caught.value)
    assert str(caught.value).startswith("header Authorization: the value from ${T} holds")


def test_a_secret_is_scrubbed_as_written_and_as_a_message_quotes_it() -> None:
    from pgcrond.core.redaction import scrub

    error = "http: LocalProtocolError: Illegal header value b'Bearer tok-1\\n' (str: 'tok-1\\n')"
    assert "http: LocalProtocolError: Illegal header value b'***' (str: '***')" == scrub(
        error, ["Bearer tok-1\n", "tok-1\n"]
    )
