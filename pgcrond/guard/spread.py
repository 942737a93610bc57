"""Spread: which live replica a tick's run prefers, learned from the claims themselves.

Without it the first replica to insert wins every co-firing job of a tick
(their claims share one statement), so one replica carries every busy tick.
With it, a stable hash of (job, run key, replica) ranks the replicas this one
has seen recently (rendezvous hashing: every replica that knows the same set
ranks alike, and a replica that goes away moves only its own share). The
preferred replica claims at once; the others defer the tick
(:mod:`pgcrond.deferral`): ``delay`` after it they read where its fires
stand, in one statement, and claim only those with no row or a lapsed one,
so a tick whose preferred replica is dead runs ``delay`` late and not later.

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

import hashlib
import time
from collections.abc import Callable, Iterable
from datetime import timedelta

from pgcrond.core.keys import Identity

# A peer named by no refused claim for this long is no longer ranked.
FORGET_AFTER = timedelta(minutes=10)


class Spread:
    """One replica's view of its peers, and how long a deferred tick waits for the preferred one."""

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
        # _ranked(), kept until the set changes: asked on every fire.
        self._peers: list[str] | None = None

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
            self._forget()

    def peers(self) -> list[str]:
        """The other live replicas: the registry's, and those seen within ``forget_after``."""
        self._forget()
        return self._ranked()[1:]

    def _forget(self) -> None:
        """Drop the peers not seen for ``forget_after``: a matter of minutes, so
        looked for at the registry's touch (a minute), not on every fire."""
        cutoff = self._clock() - self._forget_after
        for owner in [o for o, at in self._seen.items() if at < cutoff]:
            del self._seen[owner]
            self._peers = None

    def _ranked(self) -> list[str]:
        """This replica, then its peers sorted: the candidates of every preference."""
        if self._peers is None:
            self._peers = [self.me, *sorted(self._members.union(self._seen))]
        return self._peers

    def preferred(self, identity: Identity) -> str:
        """The replica that claims ``identity`` first: the highest rendezvous score."""
        return max(self._ranked(), key=lambda owner: _score(identity, owner))

    def defers(self, identity: Identity) -> bool:
        """Whether another replica this one knows is preferred for ``identity``."""
        return bool(self._seen or self._members) and self.preferred(identity) != self.me


def _score(identity: Identity, owner: str) -> bytes:
    text = f"{identity.code}\0{identity.run_key}\0{owner}".encode()
    return hashlib.blake2b(text, digest_size=8).digest()
