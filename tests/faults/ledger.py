"""The fault suite's job and the tables it observes through.

``record`` is the entrypoint of every fault-suite job: it appends 'start',
sleeps ``FAULT_SLEEP`` seconds (stopping when cancelled), fails while the
attempt is at most ``FAULT_FAIL_ATTEMPTS``, and appends 'end' (its effect), or
'cancelled' once the run is being stopped. It is a well-behaved job: it looks
at its cancellation right before its effect. Ledger writes go straight to the
server (``LEDGER_DSN``), never through the fault proxy, and are retried through
a server restart so that an outage never erases the ground truth; the row's
``at`` is the database clock when the row landed, except for 'cancelled':
when the job saw its cancellation and stopped (its write may land later).

``python -m tests.faults.ledger`` is the same job as a ``command:``: a child
process reading its run from ``PGCRON_*``, stopped by SIGTERM, whose ledger
rows carry its replica's pid (its parent) like the in-process ones.

``HISTORY_DDL`` adds a trigger that copies every version of every lease row
(as JSON, so a changed lease table still works) with the database clock: the
claim history the checker needs to tell a current owner from a fenced one.
"""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Protocol

import psycopg

from pgcrond.core.cancel import Cancellation
from pgcrond.run.context import RunContext, RunFacts

# Long enough to outlast a server restart; a write that still fails raises.
WRITE_PATIENCE_S = 30.0


class Cancelled(Protocol):
    def is_set(self) -> bool: ...

    def wait_sync(self, timeout: float | None = None) -> bool: ...


class Context(RunFacts, Protocol):
    """The part of ``pgcrond``'s RunContext this job reads: the run's facts, and these."""

    @property
    def env(self) -> Mapping[str, str]: ...
    @property
    def cancelled(self) -> Cancelled: ...


@dataclass(frozen=True)
class _Origin:
    """The 'start' row's database time, and this process's monotonic clock then."""

    at: datetime
    monotonic: float

    def now(self) -> datetime:
        """The database clock now, by the monotonic clock (no wall-clock shim moves it)."""
        return self.at + timedelta(seconds=time.monotonic() - self.monotonic)


def _append(
    ctx: Context,
    phase: str | None = None,
    *,
    effect: bool = False,
    origin: _Origin | None = None,
    pid: int | None = None,
) -> tuple[str, datetime]:
    """Insert one ledger row, retried through an outage; the phase written and its ``at``.

    For the effect ('end'), the cancellation is looked at before every try: a
    run stopped meanwhile writes 'cancelled' instead. A 'cancelled' row is
    dated when the job saw the cancellation and stopped working (from
    ``origin``), not when the row could be written: a write retried through a
    server restart is bookkeeping, not the run still going.
    """
    deadline = time.monotonic() + WRITE_PATIENCE_S
    while True:
        written = "cancelled" if effect and ctx.cancelled.is_set() else (phase or "end")
        stopped_at = origin.now() if written == "cancelled" and origin is not None else None
        try:
            with psycopg.connect(ctx.env["LEDGER_DSN"], autocommit=True, connect_timeout=3) as c:
                row = c.execute(
                    f"INSERT INTO {ctx.env['LEDGER_TABLE']} "
                    "(job, run_key, tick, idempotency_key, attempt, fencing_token, pid, "
                    "replica, phase, local_at, at) "
                    "VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s, %s, "
                    "coalesce(%s, clock_timestamp())) RETURNING at",
                    (
                        ctx.job,
                        ctx.run_key,
                        ctx.fire_time,
                        ctx.idempotency_key,
                        ctx.attempt,
                        ctx.fencing_token,
                        os.getpid() if pid is None else pid,
                        ctx.env.get("FAULT_REPLICA", ""),
                        written,
                        time.time(),
                        stopped_at,
                    ),
                ).fetchone()
            assert row is not None
            return written, row[0]
        except psycopg.OperationalError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.2)


def record(ctx: Context, *, pid: int | None = None) -> None:
    """The job; ``pid``: the replica's pid to record (default: this process's)."""
    _, started_at = _append(ctx, "start", pid=pid)
    origin = _Origin(started_at, time.monotonic())
    seconds = float(ctx.env.get("FAULT_SLEEP", "0"))
    if seconds and ctx.cancelled.wait_sync(seconds):
        _append(ctx, "cancelled", origin=origin, pid=pid)
        return
    if ctx.attempt <= int(ctx.env.get("FAULT_FAIL_ATTEMPTS", "0")):
        _append(ctx, "fail", pid=pid)
        raise RuntimeError(f"attempt {ctx.attempt} fails on purpose")
    _append(ctx, effect=True, origin=origin, pid=pid)


def main() -> None:
    """The job as a command: its run from ``PGCRON_*``, SIGTERM as its cancellation."""
    cancellation = Cancellation()
    signal.signal(signal.SIGTERM, lambda *_: cancellation.cancel("SIGTERM"))
    # The runner execs the command in place of `setpriv`: the parent is the replica.
    record(RunContext.from_environ(os.environ, cancellation), pid=os.getppid())


if __name__ == "__main__":
    main()


LEDGER_DDL = """
CREATE TABLE {schema}.ledger (
    id              bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    job             text NOT NULL,
    run_key         text NOT NULL,
    tick            timestamptz NOT NULL,
    idempotency_key text NOT NULL,
    attempt         integer NOT NULL,
    fencing_token   bigint,
    pid             integer NOT NULL,
    replica         text NOT NULL,
    phase           text NOT NULL,
    -- the job's own wall clock (shifted under the clock shim), epoch seconds
    local_at        double precision NOT NULL,
    at              timestamptz NOT NULL DEFAULT clock_timestamp()
)
"""

HISTORY_DDL = """
CREATE TABLE {schema}.lease_history (
    id      bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    op      text NOT NULL,
    at      timestamptz NOT NULL DEFAULT clock_timestamp(),
    -- when the writing statement reached the server: what it read (the
    -- job-state table of a claim) is as of then
    stmt_at timestamptz NOT NULL DEFAULT statement_timestamp(),
    row     jsonb NOT NULL
);
CREATE FUNCTION {schema}.copy_lease() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO {schema}.lease_history (op, row) VALUES (TG_OP, to_jsonb(NEW));
    RETURN NULL;
END
$$;
CREATE TRIGGER copy_lease AFTER INSERT OR UPDATE ON {schema}.{table}
    FOR EACH ROW EXECUTE FUNCTION {schema}.copy_lease();
"""
