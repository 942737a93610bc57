"""Connection-level helpers: passwords never leave through messages."""

from __future__ import annotations

import asyncio
import itertools
import time

import psycopg
import pytest

from pgcrond.core.redaction import redact
from pgcrond.errors import DatabaseUnavailable
from pgcrond.storage.db import Database, translate


@pytest.mark.parametrize(
    ("dsn", "expected"),
    [
        ("postgresql://app:s3cret@db:5432/x", "postgresql://app:***@db:5432/x"),
        ("postgres://app:p%40ss@db/x?sslmode=require", "postgres://app:***@db/x?sslmode=require"),
        ("host=db user=app password=s3cret dbname=x", "host=db user=app password=*** dbname=x"),
        ("host=db password='s3 cret' dbname=x", "host=db password=*** dbname=x"),
        ("postgresql://db/x?user=app&password=s3cret", "postgresql://db/x?user=app&password=***"),
        ("postgresql://app@db/x", "postgresql://app@db/x"),
    ],
)
def test_redact_hides_every_form_of_password(dsn: str, expected: str) -> None:
    assert expected == redact(dsn)


# A real libpq connection attempt (refused): the integration tier's.
@pytest.mark.usefixtures("pg_dsn")
def test_a_driver_error_quoting_the_dsn_is_redacted() -> None:
    with pytest.raises(psycopg.Error) as info:
        psycopg.connect("host=127.0.0.1 port=1 password=s3cret connect_timeout=1 user=x")
    translated = translate(info.value)
    assert isinstance(translated, DatabaseUnavailable)
    assert "s3cret" not in str(translated)
    bad = psycopg.ProgrammingError("invalid dsn: 'postgresql://app:s3cret@db/x' is wrong")
    assert "s3cret" not in str(translate(bad))


@pytest.mark.parametrize(
    "dsn",
    [
        "postgresql://u:p@ss@db/x",
        "postgresql://u:pa/ss@db/x",
        "postgresql://u:se#cret@db/x",
        "connection to 'postgresql://u:p@ss@db/x' failed",
    ],
)
def test_redact_hides_passwords_with_url_delimiters_in_them(dsn: str) -> None:
    redacted = redact(dsn)
    assert "***@" in redacted
    assert not any(part in redacted for part in ("p@ss", "pa/ss", "se#cret"))


# Real libpq connection attempts: the integration tier's.
@pytest.mark.usefixtures("pg_dsn")
async def test_the_pool_tries_to_reconnect_every_half_second_not_with_growing_backoff() -> None:
    """psycopg_pool's own backoff (1 s, 2 s, 4 s, ...) would let ticks miss after an outage.

    A listener that hangs up on every connection stands in for a database that
    is down; four attempts come within 1.5 s (+ jitter) here, within 7 s with
    the library's default backoff. Fails loudly too if a psycopg_pool upgrade
    stops calling the reconnect hook the pool overrides.
    """
    attempts: list[float] = []
    four = asyncio.Event()

    def hang_up(_: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        attempts.append(time.monotonic())
        if len(attempts) >= 4:
            four.set()
        writer.close()

    server = await asyncio.start_server(hang_up, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    db = Database(
        f"host=127.0.0.1 port={port} dbname=x user=x sslmode=disable gssencmode=disable",
        min_size=1,
    )
    try:
        await db.open()
        await asyncio.wait_for(four.wait(), 4.0)
    finally:
        await db.close()
        server.close()
        await server.wait_closed()
    gaps = [later - earlier for earlier, later in itertools.pairwise(attempts[:4])]
    assert max(gaps) < 1.0, gaps


async def test_an_sql_jobs_connection_dropped_while_idle_is_replaced_before_a_job_gets_it(
    pg_dsn: str,
) -> None:
    """Fault run seed 8: after one cut of the network, a `sql:` job's attempts each took
    another dead idle connection from the pool and failed on it, spending its retries."""
    sql_db = Database.for_sql_jobs(pg_dsn, max_size=2, application_name="pgcrond-sql-check")
    await sql_db.open()
    try:
        async with sql_db.connection() as first, sql_db.connection() as second:
            pids = {first.info.backend_pid, second.info.backend_pid}
        async with await psycopg.AsyncConnection.connect(pg_dsn, autocommit=True) as admin:
            # Both back in the pool once their reset ran (the pool's own task).
            idle: list[tuple[int]] = []
            while len(idle) < 2:
                found = await admin.execute(
                    "SELECT pid FROM pg_stat_activity WHERE pid = ANY(%s)"
                    " AND state = 'idle' AND query = 'DISCARD ALL'",
                    (list(pids),),
                )
                idle = await found.fetchall()
            # The server drops them while they sit idle (as a cut would).
            for pid in pids:
                await admin.execute("SELECT pg_terminate_backend(%s, 5000)", (pid,))
        for _ in range(2):
            async with sql_db.connection() as conn:
                cursor = await conn.execute("SELECT pg_backend_pid()")
                row = await cursor.fetchone()
                assert row is not None and row["pg_backend_pid"] not in pids
    finally:
        await sql_db.close()
