"""The loop-stall probe: how long the event loop went without running a ready callback.

Every claim, heartbeat and run of a replica shares one event loop, so a step
that holds it (a render, a big batch's bookkeeping) delays all of them. The
probe wakes every ``PERIOD_S`` while a tick's fires are in flight, and the
lag of each wake-up past its due time is a stall of at least that length.
It sleeps while the replica is idle: an idle replica has nothing to stall,
and wakes no more often than its liveness beat.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

PERIOD_S = 0.01


class StallProbe:
    """The longest stall seen since start, measured only while ``busy()`` is true."""

    def __init__(self, busy: Callable[[], bool], on_stall: Callable[[float], None]) -> None:
        self._busy = busy
        self._on_stall = on_stall
        self._task: asyncio.Task[None] | None = None
        self.longest_s = 0.0

    def wake(self) -> None:
        """Start probing (a tick fires); a no-op while the probe already runs."""
        if self._task is None or self._task.done():
            self._task = asyncio.create_task(self._probe(), name="loop-stall-probe")

    def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()

    async def _probe(self) -> None:
        loop = asyncio.get_running_loop()
        # One idle period after the last fire ended: a stall at the very end counts too.
        idle = 0
        while idle < 2:
            due = loop.time() + PERIOD_S
            await asyncio.sleep(PERIOD_S)
            lag = loop.time() - due
            if lag > self.longest_s:
                self.longest_s = lag
                self._on_stall(lag)
            idle = 0 if self._busy() else idle + 1
