"""The loop-stall probe: the longest turn of the event loop while a tick's fires are in flight.

Every claim, heartbeat and run of a replica shares one event loop, so a step
that holds it (a render, a big batch's bookkeeping) delays all of them. The
daemon's loop is made with a selector that times its own turns: from one
``select()`` returning to the next being called the loop runs what is ready
and looks at nothing new, so no timer, claim answer or signal can be seen
meanwhile. The longest such turn while fires are in flight is the stall.

It costs two clock reads a turn and no timer of its own. A probe that woke
every 10 ms to see how late its timer ran cost a replica 13-20 ms of CPU a
second while fires were in flight (``bench.stall_probe``), most of it the
wake-ups themselves, and saw a stall only from the next wake-up on.
"""

from __future__ import annotations

import asyncio
import selectors
import time
from collections.abc import Callable


class StallProbe:
    """The longest turn seen since start of a loop made by :meth:`new_loop`, while ``busy()``.

    A turn counts when fires were in flight as it began or as it ended, so
    the turn that hands a tick's fires on and the one that finishes the last
    of them count too. A loop made elsewhere (a test's) is not timed.
    """

    def __init__(self, busy: Callable[[], bool], on_stall: Callable[[float], None]) -> None:
        self._busy = busy
        self._on_stall = on_stall
        self._began: float | None = None
        self._began_busy = False
        self.longest_s = 0.0

    def new_loop(self) -> asyncio.AbstractEventLoop:
        """An event loop whose turns this probe times (``asyncio.Runner``'s ``loop_factory``)."""
        return asyncio.SelectorEventLoop(_TimedSelector(self))

    def _turn_begins(self) -> None:
        self._began = time.monotonic()
        self._began_busy = self._busy()

    def _turn_ends(self) -> None:
        if self._began is None:
            return
        turn = time.monotonic() - self._began
        if turn > self.longest_s and (self._began_busy or self._busy()):
            self.longest_s = turn
            self._on_stall(turn)


class _TimedSelector(selectors.DefaultSelector):
    """The platform's selector, telling its probe where each loop turn begins and ends."""

    def __init__(self, probe: StallProbe) -> None:
        super().__init__()
        self._probe = probe

    def select(self, timeout: float | None = None) -> list[tuple[selectors.SelectorKey, int]]:
        self._probe._turn_ends()
        try:
            return super().select(timeout)
        finally:
            self._probe._turn_begins()
