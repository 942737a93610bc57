"""``sql:`` jobs beside other jobs, and what their text may do.

An ``sql:`` job's transaction runs on a connection source of its own
(``database.sql_connections``), never on the guard's pool, so claims,
heartbeats and finalizes of every other job go on while ``sql:`` jobs run.

``check`` refuses transaction control and session-level settings (a
lint, best effort), and the runtime is the guarantee: each statement is sent
alone with the extended protocol, the role and the server-side bounds are
checked after every statement (a change fails the run, rolled back), and what
a job did to its session is undone before the connection serves anything else.
The runtime tests hand the store statements directly, past the lint.
"""

from __future__ import annotations

import asyncio
import contextlib
import re
import signal
import time
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import psycopg
import pytest
import yaml
from psycopg.rows import dict_row

from pgcrond.config.loader import load_config
from pgcrond.core.actions import SqlWork
from pgcrond.core.keys import Identity
from pgcrond.core.sqlscript import compile_script
from pgcrond.core.timing import LeaseTiming
from pgcrond.errors import ConfigError, SqlJobFailed
from pgcrond.storage.claims import Acquired
from pgcrond.storage.db import Database
from pgcrond.storage.leases import LeaseStore
from pgcrond.storage.migrate import migrate
from tests.helpers.daemon_harness import cluster, wait_until

# Starts replicas or servers: the system tier.
pytestmark = pytest.mark.usefixtures("system_processes")

# -- the lint at `check` ---------------------------------------------------------

# The smuggle: PostgreSQL reads `x€$a$` as one identifier (every non-ASCII
# character continues one), a splitter that does not sees a dollar quote
# hiding `; COMMIT;`, and the simple protocol runs all three statements.
SMUGGLED_COMMIT = "SELECT 1 AS x€$a$; COMMIT; SELECT 1 AS y€$a$"

REFUSED = [
    ("BEGIN", "transaction control"),
    ("START TRANSACTION", "transaction control"),
    ("COMMIT", "transaction control"),
    ("END", "transaction control"),
    ("ABORT", "transaction control"),
    ("ROLLBACK", "transaction control"),
    ("SAVEPOINT s", "transaction control"),
    ("RELEASE SAVEPOINT s", "transaction control"),
    ("RELEASE s", "transaction control"),
    ("ROLLBACK TO SAVEPOINT s", "transaction control"),
    ("PREPARE TRANSACTION 'x'", "transaction control"),
    ("COMMIT PREPARED 'x'", "transaction control"),
    (SMUGGLED_COMMIT, "transaction control"),
    ("SET work_mem = '64MB'", "session-wide SET"),
    ("SET SESSION work_mem = '64MB'", "session-wide SET"),
    ("RESET work_mem", "session state"),
    ("RESET ALL", "session state"),
    ("SET ROLE admin", "session-wide SET"),
    ("SET SESSION AUTHORIZATION admin", "session-wide SET"),
    ("SET LOCAL ROLE admin", "role change"),
    ('SET LOCAL "role" = admin', "role change"),
    ("SET LOCAL role TO admin", "role change"),
    ("SET LOCAL SESSION AUTHORIZATION admin", "role change"),
    ("SELECT set_config('role', 'none', true)", "role change"),
    ("SELECT pg_catalog.set_config('ROLE', 'none', true)", "role change"),
    ("SELECT set_config('session_authorization', 'admin', true)", "role change"),
    ("SELECT set_config('work_mem', '64MB', false)", "session-wide set_config"),
    ("SELECT set_config('work_mem', '64MB', 1 = 0)", "session-wide set_config"),
    ("SELECT set_config(name, '1', true) FROM t", "set_config of a setting"),
    ("DO $$ BEGIN PERFORM 1; END $$", "a DO block"),
    ("do language plpgsql 'BEGIN END'", "a DO block"),
    ("SET LOCAL statement_timeout = 0", "statement_timeout"),
    ("SET LOCAL statement_timeout TO DEFAULT", "statement_timeout"),
    ("SELECT set_config('statement_timeout', '0', true)", "statement_timeout"),
    ("SET LOCAL idle_in_transaction_session_timeout = 0", "idle_in_transaction_session_timeout"),
]


