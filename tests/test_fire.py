"""One fire through Firing, against a real PostgreSQL (no daemon around it)."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path

import structlog

from pgcrond.config.loader import load_config
from pgcrond.config.models import JobConfig
from pgcrond.core.keys import Identity
from pgcrond.core.schedule import run_key_for
from pgcrond.fire import Fire, Firing
from pgcrond.guard import Guards
from pgcrond.storage.db import Database
from pgcrond.storage.leases import LeaseStore


def job(tmp_path: Path, pg_dsn: str, definition: str) -> JobConfig:
    path = tmp_path / "jobs.yaml"
    path.write_text(f"database: {{url: '{pg_dsn}'}}\njobs:\n  adv: {definition}\n")
    return load_config([path]).jobs["adv"]


async def test_an_advisory_retry_after_a_timeout_really_runs_again(
    pg_dsn: str, schema: str, tmp_path: Path
) -> None:
    adv = job(
        tmp_path,
        pg_dsn,
        '{cron: "* * * * *", guard: advisory, shell: "sleep 5", timeout: 300ms, '
        "retries: 1, retry_delay: 100ms, min_hold: 1ms}",
    )
    db = Database(pg_dsn)
    await db.open()
    try:
        guards = Guards(LeaseStore(db, schema=schema), db)
        firing = Firing(guards=guards.for_job, replica="t:1")
        tick = datetime.now(UTC).replace(microsecond=0)
        with structlog.testing.capture_logs() as logs:
            outcome = await firing.fire(
                Fire(adv, tick, Identity.schedule("adv", run_key_for(tick)))
            )
    finally:
        await db.close()
    finished = [event for event in logs if event["event"] == "run_finished"]
    assert "timeout" == outcome
    assert [1, 2] == [event["attempt"] for event in finished]
    assert ["timeout", "timeout"] == [event["outcome"] for event in finished]
    # Each attempt ran until its own timeout, not cancelled at once by the first's.
    assert all(event["duration_ms"] >= 250 for event in finished)
