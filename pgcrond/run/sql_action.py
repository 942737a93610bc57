"""Running an ``sql:`` action: nothing is spawned, the guard commits it.

The runner knows no SQL and no lease: it binds the run's values to the job's
statements (:class:`~pgcrond.core.actions.SqlWork`) and hands them to
``request.commit`` (the guard's ``commit_with``), which runs them in the same
transaction as the SUCCESS record of the run's lease row. What comes back
decides the run's outcome:

* committed: ``success`` (the guard already recorded it);
* fenced: another replica holds the tick, or the lease lapsed while the
  transaction ran (the server ends it then: a paused or cut-off owner); nothing
  committed (``cancelled``, reason ``lease_lost``, so nothing is recorded by
  this replica, which follows the tick like any other);
* a statement failed, or hit its ``statement_timeout``: ``fail`` /
  ``timeout``, everything rolled back, retried like any failure (no
  connection for ``sql:`` jobs came free within the timeout: the same);
* a statement ended the transaction itself: ``fail``, never retried (what it
  did may have committed);
* an outage: ``fail``. Whether the COMMIT landed is unknown, and recording a
  FAIL is what is safe: a SUCCESS that did land fences it.

A run stopped meanwhile (timeout, lost lease, shutdown) abandons its
transaction, which the guard cancels: the server rolls it back.
"""

from __future__ import annotations

import asyncio
import dataclasses
import time
from datetime import timedelta
from typing import Any

from pgcrond.core.actions import SqlAction, SqlWork
from pgcrond.errors import DatabaseUnavailable, PgcrondError, SqlJobFailed
from pgcrond.run.attempt import Attempt, Ending, RunRequest, Watch

QUERY_CANCELED = "57014"  # statement_timeout (or a cancel request)
# The server's own statement_timeout should end a slow statement first (a
# clean, certain rollback); the client's deadline is the backstop.
_CLIENT_MARGIN = timedelta(milliseconds=500)


def bound_parameters(request: RunRequest) -> dict[str, Any]:
    """The values of the ``:name`` placeholders (pgcrond.core.sqlscript.PARAMETERS)."""
    return {
        "idempotency_key": request.idempotency_key,
        "run_key": request.run_key,
        "fire_time": request.fire_time,
        "attempt": request.attempt,
        "fencing_token": request.fencing_token,
    }


async def run(action: SqlAction, attempt: Attempt) -> Ending:
    """The executor of ``sql:``: the script in one transaction that commits with SUCCESS."""
    request, watch, log = attempt.request, attempt.watch, attempt.log

    if request.commit is None:
        return Ending("fail", "sql: needs the lease guard to commit with", permanent=True)
    work = SqlWork(
        statements=action.script.statements,
        params=bound_parameters(request),
        statement_timeout=action.statement_timeout,
        role=action.role,
        output=attempt.output.feed,
    )
    limited = dataclasses.replace(request, timeout=action.statement_timeout + _CLIENT_MARGIN)
    started = time.monotonic()
    sql_watch = Watch(limited, watch.cancellation, started)
    task = asyncio.ensure_future(request.commit(work))
    attempt.started()
    stop = await sql_watch.until_stop(task)
    if stop is not None:
        # Abandoned, never awaited: on a cut network its clean-up takes as long
        # as the cut. Cancelling it rolls the transaction back.
        task.cancel()
        task.add_done_callback(lambda t: t.cancelled() or t.exception())
        if stop.outcome == "timeout":
            seconds = action.statement_timeout.total_seconds()
            return Ending("timeout", f"timeout after {seconds:g}s")
        return stop
    duration_ms = round((time.monotonic() - started) * 1000, 1)
    try:
        committed = task.result()
    except SqlJobFailed as exc:
        log.info("sql_rolled_back", sqlstate=exc.sqlstate, duration_ms=duration_ms)
        if exc.sqlstate == QUERY_CANCELED:
            seconds = action.statement_timeout.total_seconds()
            return Ending("timeout", f"timeout after {seconds:g}s (statement_timeout)")
        return Ending("fail", str(exc), permanent=exc.permanent)
    except DatabaseUnavailable as exc:
        return Ending("fail", f"{exc} (the transaction's outcome is unknown)")
    except PgcrondError as exc:
        return Ending("fail", str(exc))
    if committed == "fenced":
        # Another replica holds the tick now: nothing ran, nothing may be recorded.
        watch.cancellation.cancel("lease_lost")
        return Ending("cancelled", "cancelled: lease_lost")
    log.info(
        "sql_committed",
        statements=len(work.statements),
        duration_ms=duration_ms,
        role=action.role,
    )
    return Ending("success")