@pytest.mark.parametrize(("text", "message"), REFUSED)
def test_check_refuses_transaction_control_and_session_settings_where_they_are(
    tmp_path: Path, text: str, message: str
) -> None:
    path = tmp_path / "jobs.yaml"
    path.write_text(
        "database: {url: 'postgresql://u@db/app'}\n"
        "jobs:\n"
        "  nightly:\n"
        '    cron: "* * * * *"\n'
        "    sql: |\n"
        "      SELECT 1;\n" + "".join(f"      {line}\n" for line in text.splitlines())
    )
    with pytest.raises(ConfigError) as caught:
        load_config([path])
    (issue,) = caught.value.issues
    assert (str(path), 5, "nightly", "sql") == (issue.file, issue.line, issue.job, issue.field)
    assert message in issue.message
    # Statement 2 (the smuggle's COMMIT is statement 3), on the script's line 2.
    assert re.search(r"statement [23] is .*\(line 2 of the sql text\)", issue.message)
    # The message says the rule, so a reader knows what to write instead.
    assert "pgcrond runs the script in its own transaction" in issue.message


@pytest.mark.parametrize(
    "text",
    [
        "SET LOCAL work_mem = '64MB'",
        "SET LOCAL search_path = app, public",
        "SET CONSTRAINTS ALL DEFERRED",
        "SELECT set_config('work_mem', '64MB', true)",
        "SELECT set_config('work_mem', '64MB', TRUE) AS applied",
        "SELECT 'COMMIT; SET role = x', $q$ DO $$ $q$ -- COMMIT\n",
        'SELECT "set_config" FROM t',
        "INSERT INTO t (statement_timeout) VALUES (0)",
        "SELECT 1 AS x€$a$, 2",
        "NOTIFY jobs, 'done'",
    ],
)
def test_settings_local_to_the_transaction_pass_the_lint(text: str) -> None:
    assert compile_script(text).statements


def test_the_splitter_reads_identifiers_and_dollar_quotes_as_postgresql_does() -> None:
    """Non-ASCII characters continue an identifier (and a dollar-quote tag)."""
    assert (
        "SELECT 1 AS x€$a$",
        "SELECT 2",
    ) == compile_script("SELECT 1 AS x€$a$; SELECT 2").statements
    assert ("SELECT $é$ ; $é$",) == compile_script("SELECT $é$ ; $é$").statements
    # After a number a dollar quote starts, as PostgreSQL's lexer has it.
    assert ("SELECT 1$a$ ; $a$",) == compile_script("SELECT 1$a$ ; $a$").statements


# -- against PostgreSQL ---------------------------------------------------------

EFFECTS_DDL = "CREATE TABLE {table} (id int GENERATED ALWAYS AS IDENTITY, who text)"
# What a statement after an escape writes: who it ran as.
WRITE = "INSERT INTO {effects} (who) VALUES (current_user)"


@dataclass
class Lab:
    dsn: str
    schema: str
    store: LeaseStore
    daemon_user: str
    role: str

    @property
    def effects(self) -> str:
        return f'"{self.schema}".effects'

    def rows(self, query: str) -> list[dict[str, Any]]:
        with psycopg.connect(self.dsn, autocommit=True, row_factory=dict_row) as conn:
            return conn.execute(query.format(effects=self.effects)).fetchall()

    async def claim(self, timing: LeaseTiming | None = None) -> Acquired:
        identity = Identity.schedule("j", f"manual:{uuid.uuid4().hex}")
        lease = await self.store.claim(identity, timing or LeaseTiming.build(timedelta(seconds=30)))
        assert isinstance(lease, Acquired)
        return lease

    async def run(
        self, *statements: str, role: str | None = None, seconds: float = 5
    ) -> bool | SqlJobFailed:
        """The job's statements through the store; True (committed) or the failure."""
        lease = await self.claim()
        work = SqlWork(
            statements=tuple(s.format(effects=self.effects, role=self.role) for s in statements),
            params={},
            statement_timeout=timedelta(seconds=seconds),
            role=role,
        )
        try:
            return await self.store.complete_with(lease, work)
        except SqlJobFailed as exc:
            return exc

    async def session(self) -> dict[str, Any]:
        """What the next user of the (only) pooled connection finds there, after a claim."""
        await self.claim()
        row = await self.store.db.fetchone(
            "SELECT current_user AS user, current_setting('role') AS role, "
            "current_setting('statement_timeout') AS statement_timeout, "
            "current_setting('work_mem') AS work_mem, "
            "pg_backend_pid() AS pid"
        )
        assert row is not None
        return dict(row)


