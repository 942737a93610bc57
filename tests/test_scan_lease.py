"""A replica that dies during its start-up scan holds no one up for long.

The scan's lease row (``pgcrond:catch-up``) used to have the default 15 min
lease: a replica killed mid-scan made every other replica's scan wait that
long, writing a SKIPPED row per second meanwhile, and record no MISSED rows.
With real ``pgcrond run`` processes and a real PostgreSQL.
"""

from __future__ import annotations

import signal
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

import psycopg
import pytest

from pgcrond.core.schedule import run_key_for
from tests.helpers.daemon_harness import Replica, cli, cluster

# Starts replicas or servers: the system tier.
pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("system_processes")]

JOBS = 100


def scan_rows(dsn: str, schema: str) -> list[tuple[str, str, str | None]]:
    with psycopg.connect(dsn, autocommit=True) as conn:
        return conn.execute(
            f'SELECT owner, status, reason FROM "{schema}".leases '
            "WHERE code = 'pgcrond:catch-up' ORDER BY id"
        ).fetchall()


def test_a_replica_killed_mid_scan_is_taken_over_in_seconds_without_a_row_per_retry(
    pg_dsn: str, schema: str, tmp_path: Path
) -> None:
    with cluster(pg_dsn, schema, tmp_path) as running:
        # A hundred per-minute jobs whose record ended a day ago: 100,000 ticks
        # to record MISSED, a scan of several seconds to kill.
        path = running.write_config(
            "database:\n"
            "  url: ${PGCROND_DATABASE_URL}\n"
            f"  schema: {schema}\n"
            "jobs:\n"
            + "".join(
                f"  job-{n}:\n    cron: '* * * * *'\n    command: ['true']\n" for n in range(JOBS)
            )
        )
        code, _, err = cli(running, "migrate", "-c", str(path))
        assert 0 == code, err
        last = datetime.now(UTC).replace(second=0, microsecond=0) - timedelta(hours=24, minutes=5)
        with psycopg.connect(pg_dsn, autocommit=True) as conn:
            for n in range(JOBS):
                conn.execute(
                    f'INSERT INTO "{schema}".leases (lock_key, type, code, run_key, status, '
                    "owner_token, owner, attempt, fencing_token, lease_ms, created_at, "
                    "acquired_at, heartbeat_at, expires_at, finished_at) "
                    "VALUES (%s, 'SCHEDULE', %s, %s, 'SUCCESS', gen_random_uuid(), 'gone:1', "
                    "1, 1, 1500, %s, %s, %s, %s, %s)",
                    (f"seed:{n}", f"job-{n}", run_key_for(last), *(last,) * 5),
                )
        first = Replica("first", path, tmp_path / "first.log", running.env()).start()
        running.replicas.append(first)
        first.wait_event("catch_up_scan_started", timeout=60)
        first.signal(signal.SIGKILL)
        first.wait_exit(10)
        assert [] == first.events("catch_up_scan_done"), "the scan ended before the kill"
        killed_at = time.monotonic()
        second = Replica("second", path, tmp_path / "second.log", running.env()).start()
        running.replicas.append(second)
        done = second.wait_event("catch_up_scan_done", timeout=120)
        took = time.monotonic() - killed_at
        rows = scan_rows(pg_dsn, schema)
        with psycopg.connect(pg_dsn, autocommit=True) as conn:
            missed = conn.execute(
                f"SELECT count(*) FROM \"{schema}\".leases WHERE status = 'MISSED'"
            ).fetchone()
        second.stop()
    # Well under the 15 min the dead scanner's lease used to last.
    assert took < 90, f"the second scan ended {took:.0f}s after the kill"
    # The dead scanner's row, and the second replica's own: no row per retry.
    assert ["RUNNING", "SUCCESS"] == [status for _, status, _ in rows]
    assert [] == [row for row in rows if row[1] == "SKIPPED"]
    # The scan did its work: the day's ticks, 1,000 a job at most, are recorded.
    assert missed is not None and missed[0] >= JOBS * 990
    assert done["missed_recorded"] > 0
