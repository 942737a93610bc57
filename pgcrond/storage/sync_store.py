"""The lease store for synchronous code: :class:`SyncLeaseStore`."""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Awaitable, Callable
from datetime import timedelta
from typing import Any, TypeVar

from pgcrond.core.keys import Identity
from pgcrond.core.overlap import ALLOW, Overlap
from pgcrond.core.timing import LeaseTiming
from pgcrond.storage.blocking import BlockingDatabase
from pgcrond.storage.claims import Acquired, NotAcquired
from pgcrond.storage.db import Database
from pgcrond.storage.leases import LeaseStore
from pgcrond.storage.migrate import migrate

T = TypeVar("T")


class SyncLeaseStore(BlockingDatabase):
    """The same lease store for synchronous code, run on its database's blocking portal."""

    def __init__(self, conninfo: str, **options: Any) -> None:
        """``options``: :class:`LeaseStore`'s (``schema``, ``table``, ``owner``)."""
        db = Database(conninfo)
        # Made before the portal starts: bad options leave no thread behind.
        self.store = LeaseStore(db, **options)
        super().__init__(db)

    def _wait(self, call: Callable[[], Awaitable[T]]) -> T:
        """``call()`` on the portal's loop, awaited there: the store answers some
        calls with a future, which the portal would hand back unawaited."""

        async def waited() -> T:
            return await call()

        return self.portal.call(waited)

    def migrate(self) -> list[int]:
        return self.portal.call(migrate, self.store)

    def claim(
        self, identity: Identity, timing: LeaseTiming | None = None, *, overlap: Overlap = ALLOW
    ) -> Acquired | NotAcquired:
        return self._wait(functools.partial(self.store.claim, identity, timing, overlap=overlap))

    def heartbeat(self, lease: Acquired) -> timedelta | None:
        return self.portal.call(self.store.heartbeat, lease)

    def complete(self, lease: Acquired) -> bool:
        return self._wait(functools.partial(self.store.complete, lease))

    def fail(
        self,
        lease: Acquired,
        error: str,
        *,
        reason: str = "error",
        retry_after: timedelta | None = timedelta(0),
    ) -> bool:
        return self._wait(
            functools.partial(self.store.fail, lease, error, reason=reason, retry_after=retry_after)
        )

    def release(self, lease: Acquired) -> bool:
        return self._wait(functools.partial(self.store.release, lease))

    def run_exclusive(
        self,
        identity: Identity,
        fn: Callable[[Acquired], T],
        *,
        timing: LeaseTiming | None = None,
        overlap: Overlap = ALLOW,
    ) -> T | NotAcquired:
        """As :meth:`LeaseStore.run_exclusive`; ``fn`` runs in a worker thread."""

        async def in_thread(lease: Acquired) -> T:
            return await asyncio.to_thread(fn, lease)

        return self.portal.call(
            functools.partial(
                self.store.run_exclusive,
                identity,
                in_thread,
                timing=timing,
                overlap=overlap,
            )
        )
