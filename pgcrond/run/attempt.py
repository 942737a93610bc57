"""One attempt of a job, as every way of running sees it: the executor contract.

:class:`RunRequest` is what the fire hands the runner; :class:`Attempt` is what
the runner hands the way of running its action (a command or shell script, an
in-process or isolated entrypoint, an ``sql:`` or ``http:`` action: one module
each in this package); :class:`Ending` is how that way says its attempt ended;
:class:`Watch` waits for the attempt, its cancellation or its timeout; the
runner turns the ending into the :class:`~pgcrond.core.outcome.RunResult` the
fire records.

An executor is ``async def run(action, attempt: Attempt) -> Ending``. Its
contract: a job's own failure is an :class:`Ending`, never an exception; it
calls ``attempt.started()`` once the job is under way (spawned, called, sent),
the moment ``run_started`` is logged; it waits with ``attempt.watch`` and,
when the watch says stop, stops its work within ``attempt.watch.grace``.
This module is imported by every executor and by the runner that dispatches
to them, never the other way round.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

from structlog.typing import FilteringBoundLogger

from pgcrond.core.actions import Action, Committed, SqlWork
from pgcrond.core.box import Box
from pgcrond.core.cancel import Cancellation
from pgcrond.core.outcome import Outcome
from pgcrond.core.trigger import TriggerKind
from pgcrond.run.context import RunContext, Writer
from pgcrond.run.output import Capture

# A failure's text is capped so one huge message cannot flood the record.
ERROR_CAP = 2000
# A timeout's timer that fires this much late found a loop that stood still (a
# SIGSTOP, a stall of the host): the work may have ended meanwhile, unseen (an
# sql: job's transaction committed or was ended by the server), so it is given
# STALL_LOOK to be seen before the timeout is called. A busy loop is late by
# milliseconds.
STALLED_S = 0.5
STALL_LOOK_S = 0.5


def describe(exc: BaseException) -> str:
    """``ExcType: message``, capped: how a job's exception reads in its record."""
    message = str(exc)
    text = f"{type(exc).__name__}: {message}" if message else type(exc).__name__
    return text[:ERROR_CAP]


@dataclass(frozen=True)
class RunRequest:
    job: str
    action: Action
    run_key: str
    fire_time: datetime
    attempt: int
    idempotency_key: str
    idempotency_key_hex: str
    fencing_token: int | None
    # Why this attempt runs (PGCRON_TRIGGER).
    trigger: TriggerKind = "schedule"
    env: Mapping[str, str] = field(default_factory=dict)
    cwd: Path | None = None
    timeout: timedelta | None = None
    stop_grace: timedelta = timedelta(seconds=10)
    # Whom a child process runs as, its limits, what it inherits (run/box.py).
    box: Box = field(default_factory=Box)
    # How an sql: action's statements are committed together with SUCCESS
    # (the guard's commit_with, bound to the held claim); None: not possible.
    commit: Callable[[SqlWork], Awaitable[Committed]] | None = field(
        default=None, compare=False, repr=False
    )

    def __post_init__(self) -> None:
        # A naive time would silently be read as the host's local time.
        if self.fire_time.utcoffset() is None:
            raise ValueError("fire_time must be timezone-aware")


@dataclass(frozen=True)
class Ending:
    outcome: Outcome
    error: str | None = None
    exit_code: int | None = None
    retry_after: timedelta | None = None
    permanent: bool = False


@dataclass(frozen=True, slots=True)
class Attempt:
    """What a way of running gets beside its action, made once per attempt by the runner.

    ``environ`` is the job's environment as a child process gets it (the
    daemon's secrets stripped, the job's ``env``, then ``PGCRON_*``);
    ``deadline`` when its timeout ends; ``output`` what the attempt record
    keeps of what it prints (every executor feeds it).
    """

    request: RunRequest
    watch: Watch
    log: FilteringBoundLogger
    environ: Mapping[str, str]
    deadline: datetime | None
    started: Callable[[], None]
    # Where the executor puts what the attempt record keeps of its output.
    output: Capture = field(default_factory=Capture)

    def context(self, stdout: Writer, stderr: Writer) -> RunContext:
        """The run as an entrypoint sees it, writing to ``stdout`` and ``stderr``.

        Made by the executor that calls one, once: no other way of running needs it.
        """
        request = self.request
        return RunContext(
            job=request.job,
            run_key=request.run_key,
            fire_time=request.fire_time,
            attempt=request.attempt,
            idempotency_key=request.idempotency_key,
            idempotency_key_hex=request.idempotency_key_hex,
            fencing_token=request.fencing_token,
            trigger=request.trigger,
            deadline=self.deadline,
            env=self.environ,
            cwd=request.cwd,
            cancelled=self.watch.cancellation,
            stdout=stdout,
            stderr=stderr,
        )


class Watch:
    """Waits for the work, the cancellation or the timeout, whichever comes first."""

    def __init__(self, request: RunRequest, cancellation: Cancellation, started: float) -> None:
        self.cancellation = cancellation
        self.grace = request.stop_grace.total_seconds()
        self._timeout = request.timeout
        self._deadline = (
            None if request.timeout is None else started + request.timeout.total_seconds()
        )

    async def until_stop(self, work: asyncio.Future[Any]) -> Ending | None:
        """None when ``work`` ended on its own; else how the run ends (timeout / cancelled).

        A run whose cancellation is set before its end was observed is never a
        success, even if the job returned normally: whoever cancelled it (a lost
        lease) no longer trusts its result.
        """
        # Callbacks, not tasks: one attempt of 10,000 co-firing ones costs a
        # future and a timer here, no task of its own.
        loop = asyncio.get_running_loop()
        woken = loop.create_future()

        def wake(_: object = None) -> None:
            if not woken.done():
                woken.set_result(None)

        cancelled = self.cancellation.future()
        cancelled.add_done_callback(wake)
        work.add_done_callback(wake)
        timer = None
        if self._deadline is not None:
            timer = loop.call_later(max(self._deadline - time.monotonic(), 0.0), wake)
        try:
            await woken
            if self._stood_still() and not (work.done() or self.cancellation.is_set()):
                woken = loop.create_future()
                timer = loop.call_later(STALL_LOOK_S, wake)
                await woken
        finally:
            if timer is not None:
                timer.cancel()
            work.remove_done_callback(wake)
            cancelled.cancel()
        if self.cancellation.is_set():
            return self._cancelled_ending()
        if work.done():
            return None
        # Set the shared signal so cooperative jobs see the timeout too; if the
        # daemon set it in the meantime, its reason wins.
        self.cancellation.cancel("timeout")
        return self._cancelled_ending()

    def _stood_still(self) -> bool:
        """Whether the deadline passed long before this wake: the loop stood still."""
        deadline = self._deadline
        return deadline is not None and time.monotonic() - deadline > STALLED_S

    def _cancelled_ending(self) -> Ending:
        reason = self.cancellation.reason
        if reason == "timeout" and self._timeout is not None:
            return Ending("timeout", f"timeout after {self._timeout.total_seconds():g}s")
        return Ending("cancelled", f"cancelled: {reason}")
