"""Claims won ahead of their tick, held until the database's clock has surely reached it.

A big tick is claimed well before it (``CLAIM_AHEAD_MAX``): thousands of won
claims then wait for one fire time. They wait on one timer per fire time,
not one each, and are let go a chunk per loop turn: let go at once, their
runs would all start in one turn of the loop (0.4-0.5 s at 10,000 jobs on
three replicas), with no answer, heartbeat or stop seen meanwhile.

When a fire time is reached is known only from below, through the
:class:`~pgcrond.storage.dbclock.ClockFloor` the store's answers feed; each
waiter brings the floor as it stands, and a tighter floor moves the timer
earlier, never later.
"""

from __future__ import annotations

import asyncio
from collections import deque
from dataclasses import dataclass, field
from datetime import datetime

from pgcrond.storage.dbclock import ClockFloor

# Waiters let go per loop turn: each starts its run in that turn (0.1-0.4 ms
# of a loaded loop a run). At 10,000 x 3 on two cores (bench.scale)
# 100 a turn kept the longest turn at 64-85 ms and the tick's p99 at 1.2-1.3
# s; 500, 194-224 ms and 1.05-1.15 s; all at once, half a second.
RELEASE_CHUNK = 250


@dataclass
class _Gate:
    at: float  # the loop's (monotonic) time at which the fire time is surely reached
    timer: asyncio.TimerHandle
    waiters: deque[asyncio.Future[None]] = field(default_factory=deque)


class FireTimes:
    """Where runs of claims won ahead wait for their fire time (one per lease guard)."""

    def __init__(self, floor: ClockFloor, chunk: int = RELEASE_CHUNK) -> None:
        self._floor = floor
        self._chunk = chunk
        self._gates: dict[datetime, _Gate] = {}

    async def reached(self, fire_time: datetime) -> None:
        """Return once the database's clock has surely reached ``fire_time``.

        At once when it has, or when no recent answer bounds it (the claim
        that won the tick has just fed the floor, so that is one whose answer
        took longer than the floor keeps any).
        """
        at = self._floor.reaches(fire_time)
        loop = asyncio.get_running_loop()
        if at is None or at <= loop.time():
            return
        gate = self._gates.get(fire_time)
        if gate is None:
            gate = self._gates[fire_time] = _Gate(at, loop.call_at(at, self._open, fire_time))
        elif at < gate.at:
            gate.timer.cancel()
            gate.at, gate.timer = at, loop.call_at(at, self._open, fire_time)
        waiter: asyncio.Future[None] = loop.create_future()
        gate.waiters.append(waiter)
        await waiter

    def _open(self, fire_time: datetime) -> None:
        self._let_go(self._gates.pop(fire_time).waiters)

    def _let_go(self, waiters: deque[asyncio.Future[None]]) -> None:
        let_go = 0
        while waiters and let_go < self._chunk:
            waiter = waiters.popleft()
            if not waiter.done():  # a fire cancelled while it waited
                waiter.set_result(None)
                let_go += 1
        if waiters:
            asyncio.get_running_loop().call_soon(self._let_go, waiters)
