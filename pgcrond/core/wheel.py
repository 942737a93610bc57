"""The replica's one scheduler of timed wake-ups: every wait on a time, on one grid.

Whatever waits for a time on the fire path waits here: a follower until a
held lease could have lapsed or a retry is due, a tick not due yet, a
deferred look, a hold-back, a run won ahead of its tick, a heartbeat. Like
psycopg_pool's ``sched_async`` (one heap, one sleeper), the wheel keeps one
heap of due times and one loop timer, for its earliest.

Two rules make co-firing work cheap, and they are the wheel's two constants:

* wake-ups are rounded up to a :data:`GRID_S` slot, so that waits due within
  the same few milliseconds (the co-firing jobs of a tick, whose leases all
  count from its fire time) wake in one loop turn and their claims, looks or
  heartbeats share one statement;
* at most :data:`PER_TURN` fires' worth of wake-ups are called a loop turn,
  the rest in the turns after. A wake-up weighs the fires it carries on:
  one for a run's or a claim's waiter, a chunk's size for a tick's chunk
  (handed on, claimed or judged together, a chunk being at most
  :data:`PER_TURN` fires), so a big tick goes a chunk a turn and thousands
  of fires never hold one turn, with no answer, heartbeat or stop seen
  meanwhile. What is due now (a statement's answers, :meth:`call_soon`)
  takes its turn with what came due on time.

One wheel per event loop (:func:`wheel`): every module reaches the same one
without being handed it, and a test's loop gets a wheel of its own.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import functools
import heapq
import math
import weakref
from collections import deque
from collections.abc import Callable

# Wake-ups due within 10 ms share a loop turn (and their statements); it is
# also the most the rounding delays a wake-up, so a run held for its tick by
# the database clock starts at most this much later for it.
GRID_S = 0.01
# Fires carried on a loop turn, at most: a tick's chunk (its fires handed on
# and claimed in one statement, or its answers judged) or the runs they
# start. A run's steps cost 0.15-0.25 ms of the loop and a fire's share of a
# chunk 0.02-0.04 ms, so a turn holds 15-25 ms of CPU (bench.scale --steps:
# at 10,000 x 1 the longest turn is 24-32 ms; 250 a turn, 35-55 ms).
PER_TURN = 100


class Wheel:
    """Timed wake-ups on one loop: :meth:`call_at` for a callback, :meth:`until` to await."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        # Slot number -> what wakes then; the heap holds each slot number once.
        self._slots: dict[int, deque[tuple[Callable[[], object], int]]] = {}
        self._heap: list[int] = []
        self._timer: asyncio.TimerHandle | None = None
        self._timer_slot: int | None = None
        # What is due, with its weight, PER_TURN fires' worth called a loop
        # turn; and whether a turn is asked for.
        self._ready: deque[tuple[Callable[[], object], int]] = deque()
        self._draining = False
        # Wake-ups run in a context of their own, empty: one asked for inside
        # a run (its log context, its trace span) must not hand that run's
        # context to the fires, tasks and log lines of other jobs it wakes.
        self._context = contextvars.Context()

    def __len__(self) -> int:
        """Wake-ups waiting now."""
        return sum(map(len, self._slots.values())) + len(self._ready)

    def call_soon(self, action: Callable[[], object], weight: int = 1) -> None:
        """Call ``action`` in a coming loop turn, in turn with everything else due.

        ``weight``: the fires it carries on (at most :data:`PER_TURN` count).
        """
        self._ready.append((action, weight))
        self._drain_soon()

    def call_at(self, when: float, action: Callable[[], object], weight: int = 1) -> None:
        """Call ``action`` at the loop's time ``when``, or up to a grid slot later."""
        slot = math.ceil(when / GRID_S)
        actions = self._slots.get(slot)
        if actions is None:
            actions = self._slots[slot] = deque()
            heapq.heappush(self._heap, slot)
            if self._timer_slot is None or slot < self._timer_slot:
                self._arm(slot)
        actions.append((action, weight))

    def call_later(self, seconds: float, action: Callable[[], object], weight: int = 1) -> None:
        self.call_at(self._loop.time() + seconds, action, weight)

    def on_grid(self, seconds: float) -> float:
        """Seconds from now to the grid slot a wake-up ``seconds`` from now wakes in.

        For a timer that must stay cancellable (a loop timer of its own) and
        still wake with the wake-ups of its slot.
        """
        now = self._loop.time()
        return max(math.ceil((now + seconds) / GRID_S) * GRID_S - now, 0.0)

    async def until(self, when: float, weight: int = 1) -> None:
        """Return at the loop's time ``when``, or up to a grid slot later; at once if it came.

        ``weight``: the fires the waiter carries on once woken (see :meth:`call_soon`).
        """
        if when <= self._loop.time():
            return
        woken: asyncio.Future[None] = self._loop.create_future()
        self.call_at(when, functools.partial(wake, woken), weight)
        await woken

    async def sleep(self, seconds: float) -> None:
        await self.until(self._loop.time() + seconds)

    async def turn(self, weight: int) -> None:
        """Return in a coming loop turn, with room in it for ``weight`` fires' worth of work."""
        woken: asyncio.Future[None] = self._loop.create_future()
        self.call_soon(functools.partial(wake, woken), weight)
        await woken

    def _arm(self, slot: int) -> None:
        if self._timer is not None:
            self._timer.cancel()
        self._timer_slot = slot
        self._timer = self._loop.call_at(slot * GRID_S, self._due, context=self._context)

    def _due(self) -> None:
        """Make every slot that has come ready; arm the timer for the next one."""
        self._timer = self._timer_slot = None
        # The slots whose time has come (the loop may run a timer a clock
        # resolution early: never a slot later than that).
        now = math.floor((self._loop.time() + 1e-6) / GRID_S)
        while self._heap and self._heap[0] <= now:
            self._ready.extend(self._slots.pop(heapq.heappop(self._heap)))
        if self._heap:
            self._arm(self._heap[0])
        self._drain_soon()

    def _drain_soon(self) -> None:
        if not self._draining and self._ready:
            self._draining = True
            self._loop.call_soon(self._drain, context=self._context)

    def _drain(self) -> None:
        """Call :data:`PER_TURN` fires' worth of what is ready (one at least); the rest later."""
        self._draining = False
        ready = self._ready
        room = PER_TURN
        while ready and (room == PER_TURN or ready[0][1] <= room):
            action, weight = ready.popleft()
            room -= weight
            action()
        self._drain_soon()


def wake(woken: asyncio.Future[None]) -> None:
    """Resolve ``woken``, unless it was already (woken another way, or its waiter cancelled)."""
    with contextlib.suppress(asyncio.InvalidStateError):
        woken.set_result(None)


_wheels: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, Wheel] = weakref.WeakKeyDictionary()


def wheel() -> Wheel:
    """The running loop's wheel."""
    loop = asyncio.get_running_loop()
    found = _wheels.get(loop)
    if found is None:
        found = _wheels[loop] = Wheel(loop)
    return found
