"""The one cancellation signal a run sees, whoever stops it.

A run can be stopped because its lease was lost, its timeout hit, or the
daemon is shutting down. Entry points may be sync (in a worker thread) or async
(on the loop), so the signal must be observable from both worlds: a
``threading.Event`` is the source of truth and asyncio waiters are woken with
``call_soon_threadsafe``. The ``threading.Event`` a worker thread blocks on is
made only when one does: every claim makes a signal, few runs are threads.
"""

from __future__ import annotations

import asyncio
import threading
from typing import Any

from pgcrond.errors import Cancelled


def abandon(future: asyncio.Future[Any]) -> None:
    """Cancel ``future`` and never wait for it: whatever it ends with is of no interest.

    Its end is read when it comes, since asyncio logs an exception nobody
    read ("never retrieved") at ERROR.
    """
    future.cancel()
    future.add_done_callback(lambda done: done.cancelled() or done.exception())


class Cancellation:
    """Set once, with the reason of whoever set it first."""

    def __init__(self) -> None:
        self._set = False
        self._event: threading.Event | None = None
        self._lock = threading.Lock()
        self._reason: str | None = None
        self._waiters: list[tuple[asyncio.AbstractEventLoop, asyncio.Future[None]]] = []
        self._children: list[Cancellation] = []

    @property
    def reason(self) -> str | None:
        return self._reason

    def is_set(self) -> bool:
        return self._set

    def cancel(self, reason: str) -> bool:
        """Set the signal; returns False when it was already set (first reason wins)."""
        with self._lock:
            if self._set:
                return False
            self._reason = reason
            self._set = True
            if self._event is not None:
                self._event.set()
            waiters, self._waiters = self._waiters, []
            children, self._children = self._children, []
        for loop, future in waiters:
            if not loop.is_closed():
                loop.call_soon_threadsafe(_resolve, future)
        for child in children:
            child.cancel(reason)
        return True

    def child(self) -> Cancellation:
        """A signal of its own (say, for one attempt) that is also set when this one is."""
        child = Cancellation()
        with self._lock:
            if not self._set:
                self._children.append(child)
                return child
        child.cancel(self._reason or "cancelled")
        return child

    def check(self) -> None:
        """Raise :class:`Cancelled` if the run was cancelled (for cooperative jobs)."""
        if self._set:
            raise Cancelled(self._reason or "cancelled")

    def wait_sync(self, timeout: float | None = None) -> bool:
        """Block a worker thread until cancelled or ``timeout``; True when cancelled."""
        with self._lock:
            if self._set:
                return True
            if self._event is None:
                self._event = threading.Event()
            event = self._event
        return event.wait(timeout)

    def future(self) -> asyncio.Future[None]:
        """A future of the running loop, done once cancelled; cancel it to stop listening."""
        loop = asyncio.get_running_loop()
        future: asyncio.Future[None] = loop.create_future()
        with self._lock:
            if not self._set:
                self._waiters.append((loop, future))
                return future
        future.set_result(None)
        return future

    async def wait(self) -> str:
        """Wait on the running loop until cancelled; returns the reason."""
        await self.future()
        return self._reason or "cancelled"


def _resolve(future: asyncio.Future[None]) -> None:
    if not future.done():
        future.set_result(None)
