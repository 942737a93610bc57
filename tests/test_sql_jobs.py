"""``sql:`` jobs: statements committed in the transaction that records the run's SUCCESS.

Unit tests of the placeholder translation (no database), config rules, then
fires through :class:`~pgcrond.fire.Firing` with the real lease guard against a
real PostgreSQL (and PgBouncer in transaction pooling, when installed).
"""

from __future__ import annotations

import contextlib
import uuid
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import psycopg
import pytest
import structlog
from psycopg.rows import dict_row

from pgcrond.config.loader import JobConfig, load_config
from pgcrond.core.actions import SqlAction, SqlWork
from pgcrond.core.keys import Identity
from pgcrond.core.schedule import run_key_for
from pgcrond.core.sqlscript import compile_script
from pgcrond.core.timing import LeaseTiming
from pgcrond.daemon.metrics import Metrics
from pgcrond.errors import ConfigError, SqlJobFailed
from pgcrond.fire import Firing
from pgcrond.guard import Guards
from pgcrond.storage.db import Database
from pgcrond.storage.leases import Acquired, LeaseStore
from tests import pgbouncer as bouncer

# -- the placeholder translation ------------------------------------------------


def test_placeholders_become_typed_bound_parameters() -> None:
    script = compile_script("INSERT INTO t VALUES (:idempotency_key, :attempt, :fire_time)")
    assert (
        "INSERT INTO t VALUES ((%(idempotency_key)s::text), (%(attempt)s::integer), "
        "(%(fire_time)s::timestamptz))",
    ) == script.statements
    assert {"idempotency_key", "attempt", "fire_time"} == script.parameters


def test_casts_literals_quoted_names_and_comments_are_left_alone() -> None:
    text = (
        "SELECT :run_key::date, ':attempt', E'it\\'s :attempt', $$ :attempt; $$, "
        '$tag$ :x $tag$, "col:attempt" -- :attempt;\n/* :attempt; /* nested */ */ FROM t'
    )
    (statement,) = compile_script(text).statements
    assert statement.startswith("SELECT (%(run_key)s::text)::date, ':attempt', ")
    assert "E'it\\'s :attempt'" in statement
    assert "$$ :attempt; $$" in statement and "$tag$ :x $tag$" in statement
    assert '"col:attempt"' in statement and "-- :attempt;" in statement
    assert "/* :attempt; /* nested */ */" in statement


def test_percent_signs_are_doubled_for_the_driver_everywhere() -> None:
    (statement,) = compile_script("SELECT 7 % 2, 'a%' -- 100%").statements
    assert "SELECT 7 %% 2, 'a%%' -- 100%%" == statement


