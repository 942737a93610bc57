"""Guards: what decides which replica runs a tick (the contract is in ``base``).

:class:`Guards` hands :mod:`pgcrond.fire` the guard of each job, so the fire
never branches on the guard kind.
"""

from __future__ import annotations

from collections.abc import Callable

from pgcrond.config.models import JobConfig
from pgcrond.core.keys import Identity
from pgcrond.guard.advisory import AdvisoryGuard
from pgcrond.guard.base import Guard
from pgcrond.guard.lease import LeaseGuard
from pgcrond.guard.spread import Spread
from pgcrond.storage.db import Database
from pgcrond.storage.leases import LeaseStore


class Guards:
    """One replica's guards: the lease table, and an advisory lock per job."""

    def __init__(
        self,
        store: LeaseStore,
        advisory_db: Database,
        *,
        spread: Spread | None = None,
        on_heartbeat_failure: Callable[[Identity], None] | None = None,
    ) -> None:
        self.store = store
        self.advisory_db = advisory_db
        self.lease = LeaseGuard(store, spread=spread, on_heartbeat_failure=on_heartbeat_failure)
        self._advisory: dict[tuple[str, str | int, str, float], AdvisoryGuard] = {}

    def for_job(self, job: JobConfig) -> Guard:
        if job.guard == "lease":
            return self.lease
        key = job.lock_key if job.lock_key is not None else job.code
        # Keyed by what the lock depends on, so a reload that changes them
        # gets a new guard while running fires keep theirs.
        cache_key = (job.code, key, job.key_hash, job.min_hold.total_seconds())
        guard = self._advisory.get(cache_key)
        if guard is None:
            guard = self._advisory[cache_key] = AdvisoryGuard(
                self.advisory_db, key, key_hash=job.key_hash, min_hold=job.min_hold
            )
        return guard
