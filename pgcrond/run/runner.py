"""Executing a run: command, shell script or Python entrypoint.

The runner knows nothing of leases or SQL. It starts the action with the run's
environment, streams its output into the log, and stops it when the run's
:class:`~pgcrond.core.cancel.Cancellation` is set (lease lost, shutdown) or its
timeout hits. A job's own failure is a :class:`RunResult`, never an exception.

Stop sequence for a child process: SIGTERM to its process group, SIGKILL to the
group after ``stop_grace``, and once the leader has exited a final SIGKILL to
the group so that background grandchildren never outlive the run.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import dataclasses
import errno
import functools
import inspect
import json
import os
import shutil
import signal
import sys
import threading
import time
from collections.abc import Callable, Mapping
from datetime import UTC, datetime
from types import MappingProxyType
from typing import Any, assert_never

import structlog
from structlog.typing import FilteringBoundLogger

from pgcrond.core.actions import (
    CommandAction,
    EntrypointAction,
    HttpAction,
    ShellAction,
    SqlAction,
)
from pgcrond.core.cancel import Cancellation
from pgcrond.core.redaction import MIN_FRAGMENT, holds_connection_secret
from pgcrond.run import leftovers
from pgcrond.run.attempt import Ending, RunRequest, RunResult, Watch
from pgcrond.run.context import ENV_PREFIX, RunContext
from pgcrond.run.entrypoints import resolve
from pgcrond.run.isolated import describe
from pgcrond.run.output import Capture, Stream

# Never handed to a job unless its own `env` sets them: pgcrond's settings
# (PGCROND_*), the libpq secrets the daemon itself connects with, and any
# variable holding the database's URL or password (holds_connection_secret).
SECRET_PREFIX = "PGCROND_"  # noqa: S105 - a name prefix, not a password
SECRET_NAMES = frozenset({"PGPASSWORD", "PGPASSFILE", "DATABASE_URL"})

# Output caps keep one chatty job from flooding the log pipeline; the pipes are
# drained past them regardless, so the child never blocks on a full pipe.
OUTPUT_LINE_CAP = 4096
OUTPUT_RUN_CAP = 1024 * 1024
_READ_CHUNK = 64 * 1024
# After the group was killed the pipes close at once, unless a process that
# left the group (setsid) still holds them; do not wait for that one forever.
_DRAIN_TIMEOUT = 5.0

_log: FilteringBoundLogger = structlog.get_logger("pgcrond.run.runner")


def job_environ(
    job_env: Mapping[str, str], run_env: Mapping[str, str], base: Mapping[str, str]
) -> dict[str, str]:
    """The child environment: ``base`` minus secrets, then the job env, then ``PGCRON_*``.

    Every inherited or configured ``PGCRON_*`` is dropped first: an optional one
    (fencing token, deadline) left over from elsewhere would describe another run.
    """
    environ = {
        name: value
        for name, value in base.items()
        if not name.startswith(SECRET_PREFIX)
        and name not in SECRET_NAMES
        and not holds_connection_secret(name, value)
    }
    environ.update(job_env)
    environ = {name: value for name, value in environ.items() if not name.startswith(ENV_PREFIX)}
    environ.update(run_env)
    return environ


async def execute(request: RunRequest, cancellation: Cancellation) -> RunResult:
    """Run ``request.action`` to its end, or until the cancellation or the timeout stops it."""
    started = time.monotonic()
    log = _log.bind(job=request.job, run_key=request.run_key, attempt=request.attempt)
    output = Capture(_secret_values(request.env))
    if cancellation.is_set():
        ending = Ending("cancelled", f"cancelled: {cancellation.reason}")
    else:
        ending = await _execute(request, cancellation, log, started, output)
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
    from pgcrond.run.http_action import is_secret_header  # the one list of secret-looking names

    return [v for n, v in job_env.items() if is_secret_header(n) and len(v) >= MIN_FRAGMENT]


async def _execute(
    request: RunRequest,
    cancellation: Cancellation,
    log: FilteringBoundLogger,
    started: float,
    output: Capture,
) -> Ending:
    deadline = None if request.timeout is None else datetime.now(UTC) + request.timeout
    context = RunContext(
        job=request.job,
        run_key=request.run_key,
        fire_time=request.fire_time,
        attempt=request.attempt,
        idempotency_key=request.idempotency_key,
        idempotency_key_hex=request.idempotency_key_hex,
        fencing_token=request.fencing_token,
        deadline=deadline,
        env={},
        cwd=request.cwd,
        cancelled=cancellation,
    )
    environ = job_environ(request.env, context.environ(), os.environ)
    watch = Watch(request, cancellation, started, output)
    action = request.action
    match action:
        case CommandAction(argv=argv):
            return await _run_process(list(argv), environ, request, watch, log)
        case ShellAction(script=script):
            return await _run_process(["/bin/sh", "-c", script], environ, request, watch, log)
        case EntrypointAction(target=target, isolate=True):
            return await _run_isolated(target, environ, request, watch, log)
        case EntrypointAction(target=target):
            lines = _OutputBudget(log).emit
            context = dataclasses.replace(
                context,
                env=MappingProxyType(environ),
                stdout=output.writer("stdout", lines),
                stderr=output.writer("stderr", lines),
            )
            return await _run_entrypoint(target, context, request, watch, log)
        case SqlAction():
            # Imported here: the runner itself needs neither, nor does `check`.
            from pgcrond.run.sql_action import run_sql

            return await run_sql(action, request, watch, log)
        case HttpAction():
            from pgcrond.run.http_action import run_http

            return await run_http(action, request, environ, watch, log)
        case _:
            assert_never(action)


# -- child processes ----------------------------------------------------------


async def _run_isolated(
    target: str,
    environ: dict[str, str],
    request: RunRequest,
    watch: Watch,
    log: FilteringBoundLogger,
) -> Ending:
    read_end, write_end = os.pipe()
    argv = [
        sys.executable,
        "-m",
        "pgcrond.run.isolated",
        "--result-fd",
        str(write_end),
        "--sys-path",
        json.dumps(sys.path),
        target,
    ]
    try:
        ending = await _run_process(argv, environ, request, watch, log, hand_over=write_end)
        error = _read_available(read_end)
    finally:
        os.close(read_end)
    if ending.outcome == "fail" and error:
        return Ending("fail", error, ending.exit_code)
    return ending


def _read_available(fd: int) -> str:
    # Non-blocking: a grandchild that inherited the write end must not stall us.
    os.set_blocking(fd, False)
    chunks = []
    while True:
        try:
            chunk = os.read(fd, _READ_CHUNK)
        except BlockingIOError:
            break
        if not chunk:
            break
        chunks.append(chunk)
    return b"".join(chunks).decode("utf-8", "replace")


async def _run_process(
    argv: list[str],
    environ: dict[str, str],
    request: RunRequest,
    watch: Watch,
    log: FilteringBoundLogger,
    *,
    hand_over: int | None = None,
) -> Ending:
    """``hand_over``: an fd passed to the child, closed here once the child has its copy."""
    # Our own pipes rather than asyncio's PIPE: Process.wait() also waits for
    # the pipes it manages to close, so a background grandchild holding stdout
    # would hide the leader's exit until the grandchild ended.
    out_read, out_write = os.pipe()
    err_read, err_write = os.pipe()
    to_close = [out_write, err_write] if hand_over is None else [out_write, err_write, hand_over]
    stdout, stdout_transport = await _pipe_reader(out_read)
    stderr, stderr_transport = await _pipe_reader(err_read)
    budget = _OutputBudget(log, watch.output)
    pumps = asyncio.gather(_pump(stdout, "stdout", budget), _pump(stderr, "stderr", budget))
    try:
        try:
            process = await asyncio.create_subprocess_exec(
                *_dying_with_daemon(argv, environ),
                stdin=asyncio.subprocess.DEVNULL,
                stdout=out_write,
                stderr=err_write,
                env=environ,
                cwd=request.cwd,
                start_new_session=True,
                pass_fds=() if hand_over is None else (hand_over,),
            )
        except OSError as exc:
            return Ending("fail", f"cannot start: {describe(exc)}")
        finally:
            for fd in to_close:
                os.close(fd)
        # start_new_session makes the child the leader of a new session and group.
        group = process.pid
        exited = asyncio.ensure_future(process.wait())
        try:
            stop = await watch.until_stop(exited)
            if stop is not None and not exited.done():
                await _stop_group(group, exited, watch, log)
            returncode = await exited
        finally:
            # Normal end, stop, or the runner itself being cancelled: nothing
            # of the group may outlive the run.
            _signal_group(group, signal.SIGKILL)
        try:
            await asyncio.wait_for(pumps, _DRAIN_TIMEOUT)
        except TimeoutError:
            log.warning("job_output_abandoned", reason="pipe held open outside the process group")
    finally:
        stdout_transport.close()
        stderr_transport.close()
        pumps.cancel()
    if stop is not None:
        return Ending(stop.outcome, stop.error, _exit_status(returncode))
    if returncode == 0:
        return Ending("success", None, 0)
    if returncode < 0:
        return Ending("fail", f"killed by signal {_signal_name(-returncode)}", None)
    return Ending("fail", f"exit status {returncode}", returncode)


# Children are started through util-linux's setpriv, which sets the death
# signal and then execs the job: setting it ourselves would need preexec_fn,
# which Python documents as unsafe in a threaded process (a lock held by
# another thread at fork time deadlocks the child).
_SETPRIV = shutil.which("setpriv") if sys.platform == "linux" else None


def _dying_with_daemon(argv: list[str], environ: dict[str, str]) -> list[str]:
    """``argv`` wrapped so that the child is SIGKILLed if the daemon dies (kill -9, OOM).

    The dead replica's lease then expires and a survivor takes the tick over;
    an orphaned job left running beside the takeover would be a duplicate run.
    The program is resolved here, so a missing one is still "cannot start".
    """
    program = argv[0]
    found = program if "/" in program else shutil.which(program, path=environ.get("PATH"))
    if found is None or not os.access(found, os.X_OK):
        raise FileNotFoundError(errno.ENOENT, os.strerror(errno.ENOENT), program)
    if _SETPRIV is None:
        return argv
    return [_SETPRIV, "--pdeathsig", "KILL", "--", found, *argv[1:]]


async def _pipe_reader(fd: int) -> tuple[asyncio.StreamReader, asyncio.BaseTransport]:
    loop = asyncio.get_running_loop()
    reader = asyncio.StreamReader()
    transport, _ = await loop.connect_read_pipe(
        lambda: asyncio.StreamReaderProtocol(reader), os.fdopen(fd, "rb", buffering=0)
    )
    return reader, transport


async def _stop_group(
    group: int, exited: asyncio.Future[int], watch: Watch, log: FilteringBoundLogger
) -> None:
    log.info("job_stopping", signal="SIGTERM", reason=watch.cancellation.reason)
    _signal_group(group, signal.SIGTERM)
    await asyncio.wait({exited}, timeout=watch.grace)
    if not exited.done():
        log.warning("job_killed", signal="SIGKILL", grace_s=watch.grace)
        _signal_group(group, signal.SIGKILL)


def _signal_group(group: int, signum: signal.Signals) -> None:
    with contextlib.suppress(ProcessLookupError):  # the group is already empty
        os.killpg(group, signum)


def _exit_status(returncode: int) -> int | None:
    return returncode if returncode >= 0 else None


def _signal_name(signum: int) -> str:
    try:
        return signal.Signals(signum).name
    except ValueError:
        return str(signum)


class _OutputBudget:
    """Bytes of output one run may still log, shared by stdout and stderr."""

    def __init__(self, log: FilteringBoundLogger, output: Capture | None = None) -> None:
        self.log = log
        # The attempt record's copy, which sees every byte, past the log's caps too.
        self.output = output
        self.remaining = OUTPUT_RUN_CAP
        self.exhausted = False

    def emit(self, stream: Stream, line: bytes) -> None:
        if self.exhausted:
            return
        truncated = len(line) > OUTPUT_LINE_CAP
        line = line[:OUTPUT_LINE_CAP]
        if len(line) > self.remaining:
            self.exhausted = True
            self.log.warning(
                "job_output_truncated", stream=stream, logged_bytes=OUTPUT_RUN_CAP - self.remaining
            )
            return
        self.remaining -= len(line)
        text = line.decode("utf-8", "replace")
        if truncated:
            self.log.info("job_output", stream=stream, line=text, truncated=True)
        else:
            self.log.info("job_output", stream=stream, line=text)


async def _pump(reader: asyncio.StreamReader, stream: Stream, budget: _OutputBudget) -> None:
    # Hand-rolled line splitting: StreamReader.readline() raises on lines
    # longer than its limit, and buffering a whole long line would let a
    # single line of gigabytes live in memory.
    pending = b""
    skipping = False  # inside a long line whose head was already logged
    while chunk := await reader.read(_READ_CHUNK):
        if budget.output is not None:
            budget.output.feed(stream, chunk)
        if budget.exhausted:
            continue
        *lines, pending = (pending + chunk).split(b"\n")
        for line in lines:
            if skipping:
                skipping = False
            else:
                budget.emit(stream, line.removesuffix(b"\r"))
        if len(pending) > OUTPUT_LINE_CAP:
            if not skipping:
                budget.emit(stream, pending)
                skipping = True
            pending = b""
    if pending and not skipping:
        budget.emit(stream, pending)


# -- in-process entrypoints ---------------------------------------------------


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


async def _run_entrypoint(
    target: str,
    context: RunContext,
    request: RunRequest,
    watch: Watch,
    log: FilteringBoundLogger,
) -> Ending:
    try:
        function = _resolve(target)
    except Exception as exc:
        return Ending("fail", describe(exc))
    call = _EntrypointCall(function, context)
    task: asyncio.Future[str | None] = asyncio.ensure_future(call.run())
    try:
        stop = await watch.until_stop(task)
        if stop is not None:
            await _stop_entrypoint(task, call, watch, log, request.job)
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
