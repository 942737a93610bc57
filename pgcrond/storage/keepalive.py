"""Keeping a lease alive while its run goes on: heartbeats, and the stop deadline.

A lease is renewed on the replica's wheel (:mod:`pgcrond.core.wheel`): the
beats of co-running leases (claimed together, renewed at the same interval)
wake in one grid slot and share one statement
(:class:`pgcrond.storage.batch.TurnBatch`). Its run is told to stop while the
lease surely holds, on a timer of its own: a stop deadline is exact, never
moved onto the grid. The heartbeat itself is the lease store's
(:meth:`pgcrond.storage.leases.LeaseStore.heartbeat`), handed in.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from datetime import timedelta
from typing import Protocol

import structlog

from pgcrond.core.cancel import abandon
from pgcrond.core.wheel import GRID_S, wheel
from pgcrond.storage.claims import Acquired

log = structlog.get_logger("pgcrond.storage.keepalive")


class Heartbeat(Protocol):
    """Extends a live lease: how long it now has left, or None when fenced or lapsed.

    ``revive``: extend it even if it lapsed, as long as no claim came since
    (:meth:`pgcrond.storage.leases.LeaseStore.heartbeat`).
    """

    def __call__(self, lease: Acquired, *, revive: bool = False) -> Awaitable[timedelta | None]: ...


async def keep_alive(
    lease: Acquired,
    heartbeat: Heartbeat,
    on_failure: Callable[[Exception], None] | None = None,
    *,
    woke_from: float | None = None,
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

    A wake due before the stop deadline that comes after it means the loop
    (or the whole process: SIGSTOP, a stall) stood still, and the run went
    on regardless, maybe to its end: stopping it now unasked would leave an
    effect it wrote without its outcome, and the tick would run again. So
    the database is asked first, for at most the stop margin: a lease that
    nobody claimed meanwhile is this owner's still, and is renewed.
    ``woke_from``: the caller waited for the first beat already, due then
    (the loop's monotonic clock).
    """
    interval = lease.timing.heartbeat.total_seconds()
    budget = lease.timing.stop_budget.total_seconds()
    wake_check = lease.timing.stop_margin.total_seconds()
    # After a failure, try again sooner: one lost heartbeat must not cost the run.
    retry = max(0.05, interval / 4)
    stop_at = lease.stop_at
    pause = interval
    pending: asyncio.Task[timedelta | None] | None = None
    answer_by = stop_at
    try:
        while True:
            waited, stalled = woke_from is not None, _stood_still(interval, woke_from, stop_at)
            woke_from = None
            if time.monotonic() >= stop_at and not stalled:
                lease.cancellation.cancel("lease_expired")
                log.warning(
                    "lease_expired", job=lease.identity.code, run_key=lease.identity.run_key
                )
                return
            if pending is None:
                if not waited or not interval:
                    woke_from = await _until_next(interval, pause, stop_at)
                    continue  # the loop's top decides: beat, stop, or ask after a stall
                sent = time.monotonic()
                pending = asyncio.ensure_future(heartbeat(lease, revive=stalled))
                answer_by = sent + wake_check if stalled else stop_at
                if stalled:
                    log.warning(
                        "lease_check_after_stall",
                        job=lease.identity.code,
                        run_key=lease.identity.run_key,
                        stalled_past_stop_s=round(sent - stop_at, 3),
                    )
            done, _ = await asyncio.wait({pending}, timeout=max(answer_by - time.monotonic(), 0))
            if not done:
                stop_at = min(stop_at, time.monotonic())
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
            abandon(pending)


def _stood_still(interval: float, woke_from: float | None, stop_at: float) -> bool:
    """Whether a wake due at ``woke_from`` came past ``stop_at``, which it was due before.

    Only with heartbeats on: without them there is nothing to ask.
    """
    if woke_from is None or not interval:
        return False
    return woke_from < stop_at - GRID_S / 2 <= time.monotonic()


@contextlib.asynccontextmanager
async def holding(
    lease: Acquired, heartbeat: Heartbeat, on_failure: Callable[[Exception], None] | None = None
) -> AsyncIterator[Acquired]:
    """Keep ``lease`` alive in the background for the duration of the block.

    The heartbeat's task is made only when its first beat (or the stop
    deadline) is due: most runs end before, and cost a timer, not a task.
    """
    task: asyncio.Task[None] | None = None
    interval = lease.timing.heartbeat.total_seconds()
    beat = bool(interval) and interval < lease.stop_at - time.monotonic() - GRID_S
    due = time.monotonic() + (interval if beat else max(lease.stop_at - time.monotonic(), 0))

    def start() -> None:
        nonlocal task
        task = asyncio.create_task(keep_alive(lease, heartbeat, on_failure, woke_from=due))

    # A timer of the loop's (cancelled when the run ends first, as most do),
    # on the wheel's grid for a beat: co-running leases' first beats share a slot.
    wait = due - time.monotonic()
    timer = asyncio.get_running_loop().call_later(wheel().on_grid(wait) if beat else wait, start)
    try:
        yield lease
    finally:
        timer.cancel()
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task


async def _until_next(interval: float, pause: float, stop_at: float) -> float:
    """Until the next heartbeat (on the wheel), or the stop deadline if that comes first.

    Returns when the wake was due (monotonic).
    """
    remaining = stop_at - time.monotonic()
    if interval and pause < remaining - GRID_S:
        due = time.monotonic() + pause
        await wheel().sleep(pause)
        return due
    await asyncio.sleep(max(remaining, 0.0))
    return stop_at
