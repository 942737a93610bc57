"""The advisory guard for synchronous code: :class:`SyncAdvisoryLock`.

A module of its own, beside :mod:`pgcrond.storage.sync_store`: the blocking
portal it runs on (anyio's) is what synchronous callers need and the daemon
does not, so the daemon never imports it.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from datetime import datetime, timedelta
from typing import Any

from pgcrond.core.keys import KeyHash
from pgcrond.storage.advisory import AdvisoryLease, advisory_lock
from pgcrond.storage.blocking import BlockingDatabase
from pgcrond.storage.db import Database


class SyncAdvisoryLock(BlockingDatabase):
    """The advisory guard for synchronous code: a private loop and a small pool.

    The job runs in the caller's thread; probing runs on the private loop, so
    ``lease.cancellation`` is set while the job is still busy.
    """

    def __init__(self, conninfo: str, *, max_size: int = 4) -> None:
        super().__init__(Database(conninfo, min_size=1, max_size=max_size))

    @contextlib.contextmanager
    def lock(
        self,
        key: str | int,
        *,
        key_hash: KeyHash = "pgcrond",
        min_hold: timedelta = timedelta(seconds=5),
        tick: datetime | None = None,
        probe_interval: timedelta = timedelta(seconds=1),
    ) -> Iterator[AdvisoryLease]:
        """As :func:`advisory_lock`, for a ``with`` block in synchronous code."""
        # Both halves of the async manager run on the portal's loop: the probe
        # task it starts lives there.
        with self.portal.wrap_async_context_manager(
            advisory_lock(
                self.db,
                key,
                key_hash=key_hash,
                min_hold=min_hold,
                tick=tick,
                probe_interval=probe_interval,
            ),
        ) as lease:
            yield lease


@contextlib.contextmanager
def advisory_lock_sync(conninfo: str, key: str | int, **options: Any) -> Iterator[AdvisoryLease]:
    """One guarded run from synchronous code, on a pool of one opened for it.

    ``options`` are :meth:`SyncAdvisoryLock.lock`'s. For many runs, keep a
    :class:`SyncAdvisoryLock` instead.
    """
    with SyncAdvisoryLock(conninfo, max_size=1) as guard, guard.lock(key, **options) as lease:
        yield lease