@contextlib.asynccontextmanager
async def lab(dsn: str, schema: str) -> AsyncIterator[Lab]:
    """One pooled connection for everything: what a job leaves behind, the next claim meets."""
    role = f"r_{uuid.uuid4().hex[:10]}"
    with psycopg.connect(dsn, autocommit=True) as conn:
        daemon_user = conn.execute("SELECT current_user").fetchone()[0]  # type: ignore[index]
        conn.execute(f'CREATE ROLE "{role}" NOLOGIN')
        conn.execute(f'GRANT "{role}" TO current_user')
    db = Database(dsn, min_size=1, max_size=1)
    await db.open()
    try:
        store = LeaseStore(db, schema=schema, owner="t:1")
        await migrate(store)
        with psycopg.connect(dsn, autocommit=True) as conn:
            conn.execute(EFFECTS_DDL.format(table=f'"{schema}".effects'))
            conn.execute(f'GRANT USAGE ON SCHEMA "{schema}" TO "{role}"')
            conn.execute(f'GRANT INSERT ON "{schema}".effects TO "{role}"')
        yield Lab(dsn, schema, store, daemon_user, role)
    finally:
        await db.close()
        with psycopg.connect(dsn, autocommit=True) as conn:
            conn.execute(f'DROP OWNED BY "{role}"')
            conn.execute(f'DROP ROLE "{role}"')


async def test_a_smuggled_commit_is_refused_by_the_server_and_commits_nothing(
    pg_dsn: str, schema: str
) -> None:
    """Sent as one statement, 'INSERT …; COMMIT; …' is one extended-protocol message: refused."""
    async with lab(pg_dsn, schema) as it:
        answer = await it.run(
            "INSERT INTO {effects} (who) VALUES ('early') RETURNING 1 AS x€$a$; "
            "COMMIT; SELECT 1 / 0 AS y€$a$"
        )
        effects = it.rows("SELECT who FROM {effects}")
    assert isinstance(answer, SqlJobFailed)
    assert ("42601", []) == (answer.sqlstate, effects)
    assert "cannot insert multiple commands into a prepared statement" in str(answer)


async def test_a_statement_that_ends_the_transaction_fails_the_run_for_good(
    pg_dsn: str, schema: str
) -> None:
    """Past the lint, a lone COMMIT commits: the run fails without retries, nothing runs on."""
    async with lab(pg_dsn, schema) as it:
        answer = await it.run(WRITE, "COMMIT", WRITE)
        effects = it.rows("SELECT who FROM {effects}")
        (lease,) = it.rows(f'SELECT status FROM "{schema}".leases')
    assert isinstance(answer, SqlJobFailed)
    assert answer.permanent
    assert "statement 2 ended pgcrond's transaction" in str(answer)
    # The first write committed with the COMMIT; the one after it never ran.
    assert ([it.daemon_user], "RUNNING") == ([e["who"] for e in effects], lease["status"])


ROLE_ESCAPES = [
    "SELECT set_config('role', 'none', true)",
    "SET LOCAL role = none",
    'SET LOCAL role = "{daemon}"',
    'SET LOCAL SESSION AUTHORIZATION "{daemon}"',
    "DO $$ BEGIN PERFORM set_config('role', 'none', true); END $$",
]