def test_a_script_is_split_into_statements_outside_literals() -> None:
    script = compile_script("INSERT INTO t VALUES (';'); ; SELECT pg_sleep(0)  ;  -- done\n")
    assert ("INSERT INTO t VALUES (';')", "SELECT pg_sleep(0)") == script.statements


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("SELECT :fire_tme", "unknown parameter :fire_tme"),
        ("SELECT a[lo:hi] FROM t", "unknown parameter :hi"),
        ("BEGIN; SELECT 1", "transaction control"),
        ("SELECT 1; COMMIT", "statement 2 is transaction control"),
        ("SET search_path = x", "session-wide SET"),
        ("SET LOCAL ROLE admin", "role change"),
        ("PREPARE p AS SELECT 1", "prepared statement"),
        ("SELECT 'open", "unterminated string literal"),
        ("SELECT $$ open", "unterminated dollar-quoted"),
        (" ; -- nothing", "has no statement"),
    ],
)
def test_what_a_script_may_not_do_is_refused(text: str, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        compile_script(text)


# -- configuration --------------------------------------------------------------


def load(tmp_path: Path, url: str, jobs: str, **environ: str) -> dict[str, JobConfig]:
    path = tmp_path / "jobs.yaml"
    path.write_text(f"database: {{url: '{url}'}}\njobs:\n{jobs}")
    return dict(load_config([path], environ=environ).jobs)


def issues(tmp_path: Path, jobs: str) -> list[tuple[int | None, str | None, str | None, str]]:
    with pytest.raises(ConfigError) as caught:
        load(tmp_path, "postgresql://u@db/app", jobs)
    return [(i.line, i.job, i.field, i.message) for i in caught.value.issues]


def test_an_sql_job_loads_with_its_timeout_as_statement_timeout(tmp_path: Path) -> None:
    jobs = load(
        tmp_path,
        "postgresql://u@db/app",
        '  a: {cron: "* * * * *", sql: "SELECT :attempt", timeout: 10s, role: reporter}\n',
    )
    action = jobs["a"].action
    assert isinstance(action, SqlAction)
    assert (timedelta(seconds=10), "reporter") == (action.statement_timeout, action.role)


def test_without_a_timeout_an_sql_job_gets_what_its_lease_allows(tmp_path: Path) -> None:
    jobs = load(tmp_path, "postgresql://u@db/app", '  a: {cron: "* * * * *", sql: "SELECT 1"}\n')
    action = jobs["a"].action
    assert isinstance(action, SqlAction)
    # lease 1m - heartbeat 20s - stop grace 10s - margin 1s
    assert timedelta(seconds=29) == action.statement_timeout


def test_an_sql_job_under_the_advisory_guard_is_refused(tmp_path: Path) -> None:
    found = issues(
        tmp_path, '  a:\n    cron: "* * * * *"\n    guard: advisory\n    sql: "SELECT 1"\n'
    )
    assert [(5, "a", "guard")] == [f[:3] for f in found]
    assert "needs guard: lease" in found[0][3]


def test_an_sql_job_on_another_database_is_refused(tmp_path: Path) -> None:
    found = issues(
        tmp_path,
        '  a:\n    cron: "* * * * *"\n    sql: "SELECT 1"\n    database: postgresql://u@other/x\n',
    )
    assert [(6, "a", "database")] == [f[:3] for f in found]
    assert "lease database only" in found[0][3]


def test_an_sql_job_may_name_the_lease_database_itself(tmp_path: Path) -> None:
    jobs = load(
        tmp_path,
        "postgresql://u@db/app",
        '  a: {cron: "* * * * *", sql: "SELECT 1", database: "${APP_DB}"}\n',
        APP_DB="postgresql://u@db/app",
    )
    assert isinstance(jobs["a"].action, SqlAction)


def test_an_sql_timeout_longer_than_its_lease_allows_is_refused(tmp_path: Path) -> None:
    found = issues(tmp_path, '  a:\n    cron: "* * * * *"\n    sql: "SELECT 1"\n    timeout: 5m\n')
    assert [(6, "a", "timeout")] == [f[:3] for f in found]
    assert "must end within lease - heartbeat - stop grace (29s)" in found[0][3]


def test_bad_sql_and_role_elsewhere_are_reported_with_their_lines(tmp_path: Path) -> None:
    found = issues(
        tmp_path,
        '  a:\n    cron: "* * * * *"\n    sql: "SELECT :nope"\n'
        '  b:\n    cron: "* * * * *"\n    command: [/bin/true]\n    role: x\n',
    )
    assert [(5, "a", "sql"), (9, "b", "role")] == [f[:3] for f in found]


# -- against PostgreSQL ---------------------------------------------------------

EFFECTS_DDL = """
CREATE TABLE {table} (
    id bigint GENERATED ALWAYS AS IDENTITY,
    key text, run_key text, fire_time timestamptz, attempt int, fencing_token bigint,
    who text DEFAULT current_user
)
"""


@dataclass
class Lab:
    dsn: str
    schema: str
    db: Database
    store: LeaseStore
    tmp_path: Path

    @property
    def effects(self) -> str:
        return f'"{self.schema}".effects'

    def job(self, definition: str, code: str = "j") -> JobConfig:
        path = self.tmp_path / "jobs.yaml"
        path.write_text(
            f"database: {{url: '{self.dsn}', schema: {self.schema}}}\n"
            f"jobs:\n  {code}:\n" + "".join(f"    {line}\n" for line in definition.splitlines())
        )
        return load_config([path]).jobs[code]

    async def fire(self, job: JobConfig, tick: datetime | None = None) -> tuple[str, list[Any]]:
        firing = Firing(
            guards=Guards(self.store, self.db).for_job, metrics=Metrics(), replica="t:1"
        )
        tick = tick or datetime.now(UTC).replace(microsecond=0)
        with structlog.testing.capture_logs() as logs:
            outcome = await firing.fire(job, tick, Identity.schedule(job.code, run_key_for(tick)))
        return outcome, logs

    def rows(self, query: str, *params: object) -> list[dict[str, Any]]:
        with psycopg.connect(self.dsn, autocommit=True, row_factory=dict_row) as conn:
            text = query.format(effects=self.effects, leases=f'"{self.schema}".leases')
            return conn.execute(text, params).fetchall()


@contextlib.asynccontextmanager
async def lab(dsn: str, schema: str, tmp_path: Path) -> AsyncIterator[Lab]:
    db = Database(dsn)
    await db.open()
    try:
        store = LeaseStore(db, schema=schema)
        await store.migrate()
        with psycopg.connect(dsn, autocommit=True) as conn:
            conn.execute(EFFECTS_DDL.format(table=f'"{schema}".effects'))
        yield Lab(dsn, schema, db, store, tmp_path)
    finally:
        await db.close()


def insert(lab: Lab, extra: str = "") -> str:
    return (
        f"sql: |\n"
        f"  INSERT INTO {lab.effects} (key, run_key, fire_time, attempt, fencing_token)\n"
        f"  VALUES (:idempotency_key, :run_key, :fire_time, :attempt, :fencing_token);\n"
        f"  {extra}\n"
    )


async def test_the_statements_commit_with_success_and_see_the_run_s_values(
    pg_dsn: str, schema: str, tmp_path: Path
) -> None:
    async with lab(pg_dsn, schema, tmp_path) as it:
        job = it.job('cron: "* * * * *"\n' + insert(it, "SELECT ':not_a_param %' AS text"))
        tick = datetime.now(UTC).replace(microsecond=0)
        outcome, logs = await it.fire(job, tick)
        effects = it.rows("SELECT * FROM {effects}")
        (lease,) = it.rows("SELECT * FROM {leases}")
    identity = Identity.schedule("j", run_key_for(tick))
    assert "success" == outcome
    assert "SUCCESS" == lease["status"]
    assert [(identity.idempotency_key, run_key_for(tick), tick, 1, lease["fencing_token"])] == [
        (e["key"], e["run_key"], e["fire_time"], e["attempt"], e["fencing_token"]) for e in effects
    ]
    assert ["sql_committed"] == [e["event"] for e in logs if e["event"].startswith("sql_")]


async def test_a_failing_statement_rolls_back_and_is_retried_under_the_same_key(
    pg_dsn: str, schema: str, tmp_path: Path
) -> None:
    async with lab(pg_dsn, schema, tmp_path) as it:
        # The insert lands first, then attempt 1 divides by zero: all rolled back.
        job = it.job(
            'cron: "* * * * *"\nretries: 1\nretry_delay: 100ms\n'
            + insert(it, "SELECT 1 / (:attempt - 1)")
        )
        outcome, logs = await it.fire(job)
        effects = it.rows("SELECT attempt FROM {effects}")
        (lease,) = it.rows("SELECT status, attempt FROM {leases}")
    finished = [
        (e["attempt"], e["outcome"], e["error"]) for e in logs if e["event"] == "run_finished"
    ]
    assert "success" == outcome
    assert [(1, "fail"), (2, "success")] == [f[:2] for f in finished]
    assert "DivisionByZero: division by zero" == finished[0][2]
    assert [2] == [e["attempt"] for e in effects]
    assert {"status": "SUCCESS", "attempt": 2} == lease


async def test_a_statement_past_its_timeout_is_a_timeout_and_commits_nothing(
    pg_dsn: str, schema: str, tmp_path: Path
) -> None:
    async with lab(pg_dsn, schema, tmp_path) as it:
        job = it.job('cron: "* * * * *"\ntimeout: 300ms\n' + insert(it, "SELECT pg_sleep(5)"))
        outcome, _ = await it.fire(job)
        effects = it.rows("SELECT * FROM {effects}")
        (lease,) = it.rows("SELECT status, reason, error FROM {leases}")
    assert "timeout" == outcome
    assert [] == effects
    assert {"status": "FAIL", "reason": "timeout"} == {k: lease[k] for k in ("status", "reason")}
    assert lease["error"].startswith("timeout after 0.3s")


async def test_a_fenced_owner_runs_nothing_and_a_late_commit_cannot_land(
    pg_dsn: str, schema: str, tmp_path: Path
) -> None:
    """The lock comes first: a stale owner's statements never run, its SUCCESS never lands."""
    async with lab(pg_dsn, schema, tmp_path) as it:
        identity = Identity.schedule("j", "2026-01-01T00:00:00Z")
        timing = LeaseTiming.build(timedelta(milliseconds=300), timedelta(0))
        stale = await it.store.claim(identity, timing)
        assert isinstance(stale, Acquired)
        # Its lease lapses and another replica takes the tick over.
        await _sleep(0.4)
        other = LeaseStore(it.db, schema=schema, owner="other:2")
        current = await other.claim(identity, LeaseTiming.build(timedelta(seconds=30)))
        assert isinstance(current, Acquired)
        work = sql_work(it, stale)
        assert await it.store.complete_with(stale, work) is False
        assert [] == it.rows("SELECT * FROM {effects}")
        assert await other.complete_with(current, sql_work(it, current)) is True
        effects = it.rows("SELECT fencing_token FROM {effects}")
        (lease,) = it.rows("SELECT status, owner FROM {leases}")
    assert [current.fencing_token] == [e["fencing_token"] for e in effects]
    assert {"status": "SUCCESS", "owner": "other:2"} == lease


async def test_a_takeover_waits_for_the_holder_s_transaction_and_then_finds_it_done(
    pg_dsn: str, schema: str, tmp_path: Path
) -> None:
    """While the statements run the row is locked: a claim that arrives meanwhile sees SUCCESS."""
    import asyncio

    async with lab(pg_dsn, schema, tmp_path) as it:
        identity = Identity.schedule("j", "2026-01-01T00:00:00Z")
        lease = await it.store.claim(
            identity, LeaseTiming.build(timedelta(milliseconds=500), timedelta(0))
        )
        assert isinstance(lease, Acquired)
        slow = SqlWork(
            statements=(*sql_work(it, lease).statements, "SELECT pg_sleep(1)"),
            params=sql_work(it, lease).params,
            statement_timeout=timedelta(seconds=5),
        )
        running = asyncio.ensure_future(it.store.complete_with(lease, slow))
        await _sleep(0.7)  # the lease has expired by the clock, but the row is locked
        other = LeaseStore(it.db, schema=schema, owner="other:2")
        answer = await other.claim(identity, LeaseTiming.build(timedelta(seconds=30)))
        assert await running is True
        again = await other.claim(identity, LeaseTiming.build(timedelta(seconds=30)))
        effects = it.rows("SELECT * FROM {effects}")
    # Not taken over while the row was locked: held (followed), or done if it waited.
    assert getattr(answer, "reason", None) in ("held", "done")
    assert "done" == getattr(again, "reason", None)
    assert 1 == len(effects)


async def test_the_job_s_role_runs_its_statements_and_only_them(
    pg_dsn: str, schema: str, tmp_path: Path
) -> None:
    role = f"r_{uuid.uuid4().hex[:10]}"
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        conn.execute(f'CREATE ROLE "{role}" NOLOGIN')
        conn.execute(f'GRANT "{role}" TO current_user')
    try:
        async with lab(pg_dsn, schema, tmp_path) as it:
            with psycopg.connect(pg_dsn, autocommit=True) as conn:
                for grant in (
                    f'GRANT USAGE ON SCHEMA "{schema}" TO "{role}"',
                    f'GRANT INSERT ON {it.effects} TO "{role}"',
                ):
                    conn.execute(grant)
            ok = it.job(f'cron: "* * * * *"\nrole: {role}\n' + insert(it))
            assert "success" == (await it.fire(ok))[0]
            # The role may not read the lease table: the statements run as the role.
            denied = it.job(
                f'cron: "* * * * *"\nrole: {role}\nsql: "SELECT * FROM \\"{schema}\\".leases"',
                code="k",
            )
            outcome, logs = await it.fire(denied)
            who = it.rows("SELECT who FROM {effects}")
    finally:
        with psycopg.connect(pg_dsn, autocommit=True) as conn:
            conn.execute(f'DROP OWNED BY "{role}"')
            conn.execute(f'DROP ROLE "{role}"')
    assert [role] == [w["who"] for w in who]
    assert "fail" == outcome
    (error,) = [e["error"] for e in logs if e["event"] == "run_finished"]
    assert error.startswith("InsufficientPrivilege: permission denied for table leases")


def sql_work(it: Lab, lease: Acquired) -> SqlWork:
    (statement,) = compile_script(
        f"INSERT INTO {it.effects} (key, attempt, fencing_token) "
        "VALUES (:idempotency_key, :attempt, :fencing_token)"
    ).statements
    return SqlWork(
        statements=(statement,),
        params={
            "idempotency_key": lease.idempotency_key,
            "attempt": lease.attempt,
            "fencing_token": lease.fencing_token,
        },
        statement_timeout=timedelta(seconds=5),
    )


async def _sleep(seconds: float) -> None:
    import asyncio

    await asyncio.sleep(seconds)


def test_a_failed_statement_is_a_job_failure_not_an_outage() -> None:
    error = SqlJobFailed("UniqueViolation: duplicate key", "23505")
    assert ("23505", "UniqueViolation: duplicate key") == (error.sqlstate, str(error))


@pytest.fixture
def transaction_pooler(pg_dsn: str) -> Iterator[bouncer.PgBouncer]:
    if bouncer.binary() is None:
        pytest.skip("pgbouncer is not installed")
    from tests.test_pgbouncer import server_port

    with bouncer.pgbouncer(server_port(pg_dsn), "transaction") as running:
        yield running


async def test_an_sql_job_commits_with_its_success_behind_pgbouncer_transaction_pooling(
    transaction_pooler: bouncer.PgBouncer, schema: str, tmp_path: Path
) -> None:
    async with lab(transaction_pooler.dsn, schema, tmp_path) as it:
        job = it.job(
            'cron: "* * * * *"\nretries: 1\nretry_delay: 100ms\n'
            + insert(it, "SELECT 1 / (:attempt - 1)")
        )
        outcome, _ = await it.fire(job)
        effects = it.rows("SELECT attempt FROM {effects}")
        # Nothing of the job's transaction leaked into the pooled server connections.
        settings = it.rows("SELECT current_setting('statement_timeout') AS t")
    assert "success" == outcome
    assert [2] == [e["attempt"] for e in effects]
    assert [{"t": "0"}] == settings
