"""Deferred fires: the ticks another live replica is preferred for, looked at in batches.

Every replica fires every tick, and spread names one live replica as each
tick's preferred one. Where this replica is not it (``Guard.defers``), a fire
costs it one entry in a list. Once the tick's hold-back is over (the spread's
``delay`` after the tick, on the replica's wheel: the time the preferred
replicas have to claim), one read of the tick's entries (``Guard.standings``,
in the transaction of this replica's outcomes of the tick: ``Guard.look_due``)
says where each stands:

* **settled** (SUCCESS, MISSED, SKIPPED, FAIL for good): nothing more to do
  here;
* **no row** (the preferred replica is dead, or slower than the hold-back):
  claimed, with the look's other such ticks (``Firing.fire_tick``); the
  claim decides, inside the tick's misfire window. So is every tick of a
  look the database did not answer: the fire rides out the outage as every
  fire does;
* **a row a claim could take now** (a RUNNING row whose lease lapsed, a FAIL
  row due for its retry): fired as a started tick, with no misfire bound (a
  started tick is followed to its end): a takeover, or the retry;
* **a row a claim could take later** (a live lease, a retry not yet due):
  put back on the wheel for then, with every other tick of the look due in
  the same grid slot, and looked at again together, in one read.

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
import math
from collections.abc import Callable, Coroutine, Sequence
from dataclasses import dataclass, replace
from datetime import UTC, datetime, timedelta
from typing import Any

import structlog

from pgcrond.core.keys import Identity
from pgcrond.core.wheel import GRID_S, PER_TURN, wheel
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
        fire_tick: Callable[[list[Fire]], None],
        spawn: Callable[[Coroutine[Any, Any, None]], object],
        delay: Callable[[], timedelta],
    ) -> None:
        """``fire_tick`` claims fires together; ``delay``: the spread's hold-back now."""
        self._firing = firing
        self._fire_tick = fire_tick
        self._spawn = spawn
        self._delay = delay
        # Fires of a tick waiting for its hold-back, by tick.
        self._ticks: dict[datetime, list[_Deferred]] = {}

    def offer(self, fire: Fire) -> bool:
        """Take a scheduled tick's fire if its guard defers it here; False: fire it as usual."""
        guard = self._firing.guards(fire.job)
        if not guard.defers(fire.identity):
            return False
        waiting = self._ticks.get(fire.tick)
        if waiting is None:
            waiting = self._ticks[fire.tick] = []
            # The hold-back counts from the tick itself (fired ahead of it, a
            # tick's preferred replica starts its run at the tick).
            ahead = max((fire.tick - datetime.now(UTC)).total_seconds(), 0.0)
            held = ahead + self._delay().total_seconds()
            wheel().call_later(held, functools.partial(self._held, fire.tick))
            # The look is due as this replica's own runs of the tick end: told
            # of it, the guard sends their outcomes with it.
            guard.look_due(asyncio.get_running_loop().time() + wheel().on_grid(held))
        waiting.append(_Deferred(fire, guard))
        return True

    def follow(self, fires: list[Fire]) -> None:
        """Follow started ticks (other replicas' open ticks, found at start) by looks.

        Looked at now, all in one read, then as any look's ticks: claimed
        once a claim could take them (a lapsed lease, a retry due), looked at
        again while held, left once settled: a claim each only where one
        could win.
        """
        self._look_soon([_Deferred(fire, self._firing.guards(fire.job)) for fire in fires])

    def _held(self, tick: datetime) -> None:
        self._look_soon(self._ticks.pop(tick, []))

    def _look_soon(self, deferred: Sequence[_Deferred]) -> None:
        if deferred and not self._firing.stopping.is_set():
            self._spawn(self._look(deferred))

    async def _look(self, deferred: Sequence[_Deferred]) -> None:
        """Read where each tick stands, a statement per guard, then act on each, a chunk
        of :data:`~pgcrond.core.wheel.PER_TURN` ticks a turn of the wheel."""
        # By identity: a guard need not be hashable (a dataclass is not).
        by_guard: dict[int, tuple[Guard, list[_Deferred]]] = {}
        for entry in deferred:
            by_guard.setdefault(id(entry.guard), (entry.guard, []))[1].append(entry)
        for guard, entries in by_guard.values():
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
            for start in range(0, len(entries), PER_TURN):
                chunk = entries[start : start + PER_TURN]
                await wheel().turn(len(chunk))
                if self._firing.stopping.is_set():
                    return  # the replica stops: no fire starts from a look any more
                self._act(chunk, standings)

    def _act(self, entries: list[_Deferred], standings: dict[Identity, Standing] | None) -> None:
        """Claim, follow or leave each tick of one look."""
        firing = self._firing
        fired: list[Fire] = []
        # Followed ticks by the grid slot they are due in: one wake-up, one look each.
        later: dict[int, list[_Deferred]] = {}
        now = asyncio.get_running_loop().time()
        for entry in entries:
            fire = entry.fire
            standing = None if standings is None else standings.get(fire.identity)
            if firing.in_flight(fire.identity):
                continue  # fired here already (a request, catch-up): that fire follows it
            if standing is None or (not standing.settled and _due(standing)):
                # A tick seen started is followed to its end; one never seen is
                # claimed inside its misfire window.
                fired.append(replace(fire, started=fire.started or standing is not None))
                continue
            if not fire.started:
                # What the fire would have said had it claimed and lost.
                firing.events.fired(fire.job)
                firing.events.claim_lost(fire.job, _reason(standing))
            if standing.settled:
                continue
            when = now + ((standing.wait or timedelta(0)) + FOLLOW_MARGIN).total_seconds()
            followed = replace(entry, fire=replace(fire, started=True))
            later.setdefault(math.ceil(when / GRID_S), []).append(followed)
        for slot, due in later.items():
            wheel().call_at(slot * GRID_S, functools.partial(self._look_soon, due))
        if fired:
            self._fire_tick(fired)
        log.debug(
            "deferred_looked",
            ticks=len(entries),
            fired=len(fired),
            followed=sum(map(len, later.values())),
        )


def _due(standing: Standing) -> bool:
    return standing.wait is None or standing.wait <= timedelta(0)


def _reason(standing: Standing) -> str:
    """The claim's refusal reason for a row in this standing (pgcrond.storage.claim_answers)."""
    if standing.status == "RUNNING":
        return "held"
    if standing.status == "FAIL":
        return "failed" if standing.settled else "retry_pending"
    return "done"
