"""How pgcrond talks to PostgreSQL: the pool, connection settings, errors.

Nothing above this module and the stores sees psycopg. Connections are in
autocommit, so each statement is one round trip and holds no transaction open.
TCP keepalives make a dead server or a cut network show up within seconds
instead of at the kernel's two-hour default.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from contextlib import asynccontextmanager
from typing import Any

import psycopg
from psycopg import sql
from psycopg.conninfo import conninfo_to_dict
from psycopg.errors import ReadOnlySqlTransaction
from psycopg.rows import DictRow, dict_row
from psycopg_pool import AsyncConnectionPool, PoolTimeout
from psycopg_pool.base import AttemptWithBackoff

from pgcrond.core.redaction import redact
from pgcrond.errors import DatabaseError, DatabaseUnavailable, PgcrondError

Query = str | sql.Composed | sql.SQL
Params = Mapping[str, Any] | None

# How pgcrond uses a connection (driver settings, not libpq parameters).
DRIVER_SETTINGS: dict[str, Any] = {
    "autocommit": True,
    "row_factory": dict_row,
    # Never server-side prepared by default: behind PgBouncer in transaction
    # pooling the next statement may land on a server connection that never saw it.
    "prepare_threshold": None,
}
# libpq parameters pgcrond sets only where the user set nothing (in the URL or
# conninfo, or through libpq's own environment variable): a bounded connect,
# and TCP keepalives so that a dead server or a cut network shows up within
# seconds instead of at the kernel's two-hour default.
LIBPQ_DEFAULTS: dict[str, Any] = {
    "connect_timeout": 5,
    "keepalives": 1,
    "keepalives_idle": 10,
    "keepalives_interval": 5,
    "keepalives_count": 3,
    "application_name": "pgcrond",
}
# libpq's environment variable for each default that has one.
_LIBPQ_ENV = {"connect_timeout": "PGCONNECT_TIMEOUT", "application_name": "PGAPPNAME"}


def connection_settings(
    conninfo: str, *, application_name: str = "pgcrond", environ: Mapping[str, str] | None = None
) -> dict[str, Any]:
    """Keyword arguments for a connection to ``conninfo``: ours, under the user's.

    The URL or conninfo goes to libpq as written; a parameter the user set
    there, or through its PG* variable, is never replaced.
    """
    environ = os.environ if environ is None else environ
    try:
        given = set(conninfo_to_dict(conninfo))
    except psycopg.ProgrammingError:
        given = set()  # libpq reports the malformed conninfo itself, at connect
    defaults = {**LIBPQ_DEFAULTS, "application_name": application_name}
    added = {
        name: value
        for name, value in defaults.items()
        if name not in given and not environ.get(_LIBPQ_ENV.get(name, ""))
    }
    return {**DRIVER_SETTINGS, **added}


# The pool reconnects after a failure with exponential backoff (1 s, 2 s, 4 s,
# ...): after a 10 s outage its next attempt can come 8 s after the database
# is back, while every claim waits for a connection and the ticks' misfire
# windows run out. A steady ~0.5 s keeps "claim within about a second of the
# database answering again"; it only costs connection attempts while the
# database is down, never a query while idle.
#
# psycopg_pool (3.3) has no public setting for this: `reconnect_timeout` only
# bounds how long it keeps trying. Its pool takes the reconnect's backoff as
# an argument of the private `_add_connection` (None: a fresh default one), so
# our pool hands it a steady one there; no other pool in the process (a
# user's own) is touched, as setting the class's delays would. What would
# remove this: a reconnect backoff parameter on AsyncConnectionPool (initial
# delay, backoff factor).
class _SteadyReconnect(AttemptWithBackoff):
    INITIAL_DELAY = 0.5
    DELAY_BACKOFF = 1.0


class _Pool(AsyncConnectionPool[psycopg.AsyncConnection[DictRow]]):
    """The driver's pool, reconnecting every ~0.5 s while the database is down."""

    async def _add_connection(
        self, attempt: AttemptWithBackoff | None, growing: bool = False
    ) -> None:
        steady = attempt or _SteadyReconnect(timeout=self.reconnect_timeout)
        await super()._add_connection(steady, growing)


class NoConnection(DatabaseUnavailable):
    """No pooled connection came free (or could be made) within the wait."""


def translate(exc: Exception) -> PgcrondError:
    """Map a driver error to ours: outages are retryable, the rest is not.

    The message is redacted: libpq quotes the connection string in some errors
    (a malformed DSN), and these messages end up in logs.
    """
    if isinstance(exc, PoolTimeout):
        return NoConnection(redact(f"database unavailable: {exc}".strip()))
    # A read-only server (a demoted primary that DNS still points at, just
    # after a failover) is an outage to wait out, like a refused connection.
    if isinstance(exc, psycopg.OperationalError | ReadOnlySqlTransaction):
        return DatabaseUnavailable(redact(f"database unavailable: {exc}".strip()))
    return DatabaseError(redact(f"{type(exc).__name__}: {exc}".strip()))


# fetchall_each's transaction (see there).
_BEGIN = sql.SQL("BEGIN ISOLATION LEVEL READ COMMITTED")
_COMMIT = sql.SQL("COMMIT")
# A connection back from an sql: job: everything its session may still hold
# (settings, role, advisory locks, temporary tables, LISTENs, cursors) ends.
_DISCARD_ALL = sql.SQL("DISCARD ALL")


async def _discard_session(conn: psycopg.AsyncConnection[Any]) -> None:
    await conn.execute(_DISCARD_ALL)