@pytest.mark.parametrize("escape", ROLE_ESCAPES)
async def test_a_job_that_leaves_its_role_fails_and_rolls_back(
    pg_dsn: str, schema: str, escape: str
) -> None:
    async with lab(pg_dsn, schema) as it:
        answer = await it.run(
            WRITE, escape.replace("{daemon}", it.daemon_user), WRITE, role=it.role
        )
        effects = it.rows("SELECT who FROM {effects}")
    assert isinstance(answer, SqlJobFailed), f"committed, writing as {effects}"
    assert "statement 2 changed" in str(answer) and "current_user" in str(answer)
    assert [] == effects


async def test_a_job_that_lifts_its_statement_timeout_fails_before_the_next_statement(
    pg_dsn: str, schema: str
) -> None:
    async with lab(pg_dsn, schema) as it:
        started = time.monotonic()
        answer = await it.run(
            "SET LOCAL statement_timeout = 0", "SELECT pg_sleep(2)", WRITE, seconds=0.5
        )
        took = time.monotonic() - started
        effects = it.rows("SELECT who FROM {effects}")
    assert isinstance(answer, SqlJobFailed), "the sleep ran past the job's timeout"
    assert "statement 1 changed statement_timeout" in str(answer)
    assert [] == effects and took < 1.5


@pytest.mark.parametrize(
    "escape",
    [
        "SELECT set_config('statement_timeout', '1', false)",
        "SET statement_timeout = 1",
        "SELECT set_config('role', '{role}', false)",
    ],
)
async def test_a_session_wide_change_of_a_guarded_setting_fails_and_does_not_leak(
    pg_dsn: str, schema: str, escape: str
) -> None:
    async with lab(pg_dsn, schema) as it:
        before = await it.session()
        answer = await it.run(escape)
        after = await it.session()
    assert isinstance(answer, SqlJobFailed)
    assert before["pid"] == after["pid"], "the same connection serves the next claim"
    assert before == after


@pytest.mark.parametrize(
    "escape",
    [
        # Session-wide, then put back for the transaction: every check passes.
        "SELECT set_config('statement_timeout', '1', false), "
        "set_config('statement_timeout', '5s', true)",
        "SELECT set_config('role', '{role}', false), set_config('role', 'none', true)",
        "SET work_mem = '7MB'",
        "SELECT set_config('work_mem', '7MB', false)",
    ],
)
async def test_what_a_committed_job_set_for_its_session_is_undone_with_its_commit(
    pg_dsn: str, schema: str, escape: str
) -> None:
    async with lab(pg_dsn, schema) as it:
        before = await it.session()
        answer = await it.run(escape, WRITE)
        after = await it.session()
    assert answer is True
    assert before["pid"] == after["pid"], "the same connection serves the next claim"
    assert before == after


async def test_the_sql_pool_discards_session_state_before_the_next_job(
    pg_dsn: str, schema: str
) -> None:
    """A session advisory lock, a temporary table: gone when the connection comes back."""
    key = int(uuid.uuid4().int % 2**31)
    db = Database(pg_dsn, min_size=1, max_size=1)
    sql_db = Database.for_sql_jobs(pg_dsn, max_size=1)
    await db.open()
    await sql_db.open()
    try:
        store = LeaseStore(db, schema=schema, sql_db=sql_db)
        await migrate(store)
        lab_ = Lab(pg_dsn, schema, store, "", "")
        assert True is await lab_.run(
            f"SELECT pg_advisory_lock({key})", "CREATE TEMPORARY TABLE leftover (x int)"
        )
        assert True is await lab_.run("CREATE TEMPORARY TABLE leftover (x int)")
        held = lab_.rows(
            f"SELECT count(*) AS n FROM pg_locks WHERE locktype = 'advisory' AND objid = {key}"
        )
    finally:
        await sql_db.close()
        await db.close()
    assert [{"n": 0}] == held


# -- sql: jobs do not take the guard's connections --------------------------------


