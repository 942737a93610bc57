"""Acceptance: what operators and platforms see of real replicas.

`pgcrond trigger` from several shells, /metrics and /readyz of a running
daemon, and a killed daemon taking its job's process with it.
"""

from __future__ import annotations

import signal
import subprocess
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from pgcrond.storage.embedded import LocalServer
from tests.helpers.daemon_harness import (
    LEDGER,
    PGCROND,
    at,
    clear_of_a_minute_edge,
    cluster,
    config,
    quiet_cron,
    wait_until,
)
from tests.helpers.http import answer

pytestmark = pytest.mark.slow


def get(url: str) -> tuple[int, str]:
    response = answer(url, timeout=5)
    return response.status_code, response.text


def samples(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    return {
        (sample.name, tuple(sorted(sample.labels.items()))): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    }


def test_trigger_from_three_shells_at_once_runs_the_job_once(
    pg_dsn: str, schema: str, tmp_path: Path
) -> None:
    jobs = (
        "  report:\n"
        f'    cron: "{quiet_cron()}"\n'
        f"    entrypoint: {LEDGER}\n"
        '    env: {LEDGER_SLEEP: "1"}\n'
    )
    with cluster(pg_dsn, schema, tmp_path) as running:
        path = running.write_config(config(schema, jobs))
        clear_of_a_minute_edge()
        shells = [
            subprocess.Popen(
                [
                    str(PGCROND),
                    "trigger",
                    "--here",
                    "-c",
                    str(path),
                    "report",
                    "--log-format",
                    "json",
                ],
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                env=running.env(),
                text=True,
            )
            for _ in range(3)
        ]
        results = [
            (shell.wait(60), shell.stdout.read() if shell.stdout else "") for shell in shells
        ]
        starts = running.rows("SELECT * FROM {ledger} WHERE phase = 'start'")
        leases = running.rows("SELECT * FROM {leases}")
    codes = sorted(code for code, _ in results)
    assert [0, 3, 3] == codes, results
    assert 1 == len(starts)
    assert starts[0]["run_key"].startswith("manual:")
    assert 1 == len(leases)
    assert "SUCCESS" == leases[0]["status"]
    winner_output = next(out for code, out in results if code == 0)
    assert "ran here: success" in winner_output


@pytest.mark.usefixtures("system_processes")
def test_metrics_of_a_running_daemon_move_after_runs(
    pg_dsn: str, schema: str, tmp_path: Path
) -> None:
    jobs = f'  every: {{cron: "* * * * * *", entrypoint: {LEDGER}}}\n'
    with cluster(pg_dsn, schema, tmp_path) as running:
        (replica,) = running.start(running.write_config(config(schema, jobs)), 1)
        url = f"http://{replica.http_address()}/metrics"

        def two_successes() -> dict[tuple[str, tuple[tuple[str, str], ...]], float] | None:
            found = samples(get(url)[1])
            key = ("pgcrond_runs_total", (("cronjob", "every"), ("outcome", "success")))
            return found if found.get(key, 0) >= 2 else None

        found = wait_until(two_successes, 15, "two successful runs in /metrics")
    job = (("cronjob", "every"),)
    assert found[("pgcrond_fires_total", job)] >= 2
    assert found[("pgcrond_wins_total", job)] >= 2
    assert found[("pgcrond_fire_lateness_seconds_count", ())] >= 2
    assert found[("pgcrond_run_duration_seconds_count", ())] >= 2
    assert found[("pgcrond_job_last_run_duration_seconds", job)] >= 0
    assert found[("pgcrond_job_last_success_timestamp_seconds", job)] > 0
    assert 0 == found[("pgcrond_job_consecutive_failures", job)]


def test_readyz_follows_the_database_down_and_back(
    own_server: LocalServer, schema: str, tmp_path: Path
) -> None:
    jobs = '  nightly: {cron: "0 3 * * *", command: ["/bin/true"]}\n'
    with cluster(own_server.dsn, schema, tmp_path) as running:
        (replica,) = running.start(running.write_config(config(schema, jobs)), 1)
        base = f"http://{replica.http_address()}"
        assert 200 == get(f"{base}/readyz")[0]
        own_server.stop()
        wait_until(lambda: get(f"{base}/readyz")[0] == 503, 15, "/readyz to turn 503")
        assert 200 == get(f"{base}/healthz")[0]
        own_server.start()
        wait_until(lambda: get(f"{base}/readyz")[0] == 200, 30, "/readyz to turn 200 again")


@pytest.mark.usefixtures("system_processes")
def test_a_killed_daemon_takes_its_job_process_with_it(
    pg_dsn: str, schema: str, tmp_path: Path
) -> None:
    pid_file = tmp_path / "job.pid"
    jobs = f"  long:\n    at: \"{at(2)}\"\n    shell: 'echo $$ > {pid_file}; exec sleep 60'\n"
    with cluster(pg_dsn, schema, tmp_path) as running:
        (replica,) = running.start(running.write_config(config(schema, jobs)), 1)
        job_pid = int(
            wait_until(
                lambda: pid_file.exists() and pid_file.read_text().strip(), 20, "the job to start"
            )
        )
        replica.signal(signal.SIGKILL)
        replica.wait_exit(10)

        def gone() -> bool:
            try:
                state = Path(f"/proc/{job_pid}/stat").read_text().split()[2]
            except FileNotFoundError:
                return True
            return state == "Z"

        # Fails the test unless the job dies with its daemon.
        wait_until(gone, 5, "the orphaned job process to die")


@pytest.mark.usefixtures("system_processes")
def test_the_database_password_reaches_neither_logs_nor_jobs(
    pg_dsn: str, schema: str, tmp_path: Path
) -> None:
    # The test server trusts local connections, so any password is accepted.
    secret = "s3cret-pw-4711"
    with_password = pg_dsn.replace("postgres@", f"postgres:{secret}@")
    assert secret in with_password
    env_dump = tmp_path / "job.env"
    jobs = f"  dump: {{at: \"{at(2)}\", shell: 'env > {env_dump}'}}\n"
    with cluster(with_password, schema, tmp_path) as running:
        running.ledger_dsn = pg_dsn
        (replica,) = running.start(running.write_config(config(schema, jobs)), 1)
        replica.wait_event("run_finished", timeout=20)
        replica.signal(signal.SIGTERM)
        assert 0 == replica.wait_exit(30)
        log = replica.log_path.read_text()
    assert "postgres:***@" in log
    assert secret not in log
    dumped = env_dump.read_text()
    assert "PGCRON_IDEMPOTENCY_KEY=v2:" in dumped
    assert secret not in dumped
    assert "PGCROND_DATABASE_URL" not in dumped
