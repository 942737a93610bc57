"""Is there a connection pooler between us and PostgreSQL, and does it pool transactions?

One probe at start-up, at most three round trips on two pooled connections
(repeated a few times behind a pooler that looks like session mode):

1. ``SELECT pg_backend_pid()`` on connection A, which also sets a session
   variable. When the server's pid equals the one the connection was given at
   start-up (BackendKeyData), nothing sits in between: ``direct``, done. A
   pooler (PgBouncer, in any mode) hands its clients a made-up key instead.
2. Behind a pooler, connection B opens a transaction, which pins one server
   connection to B while it lasts, and asks its pid.
3. Connection A, in a new transaction, asks its pid and the variable again.

In session pooling A keeps its server connection for good: same pid, the
variable is still set, and B was given another one. In transaction pooling A's
server connection went back to the pool after step 1, so either B got it (the
pooler reuses the most recently freed connection first) or A's next
transaction landed elsewhere and lost the variable: ``transaction``.

Nothing pgcrond does today needs session state (every statement is one
autocommit transaction; the advisory guard's lock lives in one transaction),
so the result is only reported. Features built on session state, such as
LISTEN/NOTIFY wake-ups, must degrade to polling under ``transaction`` (see
docs/deployment.md).
"""

from __future__ import annotations

import asyncio
import secrets
from dataclasses import dataclass
from typing import Literal

import psycopg
import structlog
from psycopg.rows import DictRow

from pgcrond.errors import PgcrondError
from pgcrond.storage.db import Database

log = structlog.get_logger("pgcrond.storage.pooling")

PoolingMode = Literal["direct", "session", "transaction", "unknown"]

_SETTING = "pgcrond.pooling_probe"
_MARK = f"SELECT pg_backend_pid() AS pid, set_config('{_SETTING}', %(mark)s, false) AS mark"
_PID = "SELECT pg_backend_pid() AS pid"
_CHECK = f"SELECT pg_backend_pid() AS pid, current_setting('{_SETTING}', true) AS mark"

# What degrades under transaction pooling, for the start-up log line.
DEGRADED = (
    "session state does not survive between transactions: pgcrond sends only "
    "single-statement autocommit transactions and holds advisory locks inside one "
    "transaction, so both guards work; LISTEN/NOTIFY-based features fall back to polling"
)


@dataclass(frozen=True)
class Pooling:
    mode: PoolingMode
    # The pids seen, for the log: start-up key, then steps 1-3 (0 = not asked).
    key_pid: int = 0
    first_pid: int = 0
    other_pid: int = 0
    second_pid: int = 0
    error: str | None = None

    @property
    def transaction_pooled(self) -> bool:
        return self.mode == "transaction"


async def detect_pooling(db: Database, *, within_s: float = 5.0) -> Pooling:
    """Probe ``db`` as the module docstring says; never raises a database error.

    Movement is proof of transaction pooling, but its absence is not: another
    client may take A's freed server connection before B asks, and A may then
    get it back. So a "session" answer is asked again, a few times.
    """
    found = await _probe(db, within_s)
    for _ in range(_SESSION_CONFIRMATIONS):
        if found.mode != "session":
            break
        found = await _probe(db, within_s)
    return found


# How many more probes must agree before a pooler is reported as session mode.
_SESSION_CONFIRMATIONS = 3


async def _probe(db: Database, within_s: float) -> Pooling:
    mark = secrets.token_hex(8)
    try:
        async with asyncio.timeout(within_s), db.connection() as first:
            key_pid = first.info.backend_pid
            first_pid, _ = await _ask(first, _MARK, mark)
            if first_pid == key_pid:
                return Pooling("direct", key_pid, first_pid)
            async with db.connection() as other, other.transaction():
                other_pid, _ = await _ask(other, _PID)
                if other_pid == first_pid:
                    # A's server connection now serves B: nothing more to ask
                    # (and with a pool of one, A would wait for B forever).
                    return Pooling("transaction", key_pid, first_pid, other_pid)
                second_pid, seen = await _ask(first, _CHECK)
    except TimeoutError:
        # E.g. session pooling with a server pool too small for two clients.
        return Pooling("unknown", error=f"probe unanswered after {within_s:g}s")
    except PgcrondError as exc:
        return Pooling("unknown", error=str(exc))
    moved = second_pid != first_pid or seen != mark
    return Pooling("transaction" if moved else "session", key_pid, first_pid, other_pid, second_pid)


async def _ask(
    conn: psycopg.AsyncConnection[DictRow], query: str, mark: str | None = None
) -> tuple[int, str | None]:
    cursor = await conn.execute(query, None if mark is None else {"mark": mark})
    row = await cursor.fetchone()
    if row is None:  # pragma: no cover - SELECT without FROM returns one row
        raise PgcrondError("pooling probe returned no row")
    return int(row["pid"]), row.get("mark")


async def log_pooling(db: Database) -> Pooling:
    """Probe and say so in one log line; the daemon calls this once at start."""
    found = await detect_pooling(db)
    if found.mode == "transaction":
        log.warning(
            "database_pooling",
            mode="transaction",
            detail="a pooler in transaction mode sits in front of PostgreSQL; " + DEGRADED,
        )
    elif found.mode == "unknown":
        log.warning("database_pooling", mode="unknown", error=found.error)
    else:
        log.info(
            "database_pooling",
            mode=found.mode,
            detail="no pooler" if found.mode == "direct" else "a pooler in session mode",
        )
    return found
