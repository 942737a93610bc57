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

from pgcrond.config.loader import load_config
from pgcrond.config.models import JobConfig
from pgcrond.core.actions import SqlAction, SqlWork
from pgcrond.core.keys import Identity
from pgcrond.core.schedule import run_key_for
from pgcrond.core.sqlscript import compile_script
from pgcrond.core.timing import LeaseTiming
from pgcrond.errors import ConfigError, SqlJobFailed
from pgcrond.fire import Fire, Firing
from pgcrond.guard import Guards
from pgcrond.storage.claims import Acquired
from pgcrond.storage.db import Database
from pgcrond.storage.leases import LeaseStore
from pgcrond.storage.migrate import migrate
from tests.faults.checker import owner_pid
from tests.helpers import pgbouncer as bouncer

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
        firing = Firing(guards=Guards(self.store, self.db).for_job, replica="t:1")
        tick = tick or datetime.now(UTC).replace(microsecond=0)
        with structlog.testing.capture_logs() as logs:
            identity = Identity.schedule(job.code, run_key_for(tick))
            outcome = await firing.fire(Fire(job, tick, identity))
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
        await migrate(store)
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


async def test_statements_that_outrun_their_lease_are_ended_by_it_and_the_tick_taken_over(
    pg_dsn: str, schema: str, tmp_path: Path
) -> None:
    """The server ends the transaction with the lease (its statement timeout is what the
    lease has left): nothing commits, the owner is fenced, and a claim takes the row."""
    import asyncio
    import time

    async with lab(pg_dsn, schema, tmp_path) as it:
        identity = Identity.schedule("j", "2026-01-01T00:00:00Z")
        lease = await it.store.claim(
            identity, LeaseTiming.build(timedelta(milliseconds=500), timedelta(0))
        )
        assert isinstance(lease, Acquired)
        slow = SqlWork(
            statements=(*sql_work(it, lease).statements, "SELECT pg_sleep(3)"),
            params=sql_work(it, lease).params,
            statement_timeout=timedelta(seconds=5),
        )
        started = time.monotonic()
        committed = await asyncio.wait_for(it.store.complete_with(lease, slow), 10)
        took = time.monotonic() - started
        other = LeaseStore(it.db, schema=schema, owner="other:2")
        answer = await other.claim(identity, LeaseTiming.build(timedelta(seconds=30)))
        effects = it.rows("SELECT * FROM {effects}")
    assert False is committed
    assert took < 1.5  # ended with the lease, not by the 3 s statement or its 5 s timeout
    assert isinstance(answer, Acquired)
    assert "takeover" == answer.claimed_from
    assert [] == effects


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
    from tests.helpers.pgbouncer import server_port

    with bouncer.pgbouncer(server_port(pg_dsn), "transaction") as running:
        yield running


@pytest.mark.usefixtures("system_processes")
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


# -- under faults: 3 real replicas ----------------------------------------------

FAULT_LEDGER_DDL = """
CREATE TABLE {table} (
    id bigint GENERATED ALWAYS AS IDENTITY,
    run_key text, key text, attempt int, fencing_token bigint, fire_time timestamptz
)
"""


def fault_config(schema: str) -> str:
    # lease 4s: heartbeat 1.33s, stop grace 1s + margin 0.4s, so the statements
    # may run 1.27s; each holds its row 0.8s, so most faults land mid-run.
    return (
        "database:\n"
        "  url: ${PGCROND_DATABASE_URL}\n"
        f"  schema: {schema}\n"
        "jobs:\n"
        "  tick:\n"
        '    cron: "* * * * * *"\n'
        "    concurrency: allow\n"
        "    lease: 4s\n"
        "    misfire_grace: 12s\n"
        "    late_ticks: all\n"
        "    retries: 5\n"
        "    retry_delay: 200ms\n"
        "    sql: |\n"
        f'      INSERT INTO "{schema}".sql_ledger\n'
        "        (run_key, key, attempt, fencing_token, fire_time)\n"
        "      VALUES (:run_key, :idempotency_key, :attempt, :fencing_token, :fire_time);\n"
        "      SELECT pg_sleep(0.8)\n"
    )


