"""Spread: which live replica a tick's run prefers, learned from the claims themselves.

Without it the first replica to insert wins every co-firing job of a tick
(their claims share one statement), so one replica carries every busy tick.
With it, a stable hash of (job, run key, replica) ranks the replicas this one
has seen recently (rendezvous hashing: every replica that knows the same set
ranks alike, and a replica that goes away moves only its own share). The
preferred replica claims at once; the others hold their claim back by
``delay`` and send it then, all in one statement, so a tick whose preferred
replica is dead runs ``delay`` late and not later.

Nothing is sent to learn who lives: the replica registry's touch (the one
statement a replica sends a minute, at start too) names the live replicas,
so a tick is shared from the first one after start, hourly and daily jobs
too; and a claim refused because another replica holds the row names that
replica (the claim's answer carries the row's owner), which a replica not
named for ``forget_after`` is dropped from. A replica that knows no peer
claims everything at once, as without spread. The claim
statement stays the one-winner guarantee: a wrong or stale view costs only
balance, never a duplicate or a lost tick.
"""

from __future__ import annotations

import asyncio
import hashlib
import time
from collections.abc import Callable, Iterable
from datetime import datetime, timedelta

from pgcrond.core.keys import Identity

# A peer named by no refused claim for this long is no longer ranked.
FORGET_AFTER = timedelta(minutes=10)


class Spread:
    """One replica's view of its peers, and how long to hold back a claim."""

    def __init__(
        self,
        me: str,
        delay: timedelta,
        *,
        forget_after: timedelta = FORGET_AFTER,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.me = me
        self.delay = delay
        self._forget_after = forget_after.total_seconds()
        self._clock = clock
        self._seen: dict[str, float] = {}
        # The live replicas the registry last named (a replica gone from it
        # leaves at the next touch).
        self._members: frozenset[str] = frozenset()
        # One timer per tick: the held-back claims of co-firing jobs wake in the
        # same loop turn, so they still share one claim statement.
        self._gates: dict[datetime, asyncio.Future[None]] = {}

    def saw(self, owner: str | None) -> None:
        """A claim of a current tick was refused because ``owner`` holds it."""
        if owner is not None and owner != self.me and self.delay > timedelta(0):
            self._seen[owner] = self._clock()

    def members(self, live: Iterable[str]) -> None:
        """The registry named these replicas live (this one among them, or not)."""
        if self.delay > timedelta(0):
            self._members = frozenset(live) - {self.me}

    def peers(self) -> list[str]:
        """The other live replicas: the registry's, and those seen within ``forget_after``."""
        cutoff = self._clock() - self._forget_after
        for owner in [o for o, at in self._seen.items() if at < cutoff]:
            del self._seen[owner]
        return sorted(self._members.union(self._seen))

    def preferred(self, identity: Identity) -> str:
        """The replica that claims ``identity`` first: the highest rendezvous score."""
        return max([self.me, *self.peers()], key=lambda owner: _score(identity, owner))

    async def hold_back(self, identity: Identity, tick: datetime) -> None:
        """Return at once unless another replica is preferred; else ``delay`` from now.

        Every claim of the same tick held back meanwhile wakes with the first.
        """
        if not (self._seen or self._members) or self.preferred(identity) == self.me:
            return
        gate = self._gates.get(tick)
        if gate is None:
            loop = asyncio.get_running_loop()
            gate = self._gates[tick] = loop.create_future()
            loop.call_later(self.delay.total_seconds(), self._open, tick, gate)
        await asyncio.shield(gate)

    def _open(self, tick: datetime, gate: asyncio.Future[None]) -> None:
        del self._gates[tick]
        gate.set_result(None)


def _score(identity: Identity, owner: str) -> bytes:
    text = f"{identity.code}\0{identity.run_key}\0{owner}".encode()
    return hashlib.blake2b(text, digest_size=8).digest()
