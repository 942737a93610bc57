"""Passwords over plain HTTP are judged on the listener ``pgcrond run`` binds.

``run --http`` (as the image and the Kubernetes manifest pass it) beats
``http.listen``; a config whose own listener is loopback, with ``http.users``,
must not start on ``--http 0.0.0.0:…`` without TLS, a trusted proxy or the
explicit opt-out, nor take such a config on a reload. Real ``pgcrond run``
processes.
"""

from __future__ import annotations

import os
import signal
import subprocess
from pathlib import Path

import pytest

from tests.helpers.browser import self_signed
from tests.helpers.daemon_harness import PGCROND, ROOT, Replica, cluster, config
from tests.helpers.http import status_of
from tests.helpers.status_page import basic, users_section

pytestmark = pytest.mark.usefixtures("system_processes")

JOBS = "  nightly:\n    cron: '0 3 * * *'\n    command: ['/bin/true']\n"
EVERY_INTERFACE = ["--http", "0.0.0.0:0"]


def test_run_on_every_interface_refuses_passwords_over_plain_http_and_says_the_ways_out(
    tmp_path: Path,
) -> None:
    path = tmp_path / "jobs.yaml"
    # http.listen is the loopback default: only --http exposes the passwords.
    path.write_text(config("pgcrond", JOBS, extra=users_section()))
    env = {k: v for k, v in os.environ.items() if not k.startswith("PGCROND_")}
    env["PGCROND_DATABASE_URL"] = "postgresql://nobody@127.0.0.1:1/never"
    done = subprocess.run(
        [str(PGCROND), "run", "-c", str(path), *EVERY_INTERFACE],
        capture_output=True, text=True, env=env, cwd=ROOT, timeout=60, check=False,
    )  # fmt: skip
    assert 2 == done.returncode, done.stderr
    assert "Traceback" not in done.stderr
    assert f"{path}:" in done.stderr and "http.users" in done.stderr
    assert "0.0.0.0:0 (run --http) is not loopback and serves plain HTTP" in done.stderr
    for way_out in ("http.tls", "http.trusted_proxies", "http.allow_plaintext_passwords: true"):
        assert way_out in done.stderr
    assert "pgcrond did not start" in done.stderr


@pytest.mark.parametrize("way_out", ["opt-out", "tls"])
def test_run_on_every_interface_serves_passwords_with_tls_or_the_opt_out(
    pg_dsn: str, schema: str, tmp_path: Path, way_out: str
) -> None:
    if way_out == "tls":
        cert, key, _ = self_signed(tmp_path, "replica")
        scheme, extra = "https", f"  tls: {{cert: '{cert}', key: '{key}'}}\n"
    else:
        scheme, extra = "http", "  allow_plaintext_passwords: true\n"
    with cluster(pg_dsn, schema, tmp_path) as running:
        path = running.write_config(config(schema, JOBS, extra=users_section() + extra))
        replica = Replica(
            "replica-0", path, tmp_path / "replica-0.log", running.env(), extra_args=EVERY_INTERFACE
        ).start()
        running.replicas.append(replica)
        port = replica.http_address().rsplit(":", 1)[1]
        assert 200 == status_of(f"{scheme}://127.0.0.1:{port}/status", basic())
        if way_out == "opt-out":
            # Without it, a reload is refused: the listener bound is still every interface.
            running.write_config(config(schema, JOBS, extra=users_section()))
            replica.signal(signal.SIGHUP)
            [error] = replica.wait_event("config_reload_rejected")["errors"]
            assert "0.0.0.0:0 (run --http) is not loopback" in error
            assert 200 == status_of(f"{scheme}://127.0.0.1:{port}/status", basic())