@pytest.mark.slow
@pytest.mark.usefixtures("system_processes")
def test_under_kills_pauses_and_cuts_every_tick_s_row_exists_exactly_once(
    pg_dsn: str, schema: str, tmp_path: Path
) -> None:
    """No unique constraint: only the shared transaction keeps the ledger exact."""
    import signal
    import time

    from tests.faults.proxy import proxied
    from tests.helpers.daemon_harness import Cluster, Replica, wait_until

    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        conn.execute(f'CREATE SCHEMA "{schema}"')
        conn.execute(FAULT_LEDGER_DDL.format(table=f'"{schema}".sql_ledger'))
    direct = Cluster(pg_dsn, schema, tmp_path)
    config = direct.write_config(fault_config(schema))
    lost: list[dict[str, Any]] = []  # (run_key, fencing_token) of holders we hit
    faults: list[str] = []

    def rows(query: str) -> list[dict[str, Any]]:
        return direct.rows(query)

    with proxied(pg_dsn) as (proxy, proxy_dsn):
        env = {**direct.env(), "PGCROND_DATABASE_URL": proxy_dsn}
        names = iter(range(100))
        replicas: list[Replica] = []

        def start() -> Replica:
            n = next(names)
            replica = Replica(f"replica-{n}", config, tmp_path / f"replica-{n}.log", env).start()
            replicas.append(replica)
            return replica

        def holder() -> tuple[Replica, dict[str, Any]]:
            """A replica in the middle of a run, and the row it holds."""

            def find() -> tuple[Replica, dict[str, Any]] | None:
                running = rows(
                    "SELECT run_key, owner, fencing_token FROM {leases} "
                    "WHERE status = 'RUNNING' AND expires_at > now() "
                    # Started just now (acquired_at: when its run may start, a
                    # claim being won a little ahead): its 0.8s statement runs.
                    "AND clock_timestamp() - acquired_at BETWEEN interval '0' AND interval '0.4s' "
                    "ORDER BY acquired_at DESC"
                )
                for row in running:
                    pid = owner_pid(row["owner"])
                    for replica in replicas:
                        alive = replica.process is not None and replica.process.poll() is None
                        if replica.pid == pid and alive:
                            return replica, row
                return None

            found: tuple[Replica, dict[str, Any]] = wait_until(find, 10, "a replica mid-run")
            return found

        try:
            for _ in range(3):
                start()
            for replica in replicas:
                replica.wait_event("daemon_ready", timeout=30)
            window_start = datetime.now(UTC).replace(microsecond=0) + timedelta(seconds=2)
            time.sleep(3)

            victim, row = holder()
            victim.signal(signal.SIGKILL)
            lost.append(row)
            faults.append(f"kill -9 {victim.name} holding {row['run_key']}")
            time.sleep(1)
            start().wait_event("daemon_ready", timeout=30)
            time.sleep(2)

            victim, row = holder()
            victim.signal(signal.SIGSTOP)
            lost.append(row)
            faults.append(f"SIGSTOP {victim.name} for 5.5s holding {row['run_key']}")
            time.sleep(5.5)  # past its 4s lease
            victim.signal(signal.SIGCONT)
            time.sleep(2)

            holder()
            faults.append(f"cut {proxy.cut()} connections")
            time.sleep(3)
            holder()
            proxy.partition(2.5).wait(10)
            faults.append("partition 2.5s")
            time.sleep(2)

            victim, row = holder()
            victim.signal(signal.SIGKILL)
            lost.append(row)
            faults.append(f"kill -9 {victim.name} holding {row['run_key']}")
            # The window ends with the tick of the last hit (it must be taken over).
            window_end = datetime.now(UTC).replace(microsecond=0)
            time.sleep(1)

            # Settled: every tick of the window finished (taken over, retried).
            def settled() -> bool:
                open_rows = rows(
                    "SELECT 1 FROM {leases} WHERE run_key <= "
                    f"'{window_end:%Y-%m-%dT%H:%M:%SZ}' AND "
                    "(status = 'RUNNING' OR (status = 'FAIL' AND retry_at IS NOT NULL))"
                )
                return not open_rows

            wait_until(settled, 25, "every tick of the window to finish")
            for replica in replicas:
                if replica.process is not None and replica.process.poll() is None:
                    replica.signal(signal.SIGTERM)
            for replica in replicas:
                replica.wait_exit(30)
        finally:
            for replica in replicas:
                replica.stop()
    leases = {r["run_key"]: r for r in rows("SELECT * FROM {leases}")}
    ledger = rows(
        "SELECT run_key, key, attempt, fencing_token FROM {ledger}".replace(
            "{ledger}", f'"{schema}".sql_ledger'
        )
    )
    expected = []
    moment = window_start
    while moment <= window_end:
        expected.append(moment.strftime("%Y-%m-%dT%H:%M:%SZ"))
        moment += timedelta(seconds=1)
    by_tick: dict[str, list[dict[str, Any]]] = {}
    for effect in ledger:
        by_tick.setdefault(effect["run_key"], []).append(effect)
    succeeded = {key for key, row in leases.items() if row["status"] == "SUCCESS"}
    retried = sorted(key for key in expected if leases[key]["attempt"] > 1)
    attempts = [leases[key]["attempt"] for key in retried]
    print(
        f"\n{len(expected)} ticks in the window, {len(ledger)} ledger rows, "
        f"{len(retried)} ticks run more than once (attempts {attempts}); faults: {faults}"
    )
    # Every tick of the window ran and was recorded SUCCESS...
    assert [] == [key for key in expected if key not in succeeded]
    # ...and each one's row exists exactly once, written by the attempt that
    # won (its fencing token), never by an attempt that lost its lease.
    assert {key: 1 for key in succeeded} == {key: len(v) for key, v in by_tick.items()}
    assert all(
        [leases[key]["fencing_token"]] == [e["fencing_token"] for e in by_tick[key]]
        for key in succeeded
    )
    # A holder hit mid-run lost its lease: the tick was finished by a newer
    # claim, and nothing of the hit attempt remains. (A hit that landed just
    # after its COMMIT kept its SUCCESS, written once, by that attempt.)
    hit_mid_run = 0
    for row in lost:
        final = leases[row["run_key"]]
        tokens = [e["fencing_token"] for e in by_tick.get(row["run_key"], [])]
        if final["fencing_token"] > row["fencing_token"]:
            hit_mid_run += 1
            assert row["fencing_token"] not in tokens
        else:
            assert [row["fencing_token"]] == tokens
    print(f"holders hit mid-run: {hit_mid_run} of {len(lost)}")
    assert hit_mid_run >= 2
