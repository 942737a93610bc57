"""The recipes of docs/exactly-once.md, run as written against a real PostgreSQL.

Each ``<!-- example: NAME -->`` block is taken from the page: the tables are
created from it, the Python recipes are imported from it and run through the
real runner (two attempts of one tick, as a retry or a takeover would), and
the ``sql:`` job is loaded from it and fired through the real lease guard.
"""

from __future__ import annotations

import re
import sys
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any
from urllib.parse import quote

import psycopg
import pytest
import yaml
from psycopg.rows import dict_row

from pgcrond.config.loader import load_config
from pgcrond.core.actions import EntrypointAction, SqlAction
from pgcrond.core.cancel import Cancellation
from pgcrond.core.keys import Identity
from pgcrond.core.outcome import RunResult
from pgcrond.core.schedule import run_key_for
from pgcrond.fire import Fire, Firing
from pgcrond.guard import Guards
from pgcrond.run.attempt import RunRequest
from pgcrond.run.runner import execute
from pgcrond.storage.db import Database
from pgcrond.storage.leases import LeaseStore
from pgcrond.storage.migrate import migrate

PAGE = Path(__file__).resolve().parent.parent / "docs" / "exactly-once.md"


def example(name: str) -> str:
    text = PAGE.read_text("utf-8")
    found = re.search(rf"<!-- example: {name} .*?-->\n```\w+\n(.*?)```", text, re.S)
    assert found is not None, f"docs/exactly-once.md has no example {name!r}"
    return found.group(1)


def in_schema(dsn: str, schema: str) -> str:
    """``dsn`` whose sessions resolve unqualified names in ``schema``."""
    joiner = "&" if "?" in dsn else "?"
    return f"{dsn}{joiner}options={quote(f'-csearch_path={schema}')}"


@pytest.fixture
def app(pg_dsn: str, schema: str) -> Iterator[str]:
    """The recipes' tables in a schema of their own; the DSN that finds them."""
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        conn.execute(f'CREATE SCHEMA "{schema}"')
    dsn = in_schema(pg_dsn, schema)
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(example("tables"))
        conn.execute("CREATE TABLE payments (amount numeric, paid_at timestamptz)")
        conn.execute("CREATE TABLE day_totals (day date, total numeric, run_key text)")
    yield dsn


def rows(dsn: str, query: str) -> list[dict[str, Any]]:
    with psycopg.connect(dsn, autocommit=True, row_factory=dict_row) as conn:
        return conn.execute(query).fetchall()


def recipe(tmp_path: Path, name: str) -> str:
    """The example as an importable module; its name is unique to this test."""
    module = f"recipe_{name}_{uuid.uuid4().hex[:8]}"
    (tmp_path / f"{module}.py").write_text(example(name))
    if str(tmp_path) not in sys.path:
        sys.path.insert(0, str(tmp_path))
    return module


async def attempt(
    target: str, dsn: str, tick: datetime, number: int, fencing_token: int
) -> RunResult:
    identity = Identity.schedule("report", run_key_for(tick))
    request = RunRequest(
        job="report",
        action=EntrypointAction(target),
        run_key=identity.run_key or "",
        fire_time=tick,
        attempt=number,
        idempotency_key=identity.idempotency_key,
        idempotency_key_hex=identity.idempotency_key_hex,
        fencing_token=fencing_token,
        env={"APP_DATABASE_URL": dsn},
    )
    return await execute(request, Cancellation())


TICK = datetime(2026, 3, 29, 1, 30, tzinfo=UTC)


async def test_the_outbox_recipe_writes_effect_and_message_once_per_tick(
    app: str, tmp_path: Path
) -> None:
    target = recipe(tmp_path, "outbox") + ":close_day"
    first = await attempt(target, app, TICK, 1, 10)
    # A takeover of the same tick (attempt 2, a newer claim): nothing more.
    second = await attempt(target, app, TICK, 2, 11)
    other_tick = await attempt(target, app, TICK.replace(minute=31), 1, 12)
    outbox = rows(app, "SELECT message_key, payload FROM outbox ORDER BY created_at")
    reports = rows(app, "SELECT day, rows FROM reports")
    assert ["success"] * 3 == [r.outcome for r in (first, second, other_tick)]
    assert [
        (Identity.schedule("report", run_key_for(TICK)).idempotency_key, "2026-03-29T01:30:00Z"),
        (
            Identity.schedule("report", run_key_for(TICK.replace(minute=31))).idempotency_key,
            "2026-03-29T01:31:00Z",
        ),
    ] == [(r["message_key"], r["payload"]) for r in outbox]
    assert [2] == [r["rows"] for r in reports], "one effect per tick"


async def test_the_inbox_recipe_runs_once_and_refuses_a_stale_holder(
    app: str, tmp_path: Path
) -> None:
    target = recipe(tmp_path, "inbox") + ":build_report"
    first = await attempt(target, app, TICK, 1, 20)
    again = await attempt(target, app, TICK, 2, 21)  # a retry of the done tick: a no-op
    stale = await attempt(target, app, TICK, 1, 20)  # the old holder wakes up
    inbox = rows(app, "SELECT fencing_token FROM job_inbox")
    reports = rows(app, "SELECT rows FROM reports")
    assert ["success", "success", "fail"] == [r.outcome for r in (first, again, stale)]
    assert "StaleHolder: fencing token 20 is stale" == stale.error
    assert [20] == [r["fencing_token"] for r in inbox]
    assert [100] == [r["rows"] for r in reports]


async def test_the_sql_job_recipe_commits_its_effect_and_outbox_message_once(
    app: str, schema: str, tmp_path: Path
) -> None:
    jobs = yaml.safe_load(example("sql-job"))["jobs"]
    path = tmp_path / "jobs.yaml"
    path.write_text(
        yaml.safe_dump({"database": {"url": app, "schema": schema}, "jobs": jobs}),
    )
    job = load_config([path]).jobs["close-day"]
    assert isinstance(job.action, SqlAction)
    with psycopg.connect(app, autocommit=True) as conn:
        conn.execute(
            "INSERT INTO payments VALUES (10, '2026-03-28 12:00Z'), (5, '2026-03-28 23:59Z'),"
            " (99, '2026-03-29 00:01Z')"
        )
    db = Database(app)
    await db.open()
    try:
        store = LeaseStore(db, schema=schema)
        await migrate(store)
        tick = datetime.now(UTC).replace(microsecond=0)
        identity = Identity.schedule(job.code, run_key_for(tick))
        outcomes = []
        for replica in ("a:1", "b:2"):  # two replicas fire the same tick
            firing = Firing(guards=Guards(store, db).for_job, replica=replica)
            outcomes.append(await firing.fire(Fire(job, tick, identity)))
    finally:
        await db.close()
    day = tick.date().isoformat()
    totals = rows(app, "SELECT day::text, total::int, run_key FROM day_totals")
    outbox = rows(app, "SELECT message_key FROM outbox")
    assert ["success", "lose"] == outcomes
    assert 1 == len(totals) and run_key_for(tick) == totals[0]["run_key"]
    assert totals[0]["day"] < day
    assert [identity.idempotency_key] == [r["message_key"] for r in outbox]
