"""One attempt of a job, as every way of running sees it: what to run, how it ended.

:class:`RunRequest` is what the fire hands the runner; :class:`Ending` is how
a way of running (a command, an entrypoint, an ``sql:`` or ``http:`` action)
says its attempt ended; :class:`Watch` waits for the attempt, its
cancellation or its timeout; :class:`RunResult` is what the fire records.
Its own module so that each way of running imports it, and the runner that
dispatches to them imports them, never the other way round.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any, Literal

from pgcrond.core.actions import Action, Committed, SqlWork
from pgcrond.core.cancel import Cancellation
from pgcrond.run.output import Capture, OutputTail

Outcome = Literal["success", "fail", "timeout", "cancelled"]


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
    env: Mapping[str, str] = field(default_factory=dict)
    cwd: Path | None = None
    timeout: timedelta | None = None
    stop_grace: timedelta = timedelta(seconds=10)
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
class RunResult:
    outcome: Outcome
    error: str | None
    exit_code: int | None
    duration_s: float
    # A failure's hints for its retry: not before this long (an HTTP
    # Retry-After), or never (a failure no retry can fix).
    retry_after: timedelta | None = None
    permanent: bool = False
    # The attempt's output as its record keeps it (pgcrond.run.output).
    output: OutputTail = field(default_factory=OutputTail, compare=False, repr=False)


@dataclass(frozen=True)
class Ending:
    outcome: Outcome
    error: str | None = None
    exit_code: int | None = None
    retry_after: timedelta | None = None
    permanent: bool = False


class Watch:
    """Waits for the work, the cancellation or the timeout, whichever comes first."""

    def __init__(
        self,
        request: RunRequest,
        cancellation: Cancellation,
        started: float,
        output: Capture | None = None,
    ) -> None:
        self.cancellation = cancellation
        # Where every way of running puts what the attempt record keeps.
        self.output = Capture() if output is None else output
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
        waiter = asyncio.ensure_future(self.cancellation.wait())
        try:
            remaining = None if self._deadline is None else self._deadline - time.monotonic()
            await asyncio.wait(
                {work, waiter},
                timeout=None if remaining is None else max(remaining, 0.0),
                return_when=asyncio.FIRST_COMPLETED,
            )
        finally:
            waiter.cancel()
        if self.cancellation.is_set():
            return self._cancelled_ending()
        if work.done():
            return None
        # Set the shared signal so cooperative jobs see the timeout too; if the
        # daemon set it in the meantime, its reason wins.
        self.cancellation.cancel("timeout")
        return self._cancelled_ending()

    def _cancelled_ending(self) -> Ending:
        reason = self.cancellation.reason
        if reason == "timeout" and self._timeout is not None:
            return Ending("timeout", f"timeout after {self._timeout.total_seconds():g}s")
        return Ending("cancelled", f"cancelled: {reason}")
