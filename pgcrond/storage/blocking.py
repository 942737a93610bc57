"""A :class:`Database` on a blocking portal: what the synchronous facades are built on.

The library is async first; :class:`~pgcrond.storage.sync_store.SyncLeaseStore`
and :class:`~pgcrond.storage.sync_advisory.SyncAdvisoryLock` run the same async
code on anyio's blocking portal (a private loop on a thread of its own)
instead of a second, drifting implementation. This owns that portal and the
database on it: opened together, closed together, also as a ``with`` block.
"""

from __future__ import annotations

from typing import Self

from anyio.from_thread import start_blocking_portal

from pgcrond.storage.db import Database


class BlockingDatabase:
    """``db`` opened on a portal of its own; :meth:`close` (or leaving ``with``) ends both."""

    def __init__(self, db: Database) -> None:
        self.db = db
        self._portal_cm = start_blocking_portal()
        self.portal = self._portal_cm.__enter__()
        try:
            self.portal.call(db.open)
        except BaseException:
            # The portal's thread is not a daemon: leaving it would hang the exit.
            self._portal_cm.__exit__(None, None, None)
            raise

    def close(self) -> None:
        self.portal.call(self.db.close)
        self._portal_cm.__exit__(None, None, None)

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()
