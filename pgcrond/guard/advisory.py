"""Advisory mode: a PostgreSQL advisory lock held for the run, no table.

Nothing is remembered across the cluster, so retries happen here, under the
lock this replica still holds: a failure with retries left keeps the lock and
the next claim of the same identity (after the retry delay) is granted at
once, as the next attempt. The lock goes when the fire forgets the identity
(after ``min_hold``, counted from the tick, for replicas that fire late).
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import timedelta

from pgcrond.core.keys import Identity, KeyHash
from pgcrond.guard.base import (
    ClaimRequest,
    Guard,
    Held,
    Recorded,
    Refused,
    Verdict,
    held_as_is,
)
from pgcrond.storage.advisory import AdvisoryLease, advisory_lock
from pgcrond.storage.db import Database


@dataclass
class _Open:
    stack: contextlib.AsyncExitStack
    lock: AdvisoryLease
    attempt: int = 1
    retry_at: float | None = None
    finished: bool = False
    current: Held | None = field(default=None)


class AdvisoryGuard(Guard):
    """One job's advisory lock as a :class:`~pgcrond.guard.base.Guard`."""

    remembers = False

    def __init__(
        self,
        db: Database,
        key: str | int,
        *,
        key_hash: KeyHash = "pgcrond",
        min_hold: timedelta = timedelta(seconds=5),
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.db = db
        self.key = key
        self.key_hash = key_hash
        self.min_hold = min_hold
        self._clock = clock
        self._open: dict[Identity, _Open] = {}

    async def claim(self, request: ClaimRequest) -> Held | Refused:
        identity = request.identity
        if request.skip_reason is not None:
            # No table to record it in: each replica refuses it alike, and
            # says so in its log and metrics. No lock is taken.
            return Refused(identity, "skipped", cause=request.skip_reason)
        if request.suspended is not None and identity.pausable:
            # No table to record the skip in; `pgcrond pause` needs guard: lease.
            return Refused(identity, "paused", detail=request.suspended)
        state = self._open.get(identity)
        if state is None:
            stack = contextlib.AsyncExitStack()
            lock = await stack.enter_async_context(
                advisory_lock(
                    self.db,
                    self.key,
                    key_hash=self.key_hash,
                    min_hold=self.min_hold,
                    tick=request.tick,
                )
            )
            if not lock.acquired:
                await stack.aclose()
                return Refused(identity, "held", owner=None)
            state = self._open[identity] = _Open(stack, lock)
        elif state.finished or state.lock.lost:
            return Refused(identity, "done")
        elif state.retry_at is not None:
            wait = state.retry_at - self._clock()
            if wait > 0:
                return Refused(
                    identity, "retry_pending", wait=timedelta(seconds=wait), attempt=state.attempt
                )
            state.attempt += 1
            state.retry_at = None
        held = Held(
            identity=identity,
            attempt=state.attempt,
            fencing_token=None,
            claimed_from="retry" if state.attempt > 1 else None,
            # Each attempt has its own signal (a timeout ends only that
            # attempt), which the lock's loss or shutdown also sets.
            cancellation=state.lock.cancellation.child(),
        )
        state.current = held
        return held

    def hold(self, held: Held) -> contextlib.AbstractAsyncContextManager[Held]:
        # The lock's own probe watches it for the whole fire, not per attempt.
        return held_as_is(held)

    async def record(self, held: Held, verdict: Verdict) -> Recorded:
        state = self._open[held.identity]
        if state.lock.lost:
            return "fenced"
        if verdict.retries and verdict.retry_after is not None:
            state.retry_at = self._clock() + verdict.retry_after.total_seconds()
            return "retry"
        state.finished = True
        return "done"

    async def forget(self, identity: Identity) -> None:
        state = self._open.pop(identity, None)
        if state is not None:
            await state.stack.aclose()
