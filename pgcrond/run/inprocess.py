"""In-process entrypoints: an async function on the daemon's loop, a sync one on a thread.

The cheapest way to run a job (no process): a coroutine function is called
in a task of its own on the loop; a plain function in a dedicated daemon
thread. Stopping asks first (the run's cancellation, which ``ctx.check()``
and ``ctx.cancelled`` show), then cancels the task; a thread cannot be
killed, and one that outlives its stop grace is abandoned (and, under
``concurrency: forbid``, its job is not claimed again here until it ends).
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import functools
import inspect
import threading
from collections.abc import Callable
from typing import Any

from structlog.typing import FilteringBoundLogger

from pgcrond.core.actions import EntrypointAction
from pgcrond.core.entrypoints import resolve
from pgcrond.run import leftovers
from pgcrond.run.attempt import Attempt, Ending, Watch, describe
from pgcrond.run.command import output_lines
from pgcrond.run.context import RunContext


async def run(action: EntrypointAction, attempt: Attempt) -> Ending:
    """The executor of ``entrypoint:`` without ``isolate: true``."""
    return await _run_entrypoint(action.target, attempt)


@functools.cache
def _resolve(target: str) -> Callable[..., Any]:
    return resolve(target)


_CallOutcome = tuple[Any, str | None]  # (return value, failure)


class _EntrypointCall:
    """One call of an entrypoint on the loop, via a thread when it is synchronous."""

    def __init__(self, function: Callable[..., Any], context: RunContext) -> None:
        self.function = function
        self.context = context
        self.thread: threading.Thread | None = None

    async def run(self) -> str | None:
        """None on success, else the job's failure as ``ExcType: message``."""
        try:
            if inspect.iscoroutinefunction(self.function):
                await self.function(self.context)
                return None
            result, error = await self._in_thread()
            if error is None and inspect.isawaitable(result):
                await result
            return error
        # SystemExit raised by a job must not end the task the asyncio way,
        # which re-raises it into the loop and takes the daemon down.
        except (Exception, SystemExit) as exc:
            return describe(exc)

    def _in_thread(self) -> asyncio.Future[_CallOutcome]:
        # A dedicated daemon thread, not asyncio.to_thread: a job that ignores
        # its cancellation is abandoned, and it must neither occupy a slot of
        # the loop's shared executor forever nor hold up interpreter exit.
        loop = asyncio.get_running_loop()
        future: asyncio.Future[_CallOutcome] = loop.create_future()
        context = contextvars.copy_context()

        def body() -> None:
            outcome: _CallOutcome
            try:
                outcome = (context.run(self.function, self.context), None)
            except BaseException as exc:
                outcome = (None, describe(exc))
            with contextlib.suppress(RuntimeError):  # loop closed: nobody waits any more
                loop.call_soon_threadsafe(_settle, future, outcome)

        self.thread = threading.Thread(target=body, name=f"pgcrond-job-{self.context.job}")
        self.thread.daemon = True
        self.thread.start()
        return future


def _settle(future: asyncio.Future[_CallOutcome], outcome: _CallOutcome) -> None:
    if not future.done():  # an abandoned call's future was cancelled with its task
        future.set_result(outcome)


async def _run_entrypoint(target: str, attempt: Attempt) -> Ending:
    try:
        function = _resolve(target)
    except Exception as exc:
        return Ending("fail", describe(exc))
    watch = attempt.watch
    lines = output_lines(attempt.log)
    context = attempt.context(
        attempt.output.writer("stdout", lines), attempt.output.writer("stderr", lines)
    )
    call = _EntrypointCall(function, context)
    task: asyncio.Future[str | None] = asyncio.ensure_future(call.run())
    attempt.started()
    try:
        stop = await watch.until_stop(task)
        if stop is not None:
            await _stop_entrypoint(task, call, watch, attempt.log, attempt.request.job)
            return stop
    finally:
        task.cancel()
    if task.cancelled():
        # The job cancelled itself (raised CancelledError); nobody stopped it.
        return Ending("fail", "CancelledError")
    if (error := task.result()) is not None:
        return Ending("fail", error)
    return Ending("success")


async def _stop_entrypoint(
    task: asyncio.Future[str | None],
    call: _EntrypointCall,
    watch: Watch,
    log: FilteringBoundLogger,
    job: str,
) -> None:
    """The cancellation is already set; the job has ``stop_grace`` in all to end.

    An async job gets half of it to notice the cancellation and half to unwind
    from CancelledError: the whole stop must fit in the grace the lease
    budgeted for it.
    """
    await asyncio.wait({task}, timeout=watch.grace / 2)
    if task.done():
        return
    if call.thread is None:
        task.cancel()  # a thread cannot be cancelled: it keeps the whole grace
    await asyncio.wait({task}, timeout=watch.grace / 2)
    if call.thread is not None and call.thread.is_alive():
        # Python cannot kill a thread; `isolate: true` is the answer for jobs
        # that must be killable.
        log.warning("entrypoint_thread_abandoned", thread=call.thread.name)
        leftovers.abandoned(job, call.thread)
    elif not task.done():
        log.warning("entrypoint_task_abandoned")
