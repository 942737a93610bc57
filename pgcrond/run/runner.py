"""Executing an attempt: one way of running per action, behind one contract.

The runner knows nothing of leases or SQL. It builds what every way of
running gets (:class:`~pgcrond.run.attempt.Attempt`: the run's environment,
its context, the watch over its cancellation and timeout) and hands the
action to its executor: :mod:`~pgcrond.run.command` (``command:``,
``shell:``), :mod:`~pgcrond.run.inprocess` and :mod:`~pgcrond.run.isolated`
(``entrypoint:``), :mod:`~pgcrond.run.sql_action` (``sql:``) and
:mod:`~pgcrond.run.http_action` (``http:``). A job's own failure is a
:class:`RunResult`, never an exception.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Mapping
from datetime import UTC, datetime
from typing import assert_never

import structlog
from structlog.typing import FilteringBoundLogger

from pgcrond.core.actions import CommandAction, EntrypointAction, HttpAction, ShellAction, SqlAction
from pgcrond.core.cancel import Cancellation
from pgcrond.core.outcome import RunResult
from pgcrond.core.redaction import MIN_FRAGMENT
from pgcrond.run import command, inprocess, isolated
from pgcrond.run.attempt import Attempt, Ending, RunRequest, Watch
from pgcrond.run.context import run_variables
from pgcrond.run.environment import RunEnviron, job_environ
from pgcrond.run.output import Capture

_log: FilteringBoundLogger = structlog.get_logger("pgcrond.run.runner")


def _nothing() -> None:
    """The default ``on_start``: nobody to tell."""


async def execute(
    request: RunRequest, cancellation: Cancellation, on_start: Callable[[], None] = _nothing
) -> RunResult:
    """Run ``request.action`` to its end, or until the cancellation or the timeout stops it.

    ``on_start`` is called once, when the job is under way (or, if it never
    got there, before the result is returned).
    """
    started = time.monotonic()
    told = False

    def tell() -> None:
        nonlocal told
        if not told:
            told = True
            on_start()

    output = Capture(_secret_values(request.env))
    if cancellation.is_set():
        ending = Ending("cancelled", f"cancelled: {cancellation.reason}")
    else:
        ending = await _execute(request, cancellation, started, tell, output)
    tell()
    return RunResult(
        outcome=ending.outcome,
        error=ending.error,
        exit_code=ending.exit_code,
        duration_s=time.monotonic() - started,
        retry_after=ending.retry_after,
        permanent=ending.permanent,
        output=output.tail(),
    )


def _secret_values(job_env: Mapping[str, str]) -> list[str]:
    """The job's own ``env:`` values that look secret by name: scrubbed from its output record."""
    if not job_env:
        return []
    from pgcrond.run.http_action import is_secret_header  # the one list of secret-looking names

    return [v for n, v in job_env.items() if is_secret_header(n) and len(v) >= MIN_FRAGMENT]


async def _execute(
    request: RunRequest,
    cancellation: Cancellation,
    started: float,
    tell: Callable[[], None],
    output: Capture,
) -> Ending:
    deadline = None if request.timeout is None else datetime.now(UTC) + request.timeout
    # The job's environment, made when first read (an entrypoint that never
    # reads ctx.env makes none). Its maker holds the request, not a context:
    # a maker held by the context it builds was a reference cycle per run,
    # left to the collector (stalls of 70-350 ms at 10,000 co-firing jobs).
    environ = RunEnviron(
        lambda: job_environ(
            request.env,
            run_variables(request, deadline),
            request.box.inherited(os.environ),
        )
    )
    log = _log.bind(job=request.job, run_key=request.run_key, attempt=request.attempt)
    watch = Watch(request, cancellation, started)
    attempt = Attempt(request, watch, log, environ, deadline, tell, output)
    action = request.action
    match action:
        case CommandAction() | ShellAction():
            return await command.run(action, attempt)
        case EntrypointAction(isolate=True):
            return await isolated.run(action, attempt)
        case EntrypointAction():
            return await inprocess.run(action, attempt)
        case SqlAction():
            # Imported here: the runner itself needs neither, nor does `check`.
            from pgcrond.run import sql_action

            return await sql_action.run(action, attempt)
        case HttpAction():
            from pgcrond.run import http_action

            return await http_action.run(action, attempt)
        case _:
            assert_never(action)
