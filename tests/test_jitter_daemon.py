"""Acceptance: a jittered job fires at tick + its stable shift, under the tick's run key.

Two ``pgcrond run`` replicas, a per-second job with ``jitter: 900ms``: each
tick runs once, started no earlier than its shifted fire time by the
database's clock (the claim is refused as not due before it), within a few
hundred ms of it, and under the tick's own run key and idempotency key.
"""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest

from pgcrond.core.jitter import jitter_shift
from pgcrond.core.keys import Identity
from pgcrond.core.schedule import tick_of
from tests.helpers.daemon_harness import LEDGER, cluster, config, wait_until

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("system_processes")]

JITTER = timedelta(milliseconds=900)


def shift_of(row: dict[str, Any]) -> timedelta:
    tick = tick_of(row["run_key"])
    assert tick is not None
    return jitter_shift("spread", tick, JITTER)


def test_a_jittered_per_second_job_starts_at_tick_plus_shift_and_keeps_its_run_key(
    pg_dsn: str, schema: str, tmp_path: Path
) -> None:
    jobs = f'  spread: {{cron: "* * * * * *", jitter: 900ms, entrypoint: {LEDGER}}}\n'
    with cluster(pg_dsn, schema, tmp_path) as running:
        replicas = running.start(running.write_config(config(schema, jobs)), 2)

        def enough() -> list[dict[str, Any]] | None:
            rows = running.rows("SELECT * FROM {ledger} WHERE phase = 'start' ORDER BY run_key")
            # Some tick with a shift large enough that starting at the tick would show.
            big = any(shift_of(row) >= timedelta(milliseconds=300) for row in rows)
            return rows if len(rows) >= 4 and big else None

        starts = wait_until(enough, 30, "four jittered runs, one shifted by 300 ms or more")
        leases = {
            row["run_key"]: row for row in running.rows("SELECT run_key, acquired_at FROM {leases}")
        }
        events = [e for replica in replicas for e in replica.events("run_started")]
    assert len(starts) == len({row["run_key"] for row in starts})  # once per tick
    for row in starts:
        tick = tick_of(row["run_key"])
        assert tick is not None
        fire = tick + shift_of(row)
        # Both instants by the database's clock: claimed, then started, after the shifted time.
        assert leases[row["run_key"]]["acquired_at"] >= fire, row
        assert fire <= row["at"] < fire + timedelta(milliseconds=500), row
        assert Identity.schedule("spread", row["run_key"]).idempotency_key == row["idempotency_key"]
    # The replica that ran it logged the shifted fire time next to the tick's run key.
    by_key = {e["run_key"]: e for e in events}
    for row in starts:
        tick = tick_of(row["run_key"])
        assert tick is not None
        assert (tick + shift_of(row)).isoformat() == by_key[row["run_key"]]["tick"]
