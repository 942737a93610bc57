"""Deferred fires: the ticks another live replica is preferred for, looked at in batches.

Every replica fires every tick, and spread names one live replica as each
tick's preferred one. Where this replica is not it (``Guard.defers``), a fire
costs it one entry in a list. Once the tick's hold-back is over
(``Guard.held_back``: the time the preferred replicas have to claim), one
read per ``CHUNK`` of those entries (``Guard.standings``) says where each
tick stands:

* **settled** (SUCCESS, MISSED, SKIPPED, FAIL for good): nothing more to do
  here;
* **no row** (the preferred replica is dead, or slower than the hold-back):
  fired as usual, its hold-back over; the claim decides, inside the tick's
  misfire window. So is every tick of a look the database did not answer:
  the fire rides out the outage as every fire does;
* **a row a claim could take now** (a RUNNING row whose lease lapsed, a FAIL
  row due for its retry): fired as a started tick, with no misfire bound (a
  started tick is followed to its end): a takeover, or the retry;
* **a row a claim could take later** (a live lease, a retry not yet due):
  looked at again then, with every other tick due for a look in the same
  slot of a shared grid, in one read.

So a co-firing tick costs a replica per-job work (a task, a claim, a run, a
record) only for the ticks it runs or must take over; the rest is one entry,
one row of a read after the hold-back, and while the tick runs elsewhere one
row of a read per look: no task, timer or claim of its own. The claim stays
the one-winner guarantee (a look only decides whether to claim): a stale look
costs a refused claim, never a duplicate, and every tick not settled is
claimed or looked at again, so none is lost while this replica lives.
"""

from __future__ import annotations

import asyncio
import math
from collections.abc import Callable, Coroutine
from dataclasses import dataclass, replace
from datetime import datetime, timedelta
from typing import Any, Protocol

import structlog

from pgcrond.config.models import JobConfig
from pgcrond.core.keys import Identity
from pgcrond.errors import PgcrondError
from pgcrond.fire import Firing
from pgcrond.guard.base import Guard
from pgcrond.storage.claims import Standing

log = structlog.get_logger("pgcrond.deferral")

# Ticks per read: a statement of a few ms, answered in a few loop turns.
CHUNK = 1000
# Ticks of a read acted on per loop turn: a turn stays a few ms.
ACT_SLICE = 100
# Looks wake together on a grid of the loop's clock (as followers in
# pgcrond.fire do), a little after the lease or retry time they wait for.
GRID_S = 0.25
MARGIN = timedelta(milliseconds=100)


class SpawnFire(Protocol):
    """How a deferred tick that needs a claim is fired (the daemon's ``_spawn_fire``)."""

    def __call__(
        self,
        job: JobConfig,
        tick: datetime,
        identity: Identity,
        *,
        started: bool = False,
        superseded_at: datetime | None = None,
        held_back: bool = False,
    ) -> None: ...


@dataclass(frozen=True, slots=True)
class _Deferred:
    job: JobConfig
    guard: Guard
    tick: datetime
    identity: Identity
    superseded_at: datetime | None
    # A look found a row: the tick started, and is followed without a misfire bound.
    started: bool = False


