"""on_failure: a webhook and a command hear of a run that failed for good, once.

A real daemon, a real local HTTP server (which answers 503 once, so the
webhook's retry is exercised) and a real command; the DSN reaches neither.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from pgcrond.config.loader import load_config
from pgcrond.errors import ConfigError
from tests.daemon_harness import cluster, wait_until
from tests.test_daemon import at, config


class Receiver:
    """Records every POST; the first one is answered 503."""

    def __init__(self) -> None:
        self.bodies: list[dict[str, object]] = []
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                length = int(self.headers.get("Content-Length", "0"))
                receiver.bodies.append(json.loads(self.rfile.read(length)))
                self.send_response(503 if len(receiver.bodies) == 1 else 200)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *args: object) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/hook"


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    found = Receiver()
    thread = threading.Thread(target=found.server.serve_forever, daemon=True)
    thread.start()
    yield found
    found.server.shutdown()


@pytest.mark.slow
@pytest.mark.usefixtures("system_processes")
def test_a_final_failure_reaches_the_webhook_and_the_command_once(
    pg_dsn: str, schema: str, tmp_path: Path, receiver: Receiver
) -> None:
    out = tmp_path / "hook.json"
    jobs = (
        "  flaky:\n"
        f'    at: "{at(3)}"\n'
        "    command: [/bin/false]\n"
        "    retries: 1\n"
        "    retry_delay: 200ms\n"
        "    on_failure:\n"
        f"      webhook: {receiver.url}\n"
        f'      command: [/bin/sh, -c, "cat > {out}; env > {out}.env"]\n'
        "      timeout: 5s\n"
    )
    with cluster(pg_dsn, schema, tmp_path) as running:
        (replica,) = running.start(running.write_config(config(schema, jobs)), 1)
        wait_until(lambda: len(receiver.bodies) >= 2, 30, "the webhook, retried once after a 503")
        wait_until(lambda: out.with_suffix(".json.env").exists(), 10, "the hook command")
        replica.wait_event("hook_sent", where=lambda e: e.get("hook") == "webhook")
    first, again = receiver.bodies[:2]
    assert first == again, "a retry sends the same event"
    assert 2 == len(receiver.bodies), "one final failure, one event (plus its retry)"
    assert ("flaky", 2, "fail") == (first["job"], first["attempt"], first["outcome"])
    assert str(first["idempotency_key"]).startswith("v2:")
    assert json.loads(out.read_text()) == first
    environ = out.with_suffix(".json.env").read_text()
    assert "PGCRON_IDEMPOTENCY_KEY=" in environ
    # The daemon's own settings (PGCROND_*, its DSN among them) are stripped.
    assert "PGCROND_" not in environ


def test_a_hook_with_neither_webhook_nor_command_is_a_config_error(tmp_path: Path) -> None:
    path = tmp_path / "jobs.yaml"
    path.write_text(
        "database: {url: 'postgresql://x@127.0.0.1/x'}\n"
        "jobs:\n"
        "  j:\n"
        "    cron: '* * * * *'\n"
        "    command: ['true']\n"
        "    on_failure: {timeout: 5s, webhok: 'http://x'}\n"
    )
    with pytest.raises(ConfigError) as caught:
        load_config([path])
    text = str(caught.value)
    assert "jobs.yaml:6" in text and "did you mean 'webhook'" in text
