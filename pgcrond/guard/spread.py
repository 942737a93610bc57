"""Spread: which live replica a tick's run prefers, learned from the claims themselves.

Without it the first replica to insert wins every co-firing job of a tick
(their claims share one statement), so one replica carries every busy tick.
With it, a stable hash of (job, run key, replica) ranks the replicas this one
has seen recently (rendezvous hashing: every replica that knows the same set
ranks alike, and a replica that goes away moves only its own share). The
preferred replica claims at once; the others hold their claim back by
``delay`` and send it then, all in one statement, so a tick whose preferred
replica is dead runs ``delay`` late and not later. (The daemon's scheduled
ticks do not even claim then: :mod:`pgcrond.deferral` first reads where they
stand, and claims only those with no row or a lapsed one.)

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
import functools
import hashlib
import math
import time
from collections.abc import Callable, Iterable
from datetime import UTC, datetime, timedelta

from pgcrond.core.keys import Identity
from pgcrond.core.wheel import wheel

# A peer named by no refused claim for this long is no longer ranked.
FORGET_AFTER = timedelta(minutes=10)
_PURGE_EVERY_S = 1.0


class Spread:
    """One replica's view of its peers, and how long to hold back a claim."""

    def __init__(
        self,
        me: str,
        delay: timedelta,
        *,
        forget_after: timedelta = FORGET_AFTER,
        clock: Callable[[], float] = time.monotonic,
        wall: Callable[[], datetime] = lambda: datetime.now(UTC),
    ) -> None:
        self.me = me
        self.delay = delay
        self._forget_after = forget_after.total_seconds()
        self._clock = clock
        self._wall = wall
        self._seen: dict[str, float] = {}
        # The live replicas the registry last named (a replica gone from it
        # leaves at the next touch).
        self._members: frozenset[str] = frozenset()
        # One gate per tick, opened from the wheel: the held-back claims of
        # co-firing jobs wake in the same loop turn, so they share one statement.
        self._gates: dict[datetime, asyncio.Future[None]] = {}
        # Claims of a tick this replica sent at once and has no answer to yet.
        self._own: dict[datetime, int] = {}
        # Gates whose delay is over but which wait for this replica's own claims.
        self._due: set[datetime] = set()
        # _ranked(), kept until the set changes: asked on every fire.
        self._peers: list[str] | None = None
        self._purged_at = -math.inf

    def saw(self, owner: str | None) -> None:
        """A claim of a current tick was refused because ``owner`` holds it."""
        if owner is not None and owner != self.me and self.delay > timedelta(0):
            if owner not in self._seen:
                self._peers = None
            self._seen[owner] = self._clock()

    def members(self, live: Iterable[str]) -> None:
        """The registry named these replicas live (this one among them, or not)."""
        if self.delay > timedelta(0):
            self._members = frozenset(live) - {self.me}
            self._peers = None

    def peers(self) -> list[str]:
        """The other live replicas: the registry's, and those seen within ``forget_after``."""
        return self._ranked()[1:]

    def _ranked(self) -> list[str]:
        """This replica, then its peers sorted: the candidates of every preference."""
        now = self._clock()
        # Forgetting is a matter of minutes: looked for once a second, not per fire.
        if now - self._purged_at >= _PURGE_EVERY_S:
            self._purged_at = now
            cutoff = now - self._forget_after
            for owner in [o for o, at in self._seen.items() if at < cutoff]:
                del self._seen[owner]
                self._peers = None
        if self._peers is None:
            self._peers = [self.me, *sorted(self._members.union(self._seen))]
        return self._peers

    def preferred(self, identity: Identity) -> str:
        """The replica that claims ``identity`` first: the highest rendezvous score."""
        return max(self._ranked(), key=lambda owner: _score(identity, owner))

    async def hold_back(self, identity: Identity, tick: datetime) -> bool:
        """Return at once if this replica is preferred (True); else False, ``delay`` on.

        The delay counts from the latest of the tick, the first held-back
        claim and the answer to the last claim of the tick this replica sent
        at once: every replica does the same work at a tick, so by then the
        preferred ones (as loaded as this one) have sent theirs, however long
        a tick of thousands of jobs takes to hand on. Every claim of the same
        tick held back meanwhile wakes with the first. A True return obliges
        the caller to say :meth:`answered` once the claim's answer came (or
        failed).
        """
        if not self.defers(identity):
            self._own[tick] = self._own.get(tick, 0) + 1
            return True
        await self.held_back(tick)
        return False

    def defers(self, identity: Identity) -> bool:
        """Whether another replica this one knows is preferred for ``identity``."""
        return bool(self._seen or self._members) and self.preferred(identity) != self.me

    async def held_back(self, tick: datetime) -> None:
        """Until the hold-back of ``tick`` is over (see :meth:`hold_back`)."""
        gate = self._gates.get(tick)
        if gate is None:
            gate = self._gates[tick] = asyncio.get_running_loop().create_future()
            wheel().call_later(self._delay_from(tick), functools.partial(self._delay_over, tick))
        await asyncio.shield(gate)

    def answered(self, tick: datetime) -> None:
        """A claim of ``tick`` that :meth:`hold_back` let go at once was answered."""
        left = self._own.get(tick, 0) - 1
        if left > 0:
            self._own[tick] = left
            return
        self._own.pop(tick, None)
        if tick in self._due:
            self._due.discard(tick)
            wheel().call_later(self._delay_from(tick), functools.partial(self._open, tick))

    def _delay_from(self, tick: datetime) -> float:
        """Seconds from now to ``delay`` past the later of now and ``tick`` itself.

        Ticks are fired a little ahead of them (claims won ahead are run at
        the tick): the preferred replica's run starts at the tick, so a
        hold-back shorter than that would find it not done and look again
        later, one more read.
        """
        return self.delay.total_seconds() + max((tick - self._wall()).total_seconds(), 0.0)

    def _delay_over(self, tick: datetime) -> None:
        if self._own.get(tick):
            self._due.add(tick)  # opened by the last answer, a delay later
            return
        self._open(tick)

    def _open(self, tick: datetime) -> None:
        gate = self._gates.pop(tick, None)
        if gate is not None and not gate.done():
            gate.set_result(None)


def _score(identity: Identity, owner: str) -> bytes:
    text = f"{identity.code}\0{identity.run_key}\0{owner}".encode()
    return hashlib.blake2b(text, digest_size=8).digest()
