"""An ``sql:`` job's transaction: its statements and the run's SUCCESS, together or not at all.

It runs on a connection of the ``sql:`` jobs' own (``Database.for_sql_jobs``),
never one of the guard's: a job holds its connection for the whole
transaction, and claims, heartbeats and finalizes of every other job must not
wait for it. A job that finds none free waits for one within its timeout.

What ``pgcrond check`` refuses in a job's text is a lint; what holds whatever
the text does is here:

* each statement is sent alone with the extended protocol (pipeline mode
  always uses it), so a text that PostgreSQL would read as several statements
  is refused by the server instead of run, COMMITs and all;
* after each statement, before the next one runs, the transaction, the role
  and the server-side bounds are read again: a statement that ended the
  transaction, changed who the statements run as or lifted a bound fails the
  run (rolled back; not retried when the transaction had ended, as its effects
  may have committed);
* before the SUCCESS, every setting, the role and the session user go back to
  the session's defaults inside the transaction, so a session-wide change a
  statement slipped past the checks is undone with the commit, behind a
  transaction pooler too; and the connection is reset (``DISCARD ALL``) when
  it is given back.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import psycopg
from psycopg.pq import TransactionStatus

from pgcrond.core.actions import SqlWork
from pgcrond.core.timing import to_ms
from pgcrond.errors import LeaseLost, SqlJobFailed
from pgcrond.storage.claims import Acquired
from pgcrond.storage.db import Database, NoConnection
from pgcrond.storage.sql import Queries

# How often the server checks that the client is still there while a
# statement runs (PostgreSQL 14+), and the statement timeout of the SUCCESS
# finalize that ends the transaction.
_CONNECTION_CHECK_MS = 1000
_FINALIZE_TIMEOUT = timedelta(seconds=5)


async def commit_with(db: Database, queries: Queries, lease: Acquired, work: SqlWork) -> bool:
    """Run ``work`` and record the lease's SUCCESS in one transaction; False when fenced.

    A failing statement, or one that breaks the rules above, rolls it all back
    and raises :class:`SqlJobFailed`; no free connection within the job's
    timeout raises it too, before anything was sent. An outage raises
    DatabaseUnavailable, and then it is unknown whether the COMMIT landed, so
    the caller must never record a plain SUCCESS after it (a FAIL is safe: it
    is fenced by a SUCCESS that did land).
    """
    wait = work.statement_timeout.total_seconds()
    try:
        async with db.connection(wait=wait) as conn:
            told = work.output
            if told is None:
                return await _transaction(conn, queries, lease, work)

            def notice(diagnostic: psycopg.errors.Diagnostic) -> None:
                told("stderr", f"{diagnostic.severity}: {diagnostic.message_primary}\n".encode())

            # The connection goes back to the pool: its handler must not stay.
            conn.add_notice_handler(notice)
            try:
                return await _transaction(conn, queries, lease, work)
            finally:
                conn.remove_notice_handler(notice)
    except NoConnection as exc:
        raise SqlJobFailed(
            f"no connection for sql: jobs within {wait:g}s (each running sql: job holds one "
            "of database.sql_connections; or the database is unreachable)"
        ) from exc


async def _transaction(
    conn: psycopg.AsyncConnection[Any], queries: Queries, lease: Acquired, work: SqlWork
) -> bool:
    async with conn.transaction():
        async with conn.pipeline():
            await conn.execute(queries.get("sql_job_bounds"), _bounds(work.statement_timeout, work))
            locked = await conn.execute(
                queries.get("sql_job_lock"), {"id": lease.id, "owner_token": lease.owner_token}
            )
            if work.role is not None:
                await conn.execute(queries.get("sql_job_role"), {"role": work.role})
            state = await conn.execute(queries.get("sql_job_state"))
        if await locked.fetchone() is None:
            return False
        expected = dict(await state.fetchone() or {})
        for number, statement in enumerate(work.statements, 1):
            try:
                async with conn.pipeline():
                    # The job's own SQL is data, run once: never prepared.
                    ran = await conn.execute(statement, work.params, prepare=False)
                    state = await conn.execute(queries.get("sql_job_state"))
            except psycopg.Error as exc:
                if _is_outage(exc):
                    raise  # translated by the connection
                # The job's own error (psycopg files a statement_timeout,
                # a deadlock or a lock timeout under OperationalError too).
                raise SqlJobFailed(f"{type(exc).__name__}: {exc}".strip(), exc.sqlstate) from exc
            if conn.info.transaction_status != TransactionStatus.INTRANS:
                raise SqlJobFailed(
                    f"statement {number} ended pgcrond's transaction: what it did may have "
                    "committed without the run's SUCCESS, so the run is failed without retries",
                    permanent=True,
                )
            if work.output is not None:
                work.output("stdout", _command_tag(number, ran).encode())
            found = dict(await state.fetchone() or {})
            changed = [
                f"{name} ({value} -> {found.get(name)})"
                for name, value in expected.items()
                if found.get(name) != value
            ]
            if changed:
                raise SqlJobFailed(
                    f"statement {number} changed {', '.join(changed)}, which pgcrond sets for "
                    "the job's statements: rolled back"
                )
        async with conn.pipeline():
            await conn.execute(queries.get("sql_job_reset_settings"))
            await conn.execute(queries.get("sql_job_reset_user"))
            await conn.execute(queries.get("sql_job_bounds"), _bounds(_FINALIZE_TIMEOUT, work))
            success = await conn.execute(
                queries.get("sql_job_success"), {"id": lease.id, "owner_token": lease.owner_token}
            )
        # Locked by us above, so it is still ours; checked all the same.
        if await success.fetchone() is None:
            raise LeaseLost(f"lease of {lease.identity} changed under its row lock")
    return True


def _command_tag(number: int, cursor: psycopg.AsyncCursor[Any]) -> str:
    """``statement 2: INSERT 0 1 (1 row)``, as psql would tell it."""
    rows = cursor.rowcount
    count = "" if rows < 0 else f" ({rows} row{'' if rows == 1 else 's'})"
    return f"statement {number}: {cursor.statusmessage or '(no command tag)'}{count}\n"


def _bounds(statement_timeout: timedelta, work: SqlWork) -> dict[str, int]:
    return {
        "statement_timeout_ms": to_ms(statement_timeout),
        "idle_timeout_ms": to_ms(work.idle_timeout),
        "check_interval_ms": _CONNECTION_CHECK_MS,
    }


def _is_outage(exc: psycopg.Error) -> bool:
    """The connection or server failed (no SQLSTATE, class 08, 57P0x, read-only), not the SQL."""
    state = exc.sqlstate
    return state is None or state.startswith("08") or state in ("57P01", "57P02", "57P03", "25006")