class Deferral:
    """One replica's deferred fires: taken at fire time, looked at in batches."""

    def __init__(
        self,
        firing: Firing,
        spawn_fire: SpawnFire,
        spawn: Callable[[Coroutine[Any, Any, None]], object],
    ) -> None:
        self._firing = firing
        self._spawn_fire = spawn_fire
        self._spawn = spawn
        # Fires of a tick waiting for its hold-back, by tick.
        self._ticks: dict[datetime, list[_Deferred]] = {}
        # Ticks running elsewhere, by the grid slot of their next look.
        self._slots: dict[float, list[_Deferred]] = {}

    def __len__(self) -> int:
        """Ticks deferred or followed here now."""
        return sum(map(len, self._ticks.values())) + sum(map(len, self._slots.values()))

    def offer(
        self, job: JobConfig, tick: datetime, identity: Identity, superseded_at: datetime | None
    ) -> bool:
        """Take a scheduled tick's fire if its guard defers it here; False: fire it as usual."""
        guard = self._firing.guards(job)
        if not guard.defers(identity):
            return False
        waiting = self._ticks.get(tick)
        if waiting is None:
            waiting = self._ticks[tick] = []
            self._spawn(self._after_hold_back(guard, tick))
        waiting.append(_Deferred(job, guard, tick, identity, superseded_at))
        return True

    async def _after_hold_back(self, guard: Guard, tick: datetime) -> None:
        await guard.held_back(tick)
        await self._look(self._ticks.pop(tick, []))

    def _ring(self, slot: float) -> None:
        self._spawn(self._look(self._slots.pop(slot, [])))

    async def _look(self, deferred: list[_Deferred]) -> None:
        """Read where each tick stands, a chunk per statement, and act on it."""
        # By identity: a guard need not be hashable (a dataclass is not).
        by_guard: dict[int, tuple[Guard, list[_Deferred]]] = {}
        for entry in deferred:
            by_guard.setdefault(id(entry.guard), (entry.guard, []))[1].append(entry)
        for guard, entries in by_guard.values():
            for start in range(0, len(entries), CHUNK):
                if self._firing.stopping.is_set():
                    return
                chunk = entries[start : start + CHUNK]
                standings: dict[Identity, Standing] | None
                try:
                    standings = await guard.standings([entry.identity for entry in chunk])
                except PgcrondError as exc:
                    log.warning("deferred_look_failed", ticks=len(chunk), error=str(exc))
                    standings = None
                except Exception as exc:
                    # A bug, not an outage: still no tick may be dropped here.
                    log.exception(
                        "deferred_look_failed",
                        ticks=len(chunk),
                        error=f"{type(exc).__name__}: {exc}",
                    )
                    standings = None
                fired = followed = 0
                for n, entry in enumerate(chunk):
                    if n and n % ACT_SLICE == 0:
                        # A thousand ticks acted on in one step held the loop 25-30 ms.
                        await asyncio.sleep(0)
                        if self._firing.stopping.is_set():
                            return
                    acted = self._act(
                        entry, None if standings is None else standings.get(entry.identity)
                    )
                    fired += acted == "fired"
                    followed += acted == "followed"
                log.debug(
                    "deferred_looked",
                    ticks=len(chunk),
                    fired=fired,
                    followed=followed,
                    settled=len(chunk) - fired - followed,
                )

    def _act(self, entry: _Deferred, standing: Standing | None) -> str:
        """Fire, follow or leave one tick; says which."""
        firing = self._firing
        if firing.in_flight(entry.identity):
            return "left"  # fired here already (a request, catch-up): that fire follows it
        if standing is None or (not standing.settled and _due(standing)):
            self._spawn_fire(
                entry.job,
                entry.tick,
                entry.identity,
                # A tick seen started is followed to its end; one never seen
                # is claimed inside its misfire window.
                started=entry.started or standing is not None,
                superseded_at=entry.superseded_at,
                held_back=True,
            )
            return "fired"
        if not entry.started:
            # What the fire would have said had it claimed and lost.
            firing.events.fired(entry.job)
            firing.events.claim_lost(entry.job, _reason(standing))
        if standing.settled:
            return "left"
        self._follow(replace(entry, started=True), standing.wait or timedelta(0))
        return "followed"

    def _follow(self, entry: _Deferred, wait: timedelta) -> None:
        loop = asyncio.get_running_loop()
        due = loop.time() + (wait + MARGIN).total_seconds()
        slot = math.ceil(due / GRID_S) * GRID_S
        waiting = self._slots.get(slot)
        if waiting is None:
            waiting = self._slots[slot] = []
            loop.call_at(slot, self._ring, slot)
        waiting.append(entry)


def _due(standing: Standing) -> bool:
    return standing.wait is None or standing.wait <= timedelta(0)


def _reason(standing: Standing) -> str:
    """The claim's refusal reason for a row in this standing (pgcrond.storage.claim_answers)."""
    if standing.status == "RUNNING":
        return "held"
    if standing.status == "FAIL":
        return "failed" if standing.settled else "retry_pending"
    return "done"
