"""`pgcrond trigger CODE` runs the job on the cluster and waits for its outcome.

By default the command records a request that a daemon replica takes, follows
it (taken, run_started, the outcome) and exits with the run's result: 0 when it
succeeded, 1 when it failed (with the kept tail of its output), 3 when it did
not run. ``--no-wait`` returns at once; ``--here`` runs it in the caller's
process, as the command did before it ran on the cluster.
"""

from __future__ import annotations

import json
import subprocess
import time
from pathlib import Path

import pytest

from tests.helpers.daemon_harness import PGCROND, Cluster, cluster, quiet_cron, wait_until

pytestmark = pytest.mark.usefixtures("system_processes")


def jobs_config(schema: str) -> str:
    # Never fired by their schedule during a run of the suite: only the triggers run them.
    cron = quiet_cron()
    return (
        "database:\n"
        "  url: ${PGCROND_DATABASE_URL}\n"
        f"  schema: {schema}\n"
        "jobs:\n"
        f'  fine: {{cron: "{cron}", shell: "echo fine from $PGCRON_JOB"}}\n'
        f'  broken: {{cron: "{cron}", shell: "echo the disk is full >&2; exit 7"}}\n'
    )


def trigger(running: Cluster, path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(PGCROND), "trigger", "-c", str(path), *args],
        capture_output=True,
        text=True,
        env=running.env(),
        timeout=60,
        check=False,
    )


def owners(running: Cluster, run_key: str) -> list[tuple[str, str]]:
    return [
        (row["owner"], row["status"])
        for row in running.rows("SELECT owner, status FROM {leases} WHERE run_key = %s", run_key)
    ]


def test_trigger_waits_for_the_replica_that_runs_the_job_and_exits_with_its_result(
    pg_dsn: str, schema: str, tmp_path: Path
) -> None:
    with cluster(pg_dsn, schema, tmp_path) as running:
        path = running.write_config(jobs_config(schema))
        [replica] = running.start(path)
        replica.wait_event("registry_joined")

        started = time.monotonic()
        ok = trigger(running, path, "fine", "--run-key", "manual:ok")
        took = time.monotonic() - started
        failed = trigger(running, path, "broken", "--run-key", "manual:bad")
        as_json = trigger(running, path, "fine", "--run-key", "manual:json", "-o", "json")
        replica_name = replica.wait_event("daemon_ready")["replica"]

        assert 0 == ok.returncode, ok.stdout + ok.stderr
        lines = ok.stdout.splitlines()
        assert lines[0].startswith("fine manual:ok: requested")
        assert f"taken by {replica_name}" in lines
        assert f"run_started on {replica_name}, attempt 1" in lines
        assert "fine manual:ok: success" == lines[-1]
        # It ran on the replica, not in the shell: the shell printed no log line of a run.
        assert [(replica_name, "SUCCESS")] == owners(running, "manual:ok")
        assert "run_finished" not in ok.stderr
        assert took < 20, took

        assert 1 == failed.returncode, failed.stdout + failed.stderr
        assert "broken manual:bad: fail: exit status 7" in failed.stdout
        assert "the disk is full" in failed.stdout  # the kept output tail, stderr first

        assert 0 == as_json.returncode, as_json.stderr
        document = json.loads(as_json.stdout)
        assert {"outcome": "success", "ran_here": False, "ran_on": replica_name} == {
            key: document[key] for key in ("outcome", "ran_here", "ran_on")
        }


def test_trigger_no_wait_returns_at_once_and_here_runs_in_this_process(
    pg_dsn: str, schema: str, tmp_path: Path
) -> None:
    with cluster(pg_dsn, schema, tmp_path) as running:
        path = running.write_config(jobs_config(schema))
        assert (
            0
            == subprocess.run(
                [str(PGCROND), "migrate", "-c", str(path)], env=running.env(), check=False
            ).returncode
        )

        # No replica runs: waiting would never end, so the command says so and exits 3.
        # (Another job than the one asked for below: both requests run at the replica's
        # start, and two runs of one job at once are one too many under concurrency: forbid.)
        nobody = trigger(running, path, "broken", "--run-key", "manual:nobody")
        assert 3 == nobody.returncode, nobody.stdout + nobody.stderr
        assert "no live replica runs broken" in nobody.stdout
        assert "--here" in nobody.stdout

        here = trigger(running, path, "fine", "--here", "--run-key", "manual:here")
        assert 0 == here.returncode, here.stderr
        assert "fine manual:here: ran here: success" in here.stdout
        assert [("SUCCESS",)] == [(s,) for _, s in owners(running, "manual:here")]
        assert "run_finished" in here.stderr  # its log lines in this terminal: it ran here

        no_wait = trigger(running, path, "fine", "--no-wait", "--run-key", "manual:later")
        assert 0 == no_wait.returncode, no_wait.stderr
        assert "fine manual:later: requested" in no_wait.stdout
        assert [] == owners(running, "manual:later")  # not run: nothing ran it yet

        # The requests wait for a replica: the first that starts runs both.
        [replica] = running.start(path)
        wait_until(
            lambda: [s for _, s in owners(running, "manual:later")] == ["SUCCESS"] or None,
            30,
            "the requested run",
        )
        replica_name = replica.wait_event("daemon_ready")["replica"]
        assert [(replica_name, "SUCCESS")] == owners(running, "manual:later")
