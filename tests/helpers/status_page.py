"""The status page's fixtures: a config of five jobs, a known history, an operator who signs in."""

from __future__ import annotations

import base64
import uuid
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from functools import lru_cache
from pathlib import Path
from typing import Any

import psycopg
import yaml

from pgcrond.core.keys import Identity
from pgcrond.core.passwords import hash_password
from pgcrond.core.schedule import run_key_for
from pgcrond.core.timing import LeaseTiming
from pgcrond.storage.claims import Acquired
from pgcrond.storage.leases import LeaseStore

HOSTILE_DESCRIPTION = """<script>alert("description")</script> & it's 'quoted'"""
HOSTILE_ERROR = """Traceback (most recent call last):
  File "report.py", line 3
<script>alert('error')</script> "double" & 'single'"""
ODD_CODE = 'odd/<b>"code"'
THIS_REPLICA = "replica-a:101"
OTHER_REPLICA = "replica-b:202"


def write_config(directory: Path, schema: str, http: str = "") -> Path:
    """Five jobs: per-minute (UTC), daily (Berlin, hostile description), an odd code,
    run-once, advisory; ``http``: an ``http:`` section, as YAML text."""
    path = directory / "pgcrond.yaml"
    document = {
        "database": {"schema": schema},
        "defaults": {"timezone": "Europe/Berlin"},
        "jobs": {
            "sync-invoices": {
                "cron": "* * * * *",
                "timezone": "UTC",
                "command": ["/bin/true"],
                "description": "Pushes yesterday's invoices to the ledger.",
            },
            "nightly-report": {
                "cron": "30 2 * * *",
                "command": ["/bin/true"],
                "retries": 2,
                "timeout": "30m",
                "description": HOSTILE_DESCRIPTION,
            },
            ODD_CODE: {"cron": "0 * * * *", "command": ["/bin/true"]},
            "seed-settings": {"once": True, "command": ["/bin/true"]},
            "cache-warm": {"cron": "*/5 * * * *", "guard": "advisory", "command": ["/bin/true"]},
        },
    }
    path.write_text(yaml.safe_dump(document, sort_keys=False) + http)
    return path


@dataclass
class History:
    """What was written, to assert on."""

    now: datetime
    minute: datetime
    # sync-invoices: the minute with no row (a gap), the failed one, the skipped one.
    gap: datetime
    failed: datetime
    skipped: datetime
    running: Acquired
    nightly_failed: Acquired
    finished_sync: int


def insert(
    conn: psycopg.Connection[Any],
    schema: str,
    code: str,
    run_key: str | None,
    status: str,
    *,
    owner: str,
    acquired: datetime,
    took: timedelta = timedelta(seconds=1),
    attempt: int = 1,
    reason: str | None = None,
    error: str | None = None,
) -> None:
    identity = Identity.initial(code) if run_key is None else Identity.schedule(code, run_key)
    finished = None if status == "RUNNING" else acquired + took
    conn.execute(
        f"""INSERT INTO "{schema}".leases (lock_key, type, code, run_key, status, owner_token,
            owner, attempt, fencing_token, lease_ms, created_at, acquired_at, heartbeat_at,
            expires_at, finished_at, reason, error)
        VALUES (%s, %s, %s, %s, %s, %s, %s, %s, nextval('"{schema}".leases_fencing_seq'), 60000,
                %s, %s, %s, %s, %s, %s, %s)""",
        (
            identity.idempotency_key,
            identity.type,
            code,
            run_key,
            status,
            uuid.uuid4(),
            owner,
            attempt,
            acquired,
            acquired,
            acquired,
            acquired + timedelta(minutes=1),
            finished,
            reason,
            error,
        ),
    )


async def seed(dsn: str, schema: str, store: LeaseStore, other: LeaseStore) -> History:
    """A known history: twelve minutes of sync-invoices with a gap, a failure and a skip;
    four nights of nightly-report, the last failed through the store with a hostile error;
    three hours of the odd code; the run-once job done; a live claim by another replica."""
    now = datetime.now(UTC)
    minute = now.replace(second=0, microsecond=0)
    gap, failed, skipped = (minute - timedelta(minutes=k) for k in (5, 7, 3))
    finished_sync = 0
    with psycopg.connect(dsn, autocommit=True) as conn:
        for k in range(12, 0, -1):
            tick = minute - timedelta(minutes=k)
            if tick == gap:
                continue
            owner = THIS_REPLICA if k % 2 else OTHER_REPLICA
            at = tick + timedelta(milliseconds=40)
            if tick == failed:
                insert(
                    conn,
                    schema,
                    "sync-invoices",
                    run_key_for(tick),
                    "FAIL",
                    owner=owner,
                    acquired=at,
                    took=timedelta(milliseconds=300),
                    attempt=2,
                    reason="error",
                    error="exit status 3",
                )
            elif tick == skipped:
                insert(
                    conn,
                    schema,
                    "sync-invoices",
                    run_key_for(tick),
                    "SKIPPED",
                    owner=owner,
                    acquired=at,
                    took=timedelta(0),
                    reason="overlap",
                )
            else:
                insert(
                    conn,
                    schema,
                    "sync-invoices",
                    run_key_for(tick),
                    "SUCCESS",
                    owner=owner,
                    acquired=at,
                    took=timedelta(milliseconds=400 + 150 * k),
                )
            finished_sync += tick != skipped
        nights = []
        day = now.astimezone(UTC).replace(hour=1, minute=30, second=0, microsecond=0)
        for k in range(4, 0, -1):
            nights.append(day - timedelta(days=k))
        for night in nights[:-1]:
            insert(
                conn,
                schema,
                "nightly-report",
                run_key_for(night),
                "SUCCESS",
                owner=THIS_REPLICA,
                acquired=night,
                took=timedelta(minutes=4, seconds=10),
            )
        hour = now.replace(minute=0, second=0, microsecond=0)
        for k in range(3, 0, -1):
            insert(
                conn,
                schema,
                ODD_CODE,
                run_key_for(hour - timedelta(hours=k)),
                "SUCCESS",
                owner=OTHER_REPLICA,
                acquired=hour - timedelta(hours=k),
            )
        insert(
            conn,
            schema,
            "seed-settings",
            None,
            "SUCCESS",
            owner=THIS_REPLICA,
            acquired=now - timedelta(days=3),
        )
    # Through the store: the newest night fails for good with a hostile error ...
    claimed = await store.claim(Identity.schedule("nightly-report", run_key_for(nights[-1])))
    assert isinstance(claimed, Acquired)
    assert await store.fail(claimed, HOSTILE_ERROR, retry_after=None)
    # ... and another replica holds this minute's tick of sync-invoices right now.
    running = await other.claim(
        Identity.schedule("sync-invoices", run_key_for(minute)),
        LeaseTiming.build(timedelta(minutes=10)),
    )
    assert isinstance(running, Acquired)
    return History(now, minute, gap, failed, skipped, running, claimed, finished_sync)


OPERATOR = "alice"
OPERATOR_PASSWORD = "correct horse battery"


@lru_cache(maxsize=1)
def operator_hash() -> str:
    return hash_password(OPERATOR_PASSWORD)


def users_section() -> str:
    return f"http:\n  users:\n    {OPERATOR}: '{operator_hash()}'\n"


def basic(user: str = OPERATOR, password: str = OPERATOR_PASSWORD) -> dict[str, str]:
    return {"Authorization": "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()}
