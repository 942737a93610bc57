"""At start, the ticks other replicas started and nobody finished: followed here."""

from __future__ import annotations

from collections.abc import Callable
from datetime import timedelta

import structlog

from pgcrond.catchup import covered
from pgcrond.config.models import Config
from pgcrond.core.jitter import fire_time
from pgcrond.core.keys import Identity
from pgcrond.core.schedule import tick_of
from pgcrond.errors import PgcrondError
from pgcrond.fire import Fire
from pgcrond.storage.history import open_ticks
from pgcrond.storage.leases import LeaseStore

log = structlog.get_logger("pgcrond.daemon.resume")

# How far back a starting replica looks for ticks left open (bounded by the
# query's LIMIT too): retries are followed past the misfire window.
RESUME_WITHIN = timedelta(hours=24)


async def resume_open_ticks(
    store: LeaseStore,
    config: Callable[[], Config],
    follow: Callable[[list[Fire]], None],
) -> None:
    """Follow the ticks other replicas started and nobody finished (one query, at start).

    A started tick is followed until it is done: a retry whose scheduler
    died, or a takeover of an owner that died with it, is then taken by
    this replica if nobody else does. ``follow``: follows the started
    ticks, together.
    """
    jobs = {code: job for code, job in config().jobs.items() if covered(job)}
    if not jobs:
        return
    try:
        ticks = await open_ticks(store, list(jobs), within=RESUME_WITHIN)
    except PgcrondError as exc:
        log.warning("resume_failed", error=str(exc))
        return
    started: list[Fire] = []
    for open_tick in ticks:
        job, tick = jobs[open_tick.code], tick_of(open_tick.run_key)
        if tick is not None:
            tick = fire_time(job.code, tick, job.jitter)  # its window starts there
        if tick is None:
            continue  # a manual run: its caller follows it
        log.info("tick_resumed", job=job.code, run_key=open_tick.run_key, status=open_tick.status)
        identity = Identity.schedule(job.code, open_tick.run_key, open_tick.key_code)
        started.append(Fire(job, tick, identity, started=True))
    if started:
        follow(started)
