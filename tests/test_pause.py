"""With real replicas, a pause delays a started tick, it never drops it.

Real ``pgcrond run`` processes and the real ``pgcrond pause`` / ``resume``
commands: a takeover due while paused happens after resume, so does a pending
retry, and a run-once job refused ``paused`` at start runs on resume, all
without a replica restarting. Also: the daemon's hourly prune removes old
finished requests.
"""

from __future__ import annotations

import signal
import subprocess
from pathlib import Path

import psycopg
import pytest

from tests.helpers.daemon_harness import LEDGER, PGCROND, Cluster, at, cluster, config, wait_until

# Starts replicas or servers: the system tier.
pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("system_processes")]


def command(running: Cluster, path: Path, *args: str) -> str:
    done = subprocess.run(
        [str(PGCROND), *args, "-c", str(path)],
        check=False,
        env=running.env(),
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert 0 == done.returncode, (done.stdout, done.stderr)
    return done.stdout


def ledger(running: Cluster, phase: str) -> list[dict[str, object]]:
    return running.rows(
        "SELECT job, attempt, pid, phase FROM {ledger} WHERE phase = %s ORDER BY id", phase
    )


def test_a_takeover_due_while_paused_happens_once_resumed(
    pg_dsn: str, schema: str, tmp_path: Path
) -> None:
    with cluster(pg_dsn, schema, tmp_path) as running:
        path = running.write_config(
            config(
                schema,
                f'  long:\n    at: "{at(3)}"\n    entrypoint: {LEDGER}\n'
                "    lease: 3s\n    heartbeat: 1s\n"
                '    env: {LEDGER_SLEEP: "3600"}\n',
            )
        )
        replicas = running.start(path, 2)
        (first,) = wait_until(lambda: ledger(running, "start"), 20, "the run to start")
        owner = next(r for r in replicas if r.pid == first["pid"])
        survivor = next(r for r in replicas if r is not owner)
        command(running, path, "pause", "long", "--reason", "test")
        owner.signal(signal.SIGKILL)
        owner.wait_exit(10)
        # The survivor's re-check at the dead owner's expiry finds the job paused.
        survivor.wait_event(
            "waiting_for_resume",
            timeout=15,
            where=lambda e: e["job"] == "long",
        )
        command(running, path, "resume", "long")
        taken = survivor.wait_event(
            "run_started", timeout=15, where=lambda e: e.get("claimed_from") == "takeover"
        )
        starts = ledger(running, "start")
    assert 2 == taken["attempt"]
    assert [1, 2] == [row["attempt"] for row in starts]
    assert survivor.pid == starts[1]["pid"]


def test_a_retry_due_while_paused_runs_once_resumed(
    pg_dsn: str, schema: str, tmp_path: Path
) -> None:
    with cluster(pg_dsn, schema, tmp_path) as running:
        path = running.write_config(
            config(
                schema,
                f'  flaky:\n    at: "{at(3)}"\n    entrypoint: {LEDGER}\n'
                "    retries: 1\n    retry_delay: 8s\n"
                '    env: {LEDGER_FAIL: "1"}\n',
            )
        )
        (replica,) = running.start(path, 1)
        wait_until(lambda: ledger(running, "fail"), 20, "the first attempt to fail")
        command(running, path, "pause", "flaky")
        replica.wait_event("waiting_for_resume", timeout=15, where=lambda e: e["job"] == "flaky")
        assert 1 == len(ledger(running, "start"))
        command(running, path, "resume", "flaky")
        wait_until(lambda: len(ledger(running, "fail")) == 2, 15, "the retry to run")
        starts = ledger(running, "start")
    assert [1, 2] == [row["attempt"] for row in starts]


def test_a_run_once_job_paused_at_start_runs_on_resume(
    pg_dsn: str, schema: str, tmp_path: Path
) -> None:
    with cluster(pg_dsn, schema, tmp_path) as running:
        path = running.write_config(
            config(schema, f"  seed: {{once: true, entrypoint: {LEDGER}}}\n")
        )
        command(running, path, "pause", "seed")
        (replica,) = running.start(path, 1)
        replica.wait_event("waiting_for_resume", timeout=15, where=lambda e: e["job"] == "seed")
        assert [] == ledger(running, "start")
        command(running, path, "resume", "seed")
        wait_until(lambda: ledger(running, "end"), 15, "the run-once job to run")
        initial = running.rows("SELECT status FROM {leases} WHERE type = 'INITIAL'")
    assert [{"status": "SUCCESS"}] == initial


def test_the_daemons_prune_removes_old_finished_requests(
    pg_dsn: str, schema: str, tmp_path: Path
) -> None:
    with cluster(pg_dsn, schema, tmp_path) as running:
        path = running.write_config(
            config(schema, f'  once:\n    at: "{at(5)}"\n    entrypoint: {LEDGER}\n')
        )
        command(running, path, "migrate")
        with psycopg.connect(pg_dsn, autocommit=True) as conn:
            conn.execute(
                f'INSERT INTO "{schema}".leases_requests (code, run_key, requested_by, '
                "requested_at, taken_by, taken_at, done_at, outcome) VALUES "
                "('once', 'manual:old', 'shell', now() - interval '90 days', 'r', "
                "now() - interval '90 days', now() - interval '90 days', 'success'), "
                "('once', 'manual:new', 'shell', now(), NULL, NULL, NULL, NULL)"
            )
        (replica,) = running.start(path, 1)
        pruned = replica.wait_event("history_pruned", timeout=30)
        with psycopg.connect(pg_dsn, autocommit=True) as conn:
            left = conn.execute(
                f'SELECT run_key FROM "{schema}".leases_requests ORDER BY run_key'
            ).fetchall()
    assert 1 == pruned["requests"]
    assert [("manual:new",)] == left
