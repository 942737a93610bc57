"""Deferred fires: the ticks another live replica is preferred for, looked at in batches.

Every replica fires every tick, and spread names one live replica as each
tick's preferred one. Where this replica is not it (``Guard.defers``), a fire
costs it one entry in a list. Once the tick's hold-back is over
(``Guard.held_back``: the time the preferred replicas have to claim), one
read of the tick's entries (``Guard.standings``) says where each stands, and
each is acted on a share a loop turn on the replica's wheel
(:mod:`pgcrond.core.wheel`):

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
  put back on the wheel for then, and looked at again with every other tick
  it wakes in the same turn, in one read.

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
import functools
from collections import Counter
from collections.abc import Callable, Coroutine
from dataclasses import dataclass, field, replace
from datetime import datetime, timedelta
from typing import Any

import structlog

from pgcrond.core.keys import Identity
from pgcrond.core.wheel import wheel
from pgcrond.decide import FOLLOW_MARGIN
from pgcrond.errors import PgcrondError
from pgcrond.fire import Fire, Firing
from pgcrond.guard.base import Guard
from pgcrond.storage.claims import Standing

log = structlog.get_logger("pgcrond.deferral")


@dataclass(frozen=True, slots=True)
class _Deferred:
    fire: Fire
    guard: Guard


class Deferral:
    """One replica's deferred fires: taken at fire time, looked at in batches."""

    def __init__(
        self,
        firing: Firing,
        spawn_fire: Callable[[Fire], None],
        spawn: Callable[[Coroutine[Any, Any, None]], object],
    ) -> None:
        self._firing = firing
        self._spawn_fire = spawn_fire
        self._spawn = spawn
        # Fires of a tick waiting for its hold-back, by tick.
        self._ticks: dict[datetime, list[_Deferred]] = {}
        # Ticks on the wheel until their next look, and those it woke this turn.
        self._waiting = 0
        self._woken: list[_Deferred] = []

    def __len__(self) -> int:
        """Ticks deferred or followed here now."""
        return sum(map(len, self._ticks.values())) + self._waiting + len(self._woken)

    def offer(self, fire: Fire) -> bool:
        """Take a scheduled tick's fire if its guard defers it here; False: fire it as usual."""
        guard = self._firing.guards(fire.job)
        if not guard.defers(fire.identity):
            return False
        waiting = self._ticks.get(fire.tick)
        if waiting is None:
            waiting = self._ticks[fire.tick] = []
            self._spawn(self._after_hold_back(guard, fire.tick))
        waiting.append(_Deferred(fire, guard))
        return True

    async def _after_hold_back(self, guard: Guard, tick: datetime) -> None:
        await guard.held_back(tick)
        await self._look(self._ticks.pop(tick, []))

    def _follow(self, entry: _Deferred, wait: timedelta) -> None:
        """Look at a tick running elsewhere again once a claim could take it."""
        self._look_at(
            entry, asyncio.get_running_loop().time() + (wait + FOLLOW_MARGIN).total_seconds()
        )

    def _look_at(self, entry: _Deferred, when: float) -> None:
        self._waiting += 1
        wheel().call_at(when, functools.partial(self._due, entry))

    def _due(self, entry: _Deferred) -> None:
        """The wheel woke ``entry``: looked at with every other it wakes this turn."""
        self._waiting -= 1
        if not self._woken:
            asyncio.get_running_loop().call_soon(self._look_woken)
        self._woken.append(entry)

    def _look_woken(self) -> None:
        woken, self._woken = self._woken, []
        self._spawn(self._look(woken))

    async def _look(self, deferred: list[_Deferred]) -> None:
        """Read where each tick stands, a statement per guard, then act on each."""
        # By identity: a guard need not be hashable (a dataclass is not).
        by_guard: dict[int, tuple[Guard, list[_Deferred]]] = {}
        for entry in deferred:
            by_guard.setdefault(id(entry.guard), (entry.guard, []))[1].append(entry)
        for guard, entries in by_guard.values():
            if self._firing.stopping.is_set():
                return
            standings: dict[Identity, Standing] | None
            try:
                standings = await guard.standings([entry.fire.identity for entry in entries])
            except PgcrondError as exc:
                log.warning("deferred_look_failed", ticks=len(entries), error=str(exc))
                standings = None
            except Exception as exc:
                # A bug, not an outage: still no tick may be dropped here.
                log.exception(
                    "deferred_look_failed",
                    ticks=len(entries),
                    error=f"{type(exc).__name__}: {exc}",
                )
                standings = None
            # Acted on a share a loop turn, on the wheel: each fired tick is a
            # task and a claim, and a tick's thousands at once would hold the loop.
            tally = _Tally(len(entries))
            for entry in entries:
                standing = None if standings is None else standings.get(entry.fire.identity)
                wheel().call_soon(functools.partial(self._act_counted, tally, entry, standing))

    def _act_counted(self, tally: _Tally, entry: _Deferred, standing: Standing | None) -> None:
        if self._firing.stopping.is_set():
            return  # the replica stops: no fire starts from a look any more
        tally.acted[self._act(entry, standing)] += 1
        if sum(tally.acted.values()) == tally.ticks:
            fired, followed = tally.acted["fired"], tally.acted["followed"]
            log.debug(
                "deferred_looked",
                ticks=tally.ticks,
                fired=fired,
                followed=followed,
                settled=tally.ticks - fired - followed,
            )

    def _act(self, entry: _Deferred, standing: Standing | None) -> str:
        """Fire, follow or leave one tick; says which."""
        firing, fire = self._firing, entry.fire
        if firing.in_flight(fire.identity):
            return "left"  # fired here already (a request, catch-up): that fire follows it
        if standing is None or (not standing.settled and _due(standing)):
            # A tick seen started is followed to its end; one never seen is
            # claimed inside its misfire window.
            started = fire.started or standing is not None
            self._spawn_fire(replace(fire, started=started, claim_at_once=True))
            return "fired"
        if not fire.started:
            # What the fire would have said had it claimed and lost.
            firing.events.fired(fire.job)
            firing.events.claim_lost(fire.job, _reason(standing))
        if standing.settled:
            return "left"
        self._follow(
            replace(entry, fire=replace(fire, started=True)), standing.wait or timedelta(0)
        )
        return "followed"


@dataclass
class _Tally:
    """What one look's ticks came to, said once the last of them was acted on."""

    ticks: int
    acted: Counter[str] = field(default_factory=Counter)


def _due(standing: Standing) -> bool:
    return standing.wait is None or standing.wait <= timedelta(0)


def _reason(standing: Standing) -> str:
    """The claim's refusal reason for a row in this standing (pgcrond.storage.claim_answers)."""
    if standing.status == "RUNNING":
        return "held"
    if standing.status == "FAIL":
        return "failed" if standing.settled else "retry_pending"
    return "done"
