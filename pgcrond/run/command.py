"""Commands and shell scripts: a child process in a process group of its own.

The job's output is streamed into the log line by line (capped per line and
per run; the pipes are drained past the caps, so the child never blocks on a
full pipe). Stop sequence: SIGTERM to its process group, SIGKILL to the group
after ``stop_grace``, and once the leader has exited a final SIGKILL to the
group so that background grandchildren never outlive the run.
:func:`run_process` is also how an isolated entrypoint's host is run.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import os
import shutil
import signal
import sys
from asyncio.subprocess import Process
from collections.abc import Awaitable, Callable

from structlog.typing import FilteringBoundLogger

from pgcrond.core.actions import CommandAction, ShellAction
from pgcrond.core.cancel import abandon
from pgcrond.core.redaction import cut, redact
from pgcrond.run.attempt import Attempt, Ending, Watch, describe
from pgcrond.run.box import Cell
from pgcrond.run.output import Capture, Stream

# Output caps keep one chatty job from flooding the log pipeline; the pipes are
# drained past them regardless, so the child never blocks on a full pipe.
OUTPUT_LINE_CAP = 4096
OUTPUT_RUN_CAP = 1024 * 1024
_READ_CHUNK = 64 * 1024
# After the group was killed the pipes close at once, unless a process that
# left the group (setsid) still holds them; do not wait for that one forever.
_DRAIN_TIMEOUT = 5.0


async def run(action: CommandAction | ShellAction, attempt: Attempt) -> Ending:
    """The executor of ``command:`` (an argv) and ``shell:`` (``/bin/sh -c``)."""
    argv = (
        list(action.argv) if isinstance(action, CommandAction) else ["/bin/sh", "-c", action.script]
    )
    return await run_process(argv, attempt)


async def run_process(argv: list[str], attempt: Attempt, *, hand_over: int | None = None) -> Ending:
    """``argv`` as the attempt's child, to its end or its stop.

    ``hand_over``: an fd passed to the child, closed here once the child has its copy.
    """
    watch, log, environ = attempt.watch, attempt.log, dict(attempt.environ)
    # Our own pipes rather than asyncio's PIPE: Process.wait() also waits for
    # the pipes it manages to close, so a background grandchild holding stdout
    # would hide the leader's exit until the grandchild ended.
    out_read, out_write = os.pipe()
    err_read, err_write = os.pipe()
    to_close = [out_write, err_write] if hand_over is None else [out_write, err_write, hand_over]
    cell = Cell(attempt.request.job, attempt.request.box)
    # Cancelled while a reader is made (a stop at that instant), the fds it
    # does not own yet are closed here; asyncio closes the one it was given.
    try:
        stdout, stdout_transport = await _pipe_reader(out_read)
    except BaseException:
        _close_all([err_read, *to_close])
        raise
    try:
        stderr, stderr_transport = await _pipe_reader(err_read)
    except BaseException:
        stdout_transport.close()
        _close_all(to_close)
        raise
    budget = _OutputBudget(log, attempt.output)
    pumps = asyncio.gather(_pump(stdout, "stdout", budget), _pump(stderr, "stderr", budget))
    try:
        try:
            process = await _started(
                lambda: asyncio.create_subprocess_exec(
                    *cell.enter(_dying_with_daemon(argv, environ)),
                    stdin=asyncio.subprocess.DEVNULL,
                    stdout=out_write,
                    stderr=err_write,
                    env=environ,
                    cwd=attempt.request.cwd,
                    start_new_session=True,
                    pass_fds=() if hand_over is None else (hand_over,),
                )
            )
        except OSError as exc:
            return Ending("fail", f"cannot start: {describe(exc)}")
        finally:
            _close_all(to_close)
        # start_new_session makes the child the leader of a new session and group.
        group = process.pid
        attempt.started()
        exited = asyncio.ensure_future(process.wait())
        try:
            stop = await watch.until_stop(exited)
            if stop is not None and not exited.done():
                await _stop_group(group, exited, watch, log)
            returncode = await exited
        finally:
            # Normal end, stop, or the runner itself being cancelled: nothing
            # of the group may outlive the run, nor of the cgroup (setsid).
            _signal_group(group, signal.SIGKILL)
            await cell.kill()
        try:
            await asyncio.wait_for(pumps, _DRAIN_TIMEOUT)
        except TimeoutError:
            log.warning("job_output_abandoned", reason="pipe held open outside the process group")
    finally:
        stdout_transport.close()
        stderr_transport.close()
        abandon(pumps)
        await cell.close()
    return cell.judged(_process_ending(stop, returncode))


async def _started(spawn: Callable[[], Awaitable[Process]]) -> Process:
    """The child ``spawn()`` starts; a cancellation meanwhile is raised once it is safe.

    asyncio forks the child in the first step of ``spawn()`` and then waits
    for it; cancelled in that wait, its clean-up reaps the child beside the
    child watcher, which then logs "exit status already read" at WARNING. So
    the start runs as a task of its own (which runs, and forks, before a
    cancellation of this one is seen) and is let finish, a few ms; then its
    child's group is killed (the run's clean-up kills what is left of its
    cgroup) and the cancellation raised.
    """
    task = asyncio.ensure_future(spawn())
    try:
        return await asyncio.shield(task)
    except asyncio.CancelledError:
        while not task.done():
            with contextlib.suppress(asyncio.CancelledError):
                await asyncio.shield(task)
        if not task.cancelled() and task.exception() is None:
            _signal_group(task.result().pid, signal.SIGKILL)
        raise


def _process_ending(stop: Ending | None, returncode: int) -> Ending:
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
# Run by the child once its death signal is armed, before the job: a replica
# that died between the fork and the arming left an orphan whose death signal
# was armed against its new parent (init, a subreaper) and never fires, so the
# child checks that its parent is still the replica that forked it ($0), and
# starts nothing otherwise. Past the check, the replica's death kills it.
_ORPHAN_CHECK = '[ "$PPID" = "$0" ] || exit 125; exec "$@"'


def _dying_with_daemon(argv: list[str], environ: dict[str, str]) -> list[str]:
    """``argv`` wrapped so that the child is SIGKILLed if the daemon dies (kill -9, OOM).

    The dead replica's lease then expires and a survivor takes the tick over;
    an orphaned job left running beside the takeover would be a duplicate run,
    and so would one that a dead replica's child started after its death.
    The program is resolved here, so a missing one is still "cannot start".
    """
    program = argv[0]
    found = program if "/" in program else shutil.which(program, path=environ.get("PATH"))
    if found is None or not os.access(found, os.X_OK):
        raise FileNotFoundError(errno.ENOENT, os.strerror(errno.ENOENT), program)
    if _SETPRIV is None:
        return argv
    # os.getpid(): the process that forks the child is this one.
    return [
        _SETPRIV, "--pdeathsig", "KILL", "--",
        "/bin/sh", "-c", _ORPHAN_CHECK, str(os.getpid()), found, *argv[1:],
    ]  # fmt: skip


def _close_all(fds: list[int]) -> None:
    for fd in fds:
        os.close(fd)


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


def output_lines(log: FilteringBoundLogger) -> Callable[[Stream, bytes], None]:
    """Logs a job's lines as ``job_output``, under the same caps as a command's output."""
    return _OutputBudget(log).emit


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
        if truncated:
            # Redacted before the cut: a secret the cut splits is seen whole
            # here (and what the cut leaves of one is masked).
            text = redact(line.decode("utf-8", "surrogateescape"))
            line = cut(text.encode("utf-8", "surrogateescape"), OUTPUT_LINE_CAP)
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
