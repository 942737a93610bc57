"""The database's clock as this replica can bound it from below: by its tightest answer.

A run whose claim was won ahead of its tick is held until the database's
clock has surely reached the tick (:mod:`pgcrond.guard.lease`). An answer
that carries the database's clock (``clock_timestamp()``, read inside a claim
or a heartbeat statement) bounds it from below from the answer's arrival on:
the clock read at least ``db_now`` then, and has moved on since by as much as
this replica's monotonic clock has, give or take their rates. How far below
the truth depends on the answer's *lag*, the time from the read to the
arrival (the rest of the statement, its commit, the trip back, the loop's
turn before the answer is read): 1.4-5.5 ms for the claims of a 50-job tick on
three replicas on a shared 2-core machine, once in a while 50 ms.
Counted from each tick's own claim answer, every run started that answer's
lag after its tick; :class:`ClockFloor` keeps the tightest bound of the recent
answers instead, so one slow answer does not make its tick late.

An older answer bounds the clock less each second by the most the two
clocks' rates may differ (:data:`RATE_MARGIN`), so a fresher answer wins as
soon as it is tighter by then. Answers older than :data:`MAX_AGE_S` are not
used: behind the same address a failover may put a server with another clock.
A database clock stepped back (not slewed) falls behind its bound by the
step while answers from before the step are used (at most that long): a run
may then start up to the step before its tick by the stepped clock, as it
could, for the claim ahead's tenth of a second, when only the claim's own
answer counted.
"""

from __future__ import annotations

import math
import time
from datetime import UTC, datetime

# How much slower than this replica's monotonic clock the database's may run:
# twice the fastest slew NTP daemons apply by default (ntpd's 500 ppm), for a
# slew on each side.
RATE_MARGIN = 1e-3
MAX_AGE_S = 10.0


class ClockFloor:
    """The best lower bound of the database's clock from the answers it was shown (``saw``)."""

    __slots__ = ("_at", "_base")

    def __init__(self) -> None:
        # The bound is _base + (1 - RATE_MARGIN) * monotonic: one number per
        # answer, and the largest is the tightest bound at every later instant.
        self._base = -math.inf
        self._at = -math.inf  # monotonic arrival of the answer that set _base

    def saw(self, db_now: datetime, received_at: float) -> None:
        """An answer read ``db_now`` from the database and arrived at monotonic ``received_at``."""
        base = db_now.timestamp() - (1 - RATE_MARGIN) * received_at
        # An anchor half MAX_AGE_S old gives way to any newer answer, so that
        # a recent one is at hand when the anchor is too old to use.
        if base > self._base or received_at - self._at > MAX_AGE_S / 2:
            self._base, self._at = base, received_at

    def now_at_least(self, now: float | None = None) -> datetime | None:
        """A lower bound of the database's clock at monotonic ``now``; None: no recent answer."""
        if now is None:
            now = time.monotonic()
        if now - self._at > MAX_AGE_S:
            return None
        return datetime.fromtimestamp(self._base + (1 - RATE_MARGIN) * now, UTC)

    def reaches(self, instant: datetime, now: float | None = None) -> float | None:
        """The monotonic time from which the bound is at ``instant`` or past it.

        What a run held for its fire time waits for: by then the database's
        clock has surely reached it, however much slower than this replica's
        it may run. None: no recent answer at monotonic ``now``.
        """
        if now is None:
            now = time.monotonic()
        floor = self.now_at_least(now)
        if floor is None:
            return None
        return now + (instant - floor).total_seconds() / (1 - RATE_MARGIN)
