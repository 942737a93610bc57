"""This replica's row of the registry: joined at start, re-joined on reload, touched, left.

The touch is the registry's only statement while the replica is idle: one
``registry_touch`` per :data:`~pgcrond.storage.registry.TOUCH_EVERY`, which
also reads how many config hashes live replicas run (the drift gauge) and
which replicas live (spread's peers). A
touch that fails is logged and tried again a minute later; the row outlives
three missed touches (``GONE_AFTER``), so a short outage loses nothing.
"""

from __future__ import annotations

import asyncio
import uuid

import structlog

from pgcrond import __version__
from pgcrond.config.definition import canonical_texts, config_hash, jobs_text, text_hash
from pgcrond.config.models import Config
from pgcrond.daemon.metrics import Metrics
from pgcrond.errors import DatabaseUnavailable, PgcrondError
from pgcrond.guard.spread import Spread
from pgcrond.storage import registry
from pgcrond.storage.leases import LeaseStore

log = structlog.get_logger("pgcrond.registry")

# Replicas started together (a deploy, a restart of the cluster) each read
# the registry at start, the first ones before the others joined: one touch
# this long after start lets every one know its peers before it shares ticks.
SETTLE_S = 10.0


def entry_of(name: str, instance: uuid.UUID, config: Config) -> registry.Entry:
    """The registry row that says ``name`` runs ``config``."""
    texts = canonical_texts(config)
    jobs = jobs_text(texts)
    return registry.Entry(
        name=name,
        instance=instance,
        version=__version__,
        config_hash=config_hash(config, jobs),
        job_hashes=registry.packed({code: text_hash(text) for code, text in texts.items()}),
        definitions=registry.packed_text(jobs),
    )


class Membership:
    """One replica's presence in the registry, for the life of the process."""

    def __init__(
        self, store: LeaseStore, name: str, config: Config, metrics: Metrics, spread: Spread
    ) -> None:
        self._store = store
        self._metrics = metrics
        self._spread = spread
        # A fresh instance per process: a restarted replica with the same
        # name replaces its predecessor's row, another live one is refused.
        # On the loop, before ready: made on a thread, the entry's memory
        # stayed in that thread's malloc arena (6 MiB more at rest at 10,000
        # jobs, in bench.scale).
        self._entry = entry_of(name, uuid.uuid4(), config)

    @property
    def config_hash(self) -> str:
        return self._entry.config_hash

    async def join(self) -> None:
        """At start: take the name (:class:`ReplicaNameTaken` if held) and read the drift."""
        await registry.join(self._store, self._entry)
        log.info("registry_joined", config_hash=self._entry.config_hash)
        await self._touch()

    async def reloaded(self, config: Config) -> None:
        """After a reload: the row says what now runs; a failure waits for the next touch."""
        # Off the loop: a definition and a hash per job (10,000 jobs: a third of a second).
        self._entry = await asyncio.to_thread(
            entry_of, self._entry.name, self._entry.instance, config
        )
        try:
            await registry.join(self._store, self._entry)
            await self._touch()
        except PgcrondError as exc:
            log.warning("registry_write_failed", operation="reload", error=str(exc))

    async def run(self) -> None:
        """Touch the row once ``SETTLE_S`` after start, then every minute, until cancelled."""
        pause = SETTLE_S
        while True:
            await asyncio.sleep(pause)
            pause = registry.TOUCH_EVERY.total_seconds()
            try:
                await self._touch()
            except DatabaseUnavailable as exc:
                log.warning("registry_write_failed", operation="touch", error=str(exc))
            except PgcrondError as exc:
                # A touch that found the name taken by another instance meanwhile.
                log.error("registry_write_failed", operation="touch", error=str(exc))

    async def leave(self) -> None:
        """At a clean stop: the row goes, so `status` stops listing this replica at once."""
        try:
            await registry.leave(self._store, self._entry)
        except PgcrondError as exc:
            log.warning("registry_write_failed", operation="leave", error=str(exc))

    async def _touch(self) -> None:
        touched = await registry.touch(self._store, self._entry)
        self._metrics.config_drift.set(max(0, touched.hashes - 1))
        self._spread.members(touched.live)
