"""on_failure: a webhook and a command hear of a run that failed for good, once.

A real daemon, a real local HTTP server (which answers 503 once, so the
webhook's retry is exercised) and a real command; the DSN reaches neither.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from pgcrond.config.loader import load_config
from pgcrond.errors import ConfigError
from tests.helpers.daemon_harness import at, cluster, config, wait_until
from tests.helpers.hook_receiver import Receiver, receiving


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    with receiving(fail_first=True) as found:
        yield found


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
        f"      webhook: {receiver.base}/hook\n"
        f'      command: [/bin/sh, -c, "cat > {out}; env > {out}.env"]\n'
        "      timeout: 5s\n"
    )
    with cluster(pg_dsn, schema, tmp_path) as running:
        (replica,) = running.start(running.write_config(config(schema, jobs)), 1)
        wait_until(lambda: len(receiver.events()) >= 2, 30, "the webhook, retried once after a 503")
        wait_until(lambda: out.with_suffix(".json.env").exists(), 10, "the hook command")
        replica.wait_event("hook_sent", where=lambda e: e.get("hook") == "webhook")
    first, again = receiver.events()[:2]
    assert first == again, "a retry sends the same event"
    assert 2 == len(receiver.events()), "one final failure, one event (plus its retry)"
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
