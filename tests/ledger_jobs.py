"""Entrypoints for daemon tests: each run appends to a ledger table.

The ledger is the ground truth of what ran, where and under which key, kept
apart from the lease table the daemon itself writes.
"""

from __future__ import annotations

import os

import psycopg

from pgcrond.run.context import RunContext


def _append(ctx: RunContext, phase: str) -> None:
    with psycopg.connect(ctx.env["LEDGER_DSN"], autocommit=True) as conn:
        conn.execute(
            f"INSERT INTO {ctx.env['LEDGER_TABLE']} "
            "(job, run_key, idempotency_key, attempt, fencing_token, pid, phase) "
            "VALUES (%s, %s, %s, %s, %s, %s, %s)",
            (
                ctx.job,
                ctx.run_key,
                ctx.idempotency_key,
                ctx.attempt,
                ctx.fencing_token,
                os.getpid(),
                phase,
            ),
        )


def record(ctx: RunContext) -> None:
    """Append 'start', run for LEDGER_SLEEP seconds (stopping when cancelled), append 'end'.

    LEDGER_SLEEP_ATTEMPTS=N: only attempts up to N sleep; a later one (a
    takeover a test waits for and has nothing else to judge by) ends at once.
    """
    _append(ctx, "start")
    seconds = float(ctx.env.get("LEDGER_SLEEP", "0"))
    if ctx.attempt > int(ctx.env.get("LEDGER_SLEEP_ATTEMPTS", ctx.attempt)):
        seconds = 0
    if seconds and ctx.cancelled.wait_sync(seconds):
        _append(ctx, "cancelled")
        return
    if ctx.env.get("LEDGER_FAIL"):
        _append(ctx, "fail")
        raise RuntimeError("ledger job failed on purpose")
    _append(ctx, "end")


LEDGER_DDL = """
CREATE TABLE {table} (
    id              bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    job             text NOT NULL,
    run_key         text NOT NULL,
    idempotency_key text NOT NULL,
    attempt         integer NOT NULL,
    fencing_token   bigint,
    pid             integer NOT NULL,
    phase           text NOT NULL,
    at              timestamptz NOT NULL DEFAULT clock_timestamp()
)
"""