class Database:
    """A small connection pool; ``open()`` does not wait for the server."""

    def __init__(
        self,
        conninfo: str,
        *,
        min_size: int = 1,
        max_size: int = 4,
        timeout: float = 5.0,
        application_name: str = "pgcrond",
        prepared: bool = False,
        discard_sessions: bool = False,
        check_out: bool = False,
    ) -> None:
        """``prepared``: let psycopg prepare statements server-side (see CONNECTION_SETTINGS).

        ``discard_sessions``: a connection given back is reset (``DISCARD
        ALL``) before anyone gets it again (:meth:`for_sql_jobs`).
        ``check_out``: a connection is checked (an empty query) as it is
        handed out, and a dead one replaced (:meth:`for_sql_jobs`).
        """
        self.conninfo = conninfo
        self.timeout = timeout
        self._pool = _Pool(
            conninfo,
            connection_class=psycopg.AsyncConnection[DictRow],
            kwargs={
                **connection_settings(conninfo, application_name=application_name),
                # Prepared at first use: worth it where the server keeps them
                # for the session (no pooler, session pooling, PgBouncer >= 1.21).
                **({"prepare_threshold": 0} if prepared else {}),
            },
            min_size=min_size,
            max_size=max_size,
            timeout=timeout,
            open=False,
            name=application_name,
            reset=_discard_session if discard_sessions else None,
            check=AsyncConnectionPool.check_connection if check_out else None,
        )

    @classmethod
    def for_sql_jobs(
        cls, conninfo: str, *, max_size: int, application_name: str = "pgcrond-sql"
    ) -> Database:
        """The connections ``sql:`` jobs' transactions run on, apart from the guard's pool.

        A job holds one for its whole transaction, so they must never be the
        connections that claims, heartbeats and finalizes of other jobs wait
        for. None is kept open while no job runs, and each is reset when the
        job gives it back: a job's session-level leftovers never meet the next.
        Each is checked as a job takes it: an idle connection the network or
        the server dropped meanwhile is replaced, not handed to the job (whose
        attempt would fail on it and spend a retry — one per dead connection,
        after a cut; the guard's own statements retry an outage for free).
        """
        return cls(
            conninfo,
            min_size=0,
            max_size=max_size,
            application_name=application_name,
            discard_sessions=True,
            check_out=True,
        )

    async def open(self) -> None:
        await self._pool.open(wait=False)

    async def resize(self, max_size: int) -> None:
        """Change how many connections the pool may hold (e.g. after a reload)."""
        await self._pool.resize(min(self._pool.min_size, max_size), max_size)

    async def close(self) -> None:
        await self._pool.close()

    @asynccontextmanager
    async def connection(
        self, *, wait: float | None = None
    ) -> AsyncIterator[psycopg.AsyncConnection[DictRow]]:
        """A pooled connection, waited for ``wait`` seconds (the pool's timeout by default)."""
        try:
            async with self._pool.connection(timeout=wait) as conn:
                yield conn
        except (psycopg.Error, PoolTimeout) as exc:
            raise translate(exc) from exc

    async def fetchone(self, query: Query, params: Params = None) -> DictRow | None:
        async with self.connection() as conn:
            cursor = await conn.execute(query, params)
            return await cursor.fetchone()

    async def fetchall(
        self, query: Query, params: Params = None, *, on_send: Callable[[], None] | None = None
    ) -> list[DictRow]:
        """All rows; ``on_send()`` is called once a connection is had, right before the send."""
        async with self.connection() as conn:
            if on_send is not None:
                on_send()
            cursor = await conn.execute(query, params)
            return await cursor.fetchall()

    async def fetchall_after(
        self,
        first: Query,
        then: Query,
        params: Params = None,
        *,
        on_send: Callable[[], None] | None = None,
    ) -> list[DictRow]:
        """``first`` and ``then`` in one round trip and one transaction; ``then``'s rows.

        As :meth:`fetchall_each`: a lock ``first`` takes holds while ``then``
        runs, and ``then`` sees everything committed before it was granted.
        """
        return (await self.fetchall_each([(first, params), (then, params)], on_send=on_send))[1]

    async def fetchall_each(
        self,
        statements: Sequence[tuple[Query, Params]],
        *,
        on_send: Callable[[], None] | None = None,
    ) -> list[list[DictRow]]:
        """``statements`` in one round trip and one transaction, in order; each one's rows.

        Pipelined (BEGIN, the statements, COMMIT, one Sync) and bound
        server-side. READ COMMITTED whatever the server's default, so each
        statement takes a fresh snapshot, after every lock an earlier one
        took. Nothing prepared, nothing session-scoped: PgBouncer in
        transaction pooling sees one transaction. A statement that returns
        no rows (a bare ``INSERT``) answers an empty list.
        """
        async with self.connection() as conn:
            if on_send is not None:
                on_send()
            cursors = [conn.cursor() for _ in statements]
            try:
                async with conn.pipeline():
                    await conn.execute(_BEGIN)
                    for cursor, (query, params) in zip(cursors, statements, strict=True):
                        await cursor.execute(query, params)
                    await conn.execute(_COMMIT)
                return [
                    [] if cursor.description is None else await cursor.fetchall()
                    for cursor in cursors
                ]
            except psycopg.Error as exc:
                # A failed statement left the transaction aborted: end it here,
                # so the pool gets the connection back idle.
                with contextlib.suppress(psycopg.Error):
                    await conn.rollback()
                raise translate(exc) from exc
            finally:
                for cursor in cursors:
                    await cursor.close()

    async def execute(self, query: Query, params: Params = None) -> int:
        """Run a statement; returns the number of rows it touched."""
        async with self.connection() as conn:
            cursor = await conn.execute(query, params)
            return cursor.rowcount
