"""History retention: pruned at most hourly, after a run, by one replica at a time."""

from __future__ import annotations

import time
from collections.abc import Callable, Coroutine
from datetime import UTC, datetime, timedelta
from typing import Any

import structlog

from pgcrond.config.models import Config, min_history_retention, prune_rules
from pgcrond.core.keys import Identity
from pgcrond.core.schedule import run_key_for
from pgcrond.errors import PgcrondError
from pgcrond.storage.claims import NotAcquired
from pgcrond.storage.history import abandon_stale, prune
from pgcrond.storage.leases import LeaseStore
from pgcrond.storage.requests import prune_requests

log = structlog.get_logger("pgcrond.daemon.pruning")

PRUNE_EVERY = timedelta(hours=1)
PRUNE_CODE = "pgcrond:prune"


class Pruning:
    """Prunes under a ``pgcrond:prune`` lease per hour: one replica prunes, the others skip."""

    def __init__(
        self,
        store: LeaseStore,
        config: Callable[[], Config],
        spawn: Callable[[Coroutine[Any, Any, Any]], None],
    ) -> None:
        """``spawn``: a background task of the daemon's."""
        self._store = store
        self._config = config
        self._spawn = spawn
        self._last_prune = -float("inf")

    def maybe_prune(self) -> None:
        """Prune history at most hourly, after a run: an idle replica sends no query."""
        now = time.monotonic()
        if now - self._last_prune < PRUNE_EVERY.total_seconds():
            return
        self._last_prune = now
        self._spawn(self._prune())

    async def _prune(self) -> None:
        store = self._store
        hour = datetime.now(UTC).replace(minute=0, second=0, microsecond=0)
        identity = Identity.schedule(PRUNE_CODE, run_key_for(hour))

        async def prune_history(_: object) -> tuple[int, int, int]:
            abandoned = await abandon_stale(store, min_history_retention(self._config().jobs))
            deleted = 0
            for rule in prune_rules(self._config()):
                deleted += await prune(
                    store, rule.older_than, only=rule.only, excluding=rule.excluding
                )
            # Finished requests go with the history of the same age.
            requests = await prune_requests(store, self._config().history_retention)
            return abandoned, deleted, requests

        try:
            done = await store.run_exclusive(identity, prune_history, retry_after=None)
        except PgcrondError as exc:
            log.warning("prune_failed", error=str(exc))
            return
        if not isinstance(done, NotAcquired):
            log.info(
                "history_pruned",
                abandoned=done[0],
                deleted=done[1],
                requests=done[2],
                older_than_s=self._config().history_retention.total_seconds(),
            )
