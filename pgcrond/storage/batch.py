"""Requests made in one turn of the event loop, sent as one statement.

Co-finishing runs finalize in the same turn (with the tick's look at the
ticks other replicas run, :meth:`LeaseStore.standings`), co-running leases
heartbeat on the same grid instant: each group shares one round trip and one
transaction instead of paying one each. (A tick's claims need no gathering: they are
claimed together, a chunk a statement, :meth:`LeaseStore.claim_many`.) A request
whose key is already in the batch (one row at most once per statement: ``ON
CONFLICT`` and ``UPDATE … FROM`` cannot touch a row twice) waits for the next
batch, which is sent only once this one is answered: decided after it, in order.

A batch is at most ``max_size`` requests: more (the runs of a 10,000-job
tick) go as several statements side by side, so none is unbounded.

A request given up on (its bound ran out, its fire was stopped: its future is
cancelled) is left out of a batch not yet sent, and skipped when the answer
comes; an answer that cannot be made for one request fails that request
only. No request ever affects another of its batch.

Runs that finish near each other rarely finish in the same turn, so a batch
may *linger*: held up to ``linger`` seconds for requests still expected
(``expected()`` says how many), and sent the moment the last of them arrives.
"""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Awaitable, Callable, Hashable, Iterable
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar

from pgcrond.core.wheel import wheel

T = TypeVar("T")


@dataclass(eq=False)
class Pending(Generic[T]):
    """One request of a batch and the future its answer goes to."""

    request: Any
    result: asyncio.Future[T] = field(default_factory=lambda: _loop().create_future())


def _loop() -> asyncio.AbstractEventLoop:
    return asyncio.get_running_loop()


class TurnBatch(Generic[T]):
    """Collect requests for one loop turn; ``send(requests)`` makes one statement of them.

    ``send`` returns how to answer each of its requests (called once per
    request still waited for); an exception it raises itself (the statement
    failed) is handed to every request still waiting.
    """

    def __init__(
        self,
        send: Callable[[list[Any]], Awaitable[Callable[[Any], T]]],
        *,
        keys: Callable[[Any], Iterable[Hashable]] = lambda _: (),
        linger: float = 0.0,
        expected: Callable[[], int] = lambda: 0,
        max_size: int = 500,
    ) -> None:
        self._send = send
        self._max_size = max_size
        self._keys = keys
        self._linger = linger
        self._expected = expected
        self._pending: list[Pending[T]] = []
        self._tasks: set[asyncio.Task[None]] = set()
        self._timer: asyncio.TimerHandle | None = None
        self._flush_soon = False

    def submit(self, request: Any) -> asyncio.Future[T]:
        """The future of ``request``'s answer; cancel it to give the request up.

        A future, not a coroutine: awaiting it (or bounding it) costs no task,
        on the path every claim and finalize of a tick takes.
        """
        pending: Pending[T] = Pending(request)
        self._add(pending)
        return pending.result

    def _add(self, pending: Pending[T]) -> None:
        self._pending.append(pending)
        if self._flush_soon:
            return
        loop = asyncio.get_running_loop()
        if self._linger > 0 and self._expected() > 0:
            if self._timer is None:
                self._timer = loop.call_later(self._linger, self._flush)
            return
        # Nothing more expected: this turn's requests go now (with the lingering ones).
        self._flush_soon = True
        loop.call_soon(self._flush)

    def _add_all(self, batch: list[Pending[T]]) -> None:
        for pending in batch:
            self._add(pending)

    def _flush(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        self._flush_soon = False
        batch, self._pending = self._pending, []
        if not batch:
            return
        seen: set[Hashable] = set()
        now: list[Pending[T]] = []
        later: list[Pending[T]] = []
        for pending in batch:
            keys = set(self._keys(pending.request))
            if keys & seen:
                later.append(pending)
            else:
                seen |= keys
                now.append(pending)
        chunks = [now[i : i + self._max_size] for i in range(0, len(now), self._max_size)]
        tasks = [asyncio.create_task(self._run(chunk)) for chunk in chunks]
        for task in tasks:
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)
        if later:
            # Sent once this batch is answered, never beside it: a request that
            # shares a key is decided after the one it shares it with.
            waiting = asyncio.gather(*tasks, return_exceptions=True)
            waiting.add_done_callback(lambda _: self._add_all(later))

    async def _run(self, batch: list[Pending[T]]) -> None:
        live = [pending for pending in batch if not pending.result.done()]
        if not live:
            return
        try:
            answer = await self._send([pending.request for pending in live])
        except BaseException as exc:
            for pending in live:
                if not pending.result.done():
                    pending.result.set_exception(exc)
            if not isinstance(exc, Exception):
                raise
            return
        # Each answer wakes its requester (its run may start then): handed out
        # on the wheel, a share a loop turn, so 500 never hold one turn.
        ready = wheel()
        for pending in live:
            if pending.result.done():
                continue  # given up on while the statement was out
            try:
                value = answer(pending.request)
            except Exception as exc:
                ready.call_soon(functools.partial(_fail, pending.result, exc))
            else:
                ready.call_soon(functools.partial(_resolve, pending.result, value))


def _resolve(result: asyncio.Future[T], value: T) -> None:
    if not result.done():  # given up on while its answer waited for its turn
        result.set_result(value)


def _fail(result: asyncio.Future[T], exc: Exception) -> None:
    if not result.done():
        result.set_exception(exc)
