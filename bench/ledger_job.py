"""The job body of bench/side_by_side.py: one ledger row per run, for any scheduler.

Both schedulers run the same coroutine, :func:`insert`, on their own event
loop: one ``INSERT`` (one autocommit transaction) through a small pool that
belongs to the job, not to the scheduler, so the scheduler's own connections
and statements are untouched by the job. The row records the job, the tick it
was meant for, the process that ran it and the server's clock at the insert
(``clock_timestamp()``, not ``now()``: the time of the insert itself), so
duplicates, misses, lateness and the spread across replicas all come from one
table that neither scheduler knows about.

The ledger lives in a database of its own (``BENCH_LEDGER_DSN``), so the
scheduler's database counts only the scheduler's transactions.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Mapping
from datetime import datetime

from psycopg_pool import AsyncConnectionPool

from pgcrond.run.context import RunContext

DSN_VARIABLE = "BENCH_LEDGER_DSN"
POOL_SIZE = 4

SCHEMA = """
CREATE TABLE IF NOT EXISTS bench_ledger (
    job text NOT NULL,
    tick timestamptz NOT NULL,
    pid integer NOT NULL,
    inserted_at timestamptz NOT NULL
)
"""

_INSERT = (
    "INSERT INTO bench_ledger (job, tick, pid, inserted_at) VALUES (%s, %s, %s, clock_timestamp())"
)


class _JobPool:
    """The process's job pool, opened on first use on the running loop."""

    def __init__(self) -> None:
        self.pool: AsyncConnectionPool | None = None
        self.opening: asyncio.Lock | None = None

    async def get(self, env: Mapping[str, str]) -> AsyncConnectionPool:
        if self.pool is not None:
            return self.pool
        if self.opening is None:
            self.opening = asyncio.Lock()
        async with self.opening:
            if self.pool is None:
                pool = AsyncConnectionPool(
                    env[DSN_VARIABLE],
                    min_size=1,
                    max_size=POOL_SIZE,
                    kwargs={"autocommit": True},
                    open=False,
                )
                await pool.open(wait=True)
                self.pool = pool
        return self.pool


_job_pool = _JobPool()


async def insert(job: str, tick: datetime, env: Mapping[str, str] | None = None) -> None:
    """Record one run of ``job`` for ``tick``: one statement, one transaction."""
    pool = await _job_pool.get(os.environ if env is None else env)
    async with pool.connection() as conn:
        await conn.execute(_INSERT, (job, tick, os.getpid()))


async def record(ctx: RunContext) -> None:
    """pgcrond's ``entrypoint:`` (in-process, async): the run's job and intended fire time."""
    await insert(ctx.job, ctx.fire_time, ctx.env)
