"""The replicas' statements by name (``pg_stat_statements``): what a transaction count is made of.

:func:`count_statements` once per throwaway server (a restart loads the
library; the bench's reader role is made), :func:`enable` in each measured
database, then :func:`statements` before and after the measured window. The
bench reads as a role of its own, so its reads are not among the counts.
"""

from __future__ import annotations

from typing import Literal

import psycopg

from pgcrond.storage.sql import named_queries
from pgcrond.testing import LocalServer

READER = "pgcrond_bench"
# The named statements a tick is made of, in the order the benches print them:
# claims / finalizes / looks / heartbeats (then every other statement).
TICK = ("claim", "finalize", "standings", "heartbeat")


def count_statements(server: LocalServer) -> None:
    """Load ``pg_stat_statements`` (a restart) and make the bench's reader role."""
    with psycopg.connect(server.dsn, autocommit=True) as conn:
        conn.execute("ALTER SYSTEM SET shared_preload_libraries = 'pg_stat_statements'")
    server.stop()
    server.start()
    with psycopg.connect(server.dsn, autocommit=True) as conn:
        conn.execute(f"CREATE ROLE {READER} LOGIN IN ROLE pg_read_all_stats")


def enable(dsn: str) -> None:
    """The view in the database ``dsn`` names (the counts themselves are server-wide)."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("CREATE EXTENSION IF NOT EXISTS pg_stat_statements")


def as_reader(dsn: str) -> str:
    return psycopg.conninfo.make_conninfo(dsn, user=READER)


def statements(dsn: str, column: Literal["calls", "rows"] = "calls") -> dict[str, int]:
    """The replicas' statements so far in this database, by query name.

    ``column``: ``"calls"`` (how many were made) or ``"rows"`` (how many rows
    they returned or touched: a claim's or a look's ticks).

    An unnamed statement (a transaction's ``BEGIN`` and ``COMMIT``, a
    session's ``SET``) is named by its own first line, normalized.

    ``dsn`` is the reader's: the count's own read is not among them.
    """
    firsts = {body.splitlines()[0]: name for name, body in named_queries().items()}
    with psycopg.connect(dsn, autocommit=True) as conn:
        rows = conn.execute(
            f"SELECT s.query, s.{column} FROM pg_stat_statements s "
            "JOIN pg_database d ON d.oid = s.dbid JOIN pg_roles r ON r.oid = s.userid "
            "WHERE d.datname = current_database() AND r.rolname <> %s",
            (READER,),
        ).fetchall()
    counted: dict[str, int] = {}
    for query, calls in rows:
        first = str(query).lstrip().split("\n", 1)[0]
        name = firsts.get(first, first[:60])
        counted[name] = counted.get(name, 0) + int(calls)
    return counted


def made(before: dict[str, int], after: dict[str, int]) -> dict[str, int]:
    """The statements made between two reads, by name."""
    return {name: after[name] - before.get(name, 0) for name in after}


def split(counted: dict[str, int]) -> list[int]:
    """Claims, finalizes, looks, heartbeats, and every other statement."""
    other = sum(calls for name, calls in counted.items() if name not in TICK)
    return [*(counted.get(name, 0) for name in TICK), other]
