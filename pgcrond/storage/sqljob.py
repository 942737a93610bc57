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
* the transaction never outlives the run's lease: before the first statement,
  after each one and before the SUCCESS, its server-side bounds are set to
  what the lease has left (``sql_job_bounds``), so an owner that stops
  mid-transaction (a SIGSTOP, a partition) loses the row lock with its lease,
  and a takeover claim finds the row free; an owner that sees its transaction
  end once the lease may have lapsed records nothing (fenced): the tick is the
  takeover's;
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

import math
import time
from datetime import timedelta
from typing import Any

import psycopg
from psycopg import sql
from psycopg.pq import TransactionStatus

from pgcrond.core.actions import SqlWork
from pgcrond.core.timing import to_ms
from pgcrond.errors import PgcrondError, SqlJobFailed
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
    lapse = _Lapse()
    try:
        async with db.connection(wait=wait) as conn:
            told = work.output
            if told is None:
                return await _transaction(conn, queries, lease, work, lapse)

            def notice(diagnostic: psycopg.errors.Diagnostic) -> None:
                told("stderr", f"{diagnostic.severity}: {diagnostic.message_primary}\n".encode())

            # The connection goes back to the pool: its handler must not stay.
            conn.add_notice_handler(notice)
            try:
                return await _transaction(conn, queries, lease, work, lapse)
            finally:
                conn.remove_notice_handler(notice)
    except NoConnection as exc:
        raise SqlJobFailed(
            f"no connection for sql: jobs within {wait:g}s (each running sql: job holds one "
            "of database.sql_connections; or the database is unreachable)"
        ) from exc
    except PgcrondError:
        if lapse.passed():
            # Ended once the lease may have lapsed (the server's lease bound,
            # or anything seen after a stall): another replica may hold the
            # tick, and a FAIL recorded now would end it for good. The row is
            # the SUCCESS that landed, or the takeover's to claim.
            return False
        raise


class _Lapse:
    """When the lease may lapse, by the local clock: the send of the statement that read
    what the lease had left, plus that (the server read it after the send, so the lease
    holds at least that long, and no longer can be assumed)."""

    def __init__(self) -> None:
        self.at = math.inf

    def read(self, sent: float, bounds: dict[str, Any]) -> None:
        """``bounds``: a ``sql_job_bounds`` row, read by a statement sent at ``sent``."""
        self.at = sent + bounds["left_ms"] / 1000

    def passed(self) -> bool:
        return time.monotonic() >= self.at


async def _transaction(
    conn: psycopg.AsyncConnection[Any],
    queries: Queries,
    lease: Acquired,
    work: SqlWork,
    lapse: _Lapse,
) -> bool:
    params: dict[str, Any] = {
        "id": lease.id,
        "owner_token": lease.owner_token,
        "role": work.role,
        "statement_timeout_ms": to_ms(work.statement_timeout),
        "check_interval_ms": _CONNECTION_CHECK_MS,
    }
    async with conn.transaction():
        locked = await (await conn.execute(queries.get("sql_job_lock"), params)).fetchone()
        if locked is None:
            return False
        params["expires_at"] = locked["expires_at"]
        start = ("sql_job_bounds", *(("sql_job_role",) if work.role else ()), "sql_job_state")
        sent = time.monotonic()
        bounds, *_, expected = await _exchange(conn, queries, start, params)
        lapse.read(sent, bounds)
        for number, statement in enumerate(work.statements, 1):
            try:
                # The job's own SQL is data, run once: never prepared, and
                # sent alone with the extended protocol (which binary results
                # force outside pipeline mode), which refuses several at once.
                ran = await conn.execute(statement, work.params, prepare=False, binary=True)
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
            # What the statement left, then the bounds of the next one by what
            # the lease has left, and what they are now: one round trip.
            sent = time.monotonic()
            found, bounds, bounded = await _exchange(
                conn, queries, ("sql_job_state", "sql_job_bounds", "sql_job_state"), params
            )
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
            lapse.read(sent, bounds)
            expected = bounded
        finish = (
            "sql_job_reset_settings",
            "sql_job_reset_user",
            "sql_job_bounds",
            "sql_job_success",
        )
        *_, success = await _exchange(
            conn, queries, finish, {**params, "statement_timeout_ms": to_ms(_FINALIZE_TIMEOUT)}
        )
        if not success:
            # The lease lapsed before the SUCCESS (this transaction holds the
            # row's lock, so nothing else changed it): rolled back, fenced.
            return False
    return True


async def _exchange(
    conn: psycopg.AsyncConnection[Any], queries: Queries, names: tuple[str, ...], params: Any
) -> list[dict[str, Any]]:
    """Our own statements ``names`` in one round trip; each one's first row ({} if none).

    One simple query with the values bound by the client, never in pipeline
    mode (the idle timer, see sql_job_bounds).
    """
    cursor = psycopg.AsyncClientCursor(conn)
    await cursor.execute(sql.SQL(";\n").join(queries.get(name) for name in names), params)
    rows: list[dict[str, Any]] = []
    while True:
        row = await cursor.fetchone() if cursor.description else None
        rows.append(dict(row or {}))
        if not cursor.nextset():
            return rows


def _command_tag(number: int, cursor: psycopg.AsyncCursor[Any]) -> str:
    """``statement 2: INSERT 0 1 (1 row)``, as psql would tell it."""
    rows = cursor.rowcount
    count = "" if rows < 0 else f" ({rows} row{'' if rows == 1 else 's'})"
    return f"statement {number}: {cursor.statusmessage or '(no command tag)'}{count}\n"


def _is_outage(exc: psycopg.Error) -> bool:
    """The connection or server failed (no SQLSTATE, class 08, 57P0x, read-only), not the SQL."""
    state = exc.sqlstate
    return state is None or state.startswith("08") or state in ("57P01", "57P02", "57P03", "25006")
