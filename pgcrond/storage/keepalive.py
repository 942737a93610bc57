"""Keeping a lease alive while its run goes on: heartbeats, and the stop deadline.

A lease is renewed on a grid of the loop's clock (co-running leases beat in one
statement, :class:`pgcrond.storage.batch.TurnBatch`) and its run is told to stop
while the lease surely holds. The heartbeat itself is the lease store's
(:meth:`pgcrond.storage.leases.LeaseStore.heartbeat`), handed in.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from datetime import timedelta
from typing import Any

import structlog

from pgcrond.storage.claims import Acquired

log = structlog.get_logger("pgcrond.storage.keepalive")

# Extends a live lease: how long it now has left, or None when fenced or lapsed.
Heartbeat = Callable[[Acquired], Awaitable[timedelta | None]]


async def keep_alive(
    lease: Acquired,
    heartbeat: Heartbeat,
    on_failure: Callable[[Exception], None] | None = None,
    *,
    first_wait_done: bool = False,
) -> None:
    """Heartbeat until cancelled; set ``lease.cancellation`` when the lease is going.

    A fenced or lapsed heartbeat means the lease is gone: "lease_lost".
    Otherwise the run goes on only while the lease surely holds, by the
    database's own numbers at the last answer (``expires_at - db_now``,
    counted from when that statement was *sent*), less the stop budget
    (the runner's stop grace and a safety margin), so that the run is over
    before another replica may take the tick over: "lease_expired". A
    heartbeat that hangs (a partition) is not waited for past that point:
    its statement is left behind, never awaited, so no driver clean-up
    (a cancel request, a reconnect) can hold the run past its lease.
    ``first_wait_done``: the caller waited :func:`first_wait` already.
    """
    interval = lease.timing.heartbeat.total_seconds()
    budget = lease.timing.stop_budget.total_seconds()
    # After a failure, try again sooner: one lost heartbeat must not cost the run.
    retry = max(0.05, interval / 4)
    stop_at = lease.stop_at
    pause = interval
    pending: asyncio.Task[timedelta | None] | None = None
    try:
        while True:
            remaining = stop_at - time.monotonic()
            if remaining <= 0:
                lease.cancellation.cancel("lease_expired")
                log.warning(
                    "lease_expired", job=lease.identity.code, run_key=lease.identity.run_key
                )
                return
            if pending is None:
                if first_wait_done:
                    first_wait_done = False
                else:
                    await asyncio.sleep(_next_wait(interval, pause, remaining))
                if not interval or time.monotonic() >= stop_at:
                    continue
                sent = time.monotonic()
                pending = asyncio.ensure_future(heartbeat(lease))
            done, _ = await asyncio.wait({pending}, timeout=max(stop_at - time.monotonic(), 0))
            if not done:
                continue  # the stop deadline came first: stop the run (loop top)
            task, pending = pending, None
            try:
                renewed = task.result()
            except Exception as exc:  # any failure: keep the lease while it surely holds
                if on_failure is not None:
                    on_failure(exc)
                log.warning(
                    "heartbeat_failed",
                    job=lease.identity.code,
                    run_key=lease.identity.run_key,
                    error=str(exc) or type(exc).__name__,
                    stop_in_s=round(stop_at - time.monotonic(), 3),
                )
                pause = retry
                continue
            if renewed is None:
                lease.cancellation.cancel("lease_lost")
                log.warning("lease_lost", job=lease.identity.code, run_key=lease.identity.run_key)
                return
            stop_at = sent + renewed.total_seconds() - budget
            pause = interval
    finally:
        if pending is not None:
            _abandon(pending)


@contextlib.asynccontextmanager
async def holding(
    lease: Acquired, heartbeat: Heartbeat, on_failure: Callable[[Exception], None] | None = None
) -> AsyncIterator[Acquired]:
    """Keep ``lease`` alive in the background for the duration of the block.

    The heartbeat's task is made only when its first beat (or the stop
    deadline) is due: most runs end before, and cost a timer, not a task.
    """
    loop = asyncio.get_running_loop()
    task: asyncio.Task[None] | None = None

    def start() -> None:
        nonlocal task
        task = loop.create_task(keep_alive(lease, heartbeat, on_failure, first_wait_done=True))

    remaining = max(lease.stop_at - time.monotonic(), 0.0)
    interval = lease.timing.heartbeat.total_seconds()
    timer = loop.call_later(_next_wait(interval, interval, remaining), start)
    try:
        yield lease
    finally:
        timer.cancel()
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task


# Heartbeats wake on a grid of the loop's clock, so that co-running leases
# (claimed together, renewed at the same interval) beat in the same loop turn
# and share one statement. The stop deadline itself is never moved onto the grid.
_BEAT_GRID_S = 0.05


def _next_wait(interval: float, pause: float, remaining: float) -> float:
    """Until the next heartbeat (on the grid), or the stop deadline if that comes first."""
    beat_soon = interval and pause < remaining - _BEAT_GRID_S
    return _on_grid(pause) if beat_soon else remaining


def _on_grid(seconds: float) -> float:
    now = asyncio.get_running_loop().time()
    wake = math.ceil((now + seconds) / _BEAT_GRID_S) * _BEAT_GRID_S
    return max(wake - now, 0.0)


def _abandon(task: asyncio.Task[Any]) -> None:
    """Cancel ``task`` without waiting for it; its outcome is of no interest any more."""
    task.cancel()
    task.add_done_callback(lambda done: done.cancelled() or done.exception())
