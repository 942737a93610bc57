"""Each job in its own box, through a real replica: what the box records and says.

The daemon says once at start how it boxes jobs (``job_boxes``); a job
killed over its memory limit is recorded FAIL with that reason; a job with
``user: nobody`` runs as nobody; a secret read from a file reaches the job
and no log line. Where no cgroup is made (``cgroups: never``) the start
line says rlimits and the limits are rlimits.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from tests.helpers.as_nobody import HOG, ROOT_ONLY
from tests.helpers.daemon_harness import Cluster, at, cluster, wait_until

# Starts replicas: the system tier.
pytestmark = [pytest.mark.usefixtures("system_processes"), pytest.mark.timeout(90)]

SECRET = "tok-6b1f0e9d2a"


def finished(running: Cluster, count: int) -> bool:
    rows = running.rows("SELECT 1 FROM {leases} WHERE status IN ('SUCCESS', 'FAIL')")
    return len(rows) >= count


@ROOT_ONLY
def test_a_replica_boxes_each_job_and_records_an_oom_kill_with_its_reason(
    pg_dsn: str, schema: str, tmp_path: Path
) -> None:
    secret = tmp_path / "token"
    secret.write_text(f"{SECRET}\n")
    text = (
        f"database: {{schema: {schema}}}\n"
        "defaults: {misfire_grace: 30s, lease: 20s}\n"
        "jobs:\n"
        f'  hog: {{at: "{at(4)}", limits: {{memory: 64MiB}}, '
        f'command: ["{sys.executable}", -c, "{HOG}"]}}\n'
        f'  whoami: {{at: "{at(4)}", user: nobody, shell: "id -un"}}\n'
        f'  leak: {{at: "{at(4)}", env: {{TOKEN: "${{file:{secret}}}"}}, '
        'shell: "echo token=$TOKEN"}\n'
    )
    with cluster(pg_dsn, schema, tmp_path) as running:
        (replica,) = running.start(running.write_config(text))
        boxes = replica.wait_event("job_boxes")
        wait_until(lambda: finished(running, 3), 30, "the three runs")
        rows = running.rows("SELECT code, status, error FROM {leases} ORDER BY code")
        outputs = {e["job"]: e["line"] for e in replica.events("job_output")}
        log_text = replica.log_path.read_text()
    assert "rlimits" != boxes["by"], boxes["reason"]
    assert [
        {"code": "hog", "status": "FAIL", "error": "killed: memory limit 64MiB exceeded (oom)"},
        {"code": "leak", "status": "SUCCESS", "error": None},
        {"code": "whoami", "status": "SUCCESS", "error": None},
    ] == rows
    assert {"whoami": "nobody", "leak": "token=***"} == outputs
    assert SECRET not in log_text


def test_without_cgroups_the_replica_says_so_once_and_uses_rlimits(
    pg_dsn: str, schema: str, tmp_path: Path
) -> None:
    text = (
        f"database: {{schema: {schema}}}\n"
        "cgroups: never\n"
        "defaults: {misfire_grace: 30s, lease: 20s}\n"
        "jobs:\n"
        f'  files: {{at: "{at(4)}", limits: {{nofile: 77}}, shell: "ulimit -n"}}\n'
    )
    with cluster(pg_dsn, schema, tmp_path) as running:
        (replica,) = running.start(running.write_config(text))
        wait_until(lambda: finished(running, 1), 30, "the run")
        boxes = replica.events("job_boxes")
        outputs = [e["line"] for e in replica.events("job_output")]
    assert [("rlimits", "cgroups: never in the config")] == [(e["by"], e["reason"]) for e in boxes]
    assert "rlimit RLIMIT_NOFILE (each process)" == boxes[0]["limits"]["nofile"]
    assert ["77"] == outputs
