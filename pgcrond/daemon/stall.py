"""The loop-stall probe: how long the event loop went without running a ready callback.

Every claim, heartbeat and run of a replica shares one event loop, so a step
that holds it (a render, a big batch's bookkeeping) delays all of them. The
probe wakes every ``PERIOD_S`` while a tick's fires are in flight, and the
lag of each wake-up past its due time is a stall of at least that length.
It sleeps while the replica is idle: an idle replica has nothing to stall,
and wakes no more often than its liveness beat.

A wake-up is one timer callback, no task: at 50 per-second jobs the probe
runs nearly all the time, a hundred wake-ups a second, and a task's step and
its sleep's future each time were 7 % of a replica's busy loop.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

PERIOD_S = 0.01
# Wake-ups with nothing in flight before the probe sleeps: one idle period
# after the last fire ended, so that a stall at the very end counts too.
_IDLE_WAKES = 2


class StallProbe:
    """The longest stall seen since start, measured only while ``busy()`` is true."""

    def __init__(self, busy: Callable[[], bool], on_stall: Callable[[float], None]) -> None:
        self._busy = busy
        self._on_stall = on_stall
        self._timer: asyncio.TimerHandle | None = None
        self._due = 0.0
        self._idle = 0
        self.longest_s = 0.0

    def wake(self) -> None:
        """Start probing (a tick fires); a no-op while the probe already runs."""
        self._idle = 0
        if self._timer is None:
            self._arm(asyncio.get_running_loop())

    def stop(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def _arm(self, loop: asyncio.AbstractEventLoop) -> None:
        self._due = loop.time() + PERIOD_S
        self._timer = loop.call_at(self._due, self._check, loop)

    def _check(self, loop: asyncio.AbstractEventLoop) -> None:
        lag = loop.time() - self._due
        if lag > self.longest_s:
            self.longest_s = lag
            self._on_stall(lag)
        self._idle = 0 if self._busy() else self._idle + 1
        if self._idle < _IDLE_WAKES:
            self._arm(loop)
        else:
            self._timer = None