async def test_an_sql_job_waits_for_a_connection_of_its_own_without_holding_up_claims(
    pg_dsn: str, schema: str
) -> None:
    db = Database(pg_dsn, min_size=1, max_size=1)
    sql_db = Database.for_sql_jobs(pg_dsn, max_size=1)
    await db.open()
    await sql_db.open()
    try:
        store = LeaseStore(db, schema=schema, sql_db=sql_db)
        await migrate(store)
        it = Lab(pg_dsn, schema, store, "", "")
        busy = asyncio.ensure_future(it.run("SELECT pg_sleep(1.5)"))
        await asyncio.sleep(0.3)
        # Both waiting for the one sql: connection; claims go on meanwhile.
        patient = asyncio.ensure_future(it.run("SELECT 1", seconds=5))
        hasty = asyncio.ensure_future(it.run("SELECT 1", seconds=0.4))
        started = time.monotonic()
        for _ in range(5):
            await it.claim()
        claims_took = time.monotonic() - started
        results = await asyncio.gather(busy, patient, hasty)
    finally:
        await sql_db.close()
        await db.close()
    assert claims_took < 1.0
    assert [True, True] == list(results[:2])
    assert isinstance(results[2], SqlJobFailed)
    assert "no connection for sql: jobs within 0.4s" in str(results[2])


@pytest.mark.slow
def test_four_running_sql_jobs_leave_a_per_second_job_every_tick(
    pg_dsn: str, schema: str, tmp_path: Path
) -> None:
    """Four `SELECT pg_sleep(6)` jobs at once; the per-second job runs every tick on time."""
    # One instant a few seconds on, past the replica's start (a job due while it
    # starts runs late, still all four at once): no wait for a */15 tick.
    sleep_at = (datetime.now(UTC) + timedelta(seconds=3)).strftime("%Y-%m-%dT%H:%M:%SZ")
    every_second = {
        "cron": "* * * * * *",
        "command": ["/bin/true"],
        "misfire_grace": "3s",
        "lease": "2s",
        "late_ticks": "all",
    }
    sleepers = {f"sleeper-{n}": {"at": sleep_at, "sql": "SELECT pg_sleep(6)"} for n in range(4)}
    document = {
        "database": {"url": "${PGCROND_DATABASE_URL}", "schema": schema},
        "jobs": {"every-second": every_second, **sleepers},
    }
    text = yaml.safe_dump(document, sort_keys=False)
    with cluster(pg_dsn, schema, tmp_path) as running:
        (replica,) = running.start(running.write_config(text))

        def sleepers_done() -> list[dict[str, Any]]:
            rows = running.rows(
                "SELECT run_key, acquired_at, finished_at FROM {leases} "
                "WHERE code LIKE 'sleeper-%%' AND status = 'SUCCESS'"
            )
            return rows if len(rows) == 4 else []

        done = wait_until(sleepers_done, 40, "four sleepers to finish")
        start = min(r["acquired_at"] for r in done)
        end = max(r["finished_at"] for r in done)
        # The per-second job's ticks while the sleepers ran, and one after: from
        # the first tick after they started (when their instant passed while
        # the replica started, they run late, claimed by its start-up scan, and
        # a tick before its scheduler ran is not the per-second job's: it has
        # no record yet, docs/configuration.md; fresh-clone CI run 71).
        expected = set()
        moment = start.replace(microsecond=0) + timedelta(seconds=1)
        while moment <= end + timedelta(seconds=1):
            expected.add(moment.strftime("%Y-%m-%dT%H:%M:%SZ"))
            moment += timedelta(seconds=1)

        def recorded_or_past_grace() -> bool:
            # Every tick decided, or past the last one's misfire_grace + lease
            # (then a tick without its record fails the assertion below).
            decided = running.rows(
                "SELECT run_key FROM {leases} WHERE code = 'every-second' AND status <> 'RUNNING'"
            )
            past = datetime.now(UTC) > end + timedelta(seconds=6)
            return past or expected <= {row["run_key"] for row in decided}

        wait_until(recorded_or_past_grace, 20, "the last ticks' records")
        replica.signal(signal.SIGTERM)
        assert 0 == replica.wait_exit(30)
        rows = running.rows(
            "SELECT run_key, status, reason FROM {leases} WHERE code = 'every-second'"
        )
    recorded = {row["run_key"]: (row["status"], row["reason"]) for row in rows}
    assert end - start > timedelta(seconds=5), "the sleepers ran at once"
    assert {key: ("SUCCESS", None) for key in sorted(expected)} == {
        key: recorded.get(key) for key in sorted(expected)
    }
