"""The database's clock decides what is missed, never a replica's.

A replica whose wall clock runs ahead of the database (or stepped forward)
must not record a tick MISSED before its deadline by the database's clock:
such a row refuses every replica's claim of the tick (``done``), so the tick
would never run anywhere. Against a real PostgreSQL, and with real ``pgcrond
run`` replicas, one of them under the wall-clock shim.
"""

from __future__ import annotations

import asyncio
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

import psycopg
import pytest

from pgcrond.config.loader import load_config
from pgcrond.core.keys import Identity
from pgcrond.core.schedule import run_key_for
from pgcrond.fire import Fire, Firing
from pgcrond.guard.lease import LeaseGuard
from pgcrond.storage import ticks
from pgcrond.storage.leases import LeaseStore
from tests.faults.clockshift import ShimUnavailable, build, shifted
from tests.helpers.daemon_harness import Replica, cluster, wait_until
from tests.helpers.store import accounting, database_now

# Starts replicas or servers: the system tier.
pytestmark = pytest.mark.usefixtures("system_processes")

GRACE = timedelta(seconds=2)


async def test_a_tick_before_its_deadline_by_the_database_clock_is_never_recorded_missed(
    store: LeaseStore,
) -> None:
    """The statement that records MISSED checks the deadline itself: no caller can get past it."""
    now = await ticks.database_now(store)
    base = now.replace(microsecond=0)
    misses = [
        # Long past its deadline: a miss.
        ticks.Miss("j", base - timedelta(seconds=30), "no_replica", "gone", GRACE),
        # In the past, but still inside its misfire_grace: it may still run.
        ticks.Miss("j", base - timedelta(seconds=1), "no_replica", "gone", GRACE),
        # In the future: a replica whose clock runs ahead thinks it is old.
        ticks.Miss("j", base + timedelta(seconds=40), "no_replica", "gone", GRACE),
        ticks.Miss("j", base + timedelta(seconds=50), "late", "too late", GRACE),
    ]
    recorded = await ticks.record_missed(store, misses)
    assert [base - timedelta(seconds=30)] == [m.tick for m in recorded]


def job_config(tmp_path: Path) -> Path:
    path = tmp_path / "jobs.yaml"
    path.write_text(
        "database: {url: 'postgresql://unused@127.0.0.1/x'}\n"
        "jobs:\n"
        "  j: {cron: '* * * * * *', command: ['true'], lease: 1500ms, misfire_grace: 2s}\n"
    )
    return path


async def test_a_fire_the_replica_clock_calls_late_is_judged_by_the_database_and_runs(
    store: LeaseStore, pg_dsn: str, schema: str, tmp_path: Path
) -> None:
    """After a forward clock step the fire's own clock says "late": the claim decides, not it."""
    config = load_config([job_config(tmp_path)])
    job = config.jobs["j"]
    ahead = timedelta(minutes=10)
    firing = Firing(
        guards=lambda _: LeaseGuard(store),
        replica="ahead:1",
        clock=lambda: datetime.now(UTC) + ahead,
    )
    tasks: set[asyncio.Task[object]] = set()
    firing.events = accounting(store, config, firing, tasks)
    # A tick one second ahead of the database: ten minutes old by the fire's clock.
    tick = (await ticks.database_now(store)).replace(microsecond=0) + timedelta(seconds=1)
    identity = Identity.schedule("j", run_key_for(tick))
    outcome = await firing.fire(Fire(job, tick, identity))
    await asyncio.gather(*tasks)
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        rows = conn.execute(f'SELECT status, reason FROM "{schema}".leases').fetchall()
    assert "success" == outcome
    assert [("SUCCESS", None)] == rows


@pytest.fixture(scope="module")
def shim(tmp_path_factory: pytest.TempPathFactory) -> Path:
    try:
        return build(tmp_path_factory.mktemp("clockshift"))
    except ShimUnavailable as exc:
        pytest.fail(str(exc))


@pytest.mark.slow
def test_a_replica_whose_clock_runs_ahead_records_no_future_tick_missed_and_the_ticks_run(
    pg_dsn: str, schema: str, tmp_path: Path, shim: Path
) -> None:
    """A replica 30 s ahead (misfire_grace 5 s) starts beside a healthy one.

    Its start-up scan used to record the next ~25 ticks MISSED/no_replica:
    ticks still in the future by the database's clock, which then never ran.
    """
    with cluster(pg_dsn, schema, tmp_path) as running:
        path = running.write_config(
            "database:\n"
            "  url: ${PGCROND_DATABASE_URL}\n"
            f"  schema: {schema}\n"
            "jobs:\n"
            "  tick:\n"
            '    cron: "* * * * * *"\n'
            "    entrypoint: tests.ledger_jobs:record\n"
            "    misfire_grace: 5s\n"
            "    lease: 1500ms\n"
        )
        [healthy] = running.start(path, 1)
        wait_until(
            lambda: running.rows("SELECT 1 FROM {leases} WHERE status = 'SUCCESS'"),
            20,
            "the healthy replica to run a tick",
        )
        fast = Replica(
            "fast",
            path,
            tmp_path / "fast.log",
            shifted(running.env(), shim, 30_000),
        ).start()
        running.replicas.append(fast)
        fast.wait_event("catch_up_scan_done", timeout=30)
        scanned = database_now(pg_dsn)
        # Ticks up to 8 s after the scan: each must have come and gone.
        until = scanned.replace(microsecond=0) + timedelta(seconds=8)
        while database_now(pg_dsn) < until + timedelta(seconds=2):
            time.sleep(0.2)
        rows = running.rows(
            "SELECT run_key, status, reason, owner, acquired_at, created_at FROM {leases} "
            "WHERE run_key <= %s ORDER BY run_key",
            run_key_for(until),
        )
        healthy.stop()
        fast.stop()
    early = [
        (r["run_key"], r["reason"], r["owner"])
        for r in rows
        if r["status"] == "MISSED" and r["acquired_at"] + timedelta(seconds=5) > r["created_at"]
    ]
    # No MISSED row written before its tick's deadline by the database's clock.
    assert [] == early
    # Nothing was missed for want of a replica: one ran all along.
    assert [] == [r["run_key"] for r in rows if r["reason"] == "no_replica"]
    # And the ticks after the scan ran.
    after = [r for r in rows if r["run_key"] > run_key_for(scanned)]
    assert len(after) >= 8
    assert {"SUCCESS"} == {r["status"] for r in after}
