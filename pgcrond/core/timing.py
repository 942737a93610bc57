"""Lease timing rules, shared by the config loader and the lease store.

The rules come from the reference design this project is compatible with: a
lease must be longer than 2 ms and fit a JavaScript safe integer of
milliseconds; a heartbeat is off (0) or renews at least twice per lease, so
that one lost heartbeat never lets a live run's lease expire.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from datetime import timedelta

from pgcrond.errors import ValidationError

MAX_SAFE_INTEGER = 2**53 - 1
DEFAULT_LEASE = timedelta(minutes=15)
MAX_DEFAULT_HEARTBEAT = timedelta(seconds=60)
MIN_LEASE = timedelta(milliseconds=2)
MAX_STOP_GRACE = timedelta(seconds=10)
MAX_STOP_MARGIN = timedelta(seconds=1)


def to_ms(value: timedelta) -> int:
    return round(value.total_seconds() * 1000)


@dataclass(frozen=True)
class LeaseTiming:
    """A validated (lease, heartbeat) pair; heartbeat zero means off.

    One per job, shared by all its runs: what is derived from it is computed
    once (``cached_property`` keeps it in the instance's dict, past the
    frozen dataclass's ``__setattr__``), not per run.
    """

    lease: timedelta = DEFAULT_LEASE
    heartbeat: timedelta = timedelta(seconds=60)

    @classmethod
    def build(
        cls, lease: timedelta | None = None, heartbeat: timedelta | None = None
    ) -> LeaseTiming:
        """Validate, filling the defaults: lease 15 min, heartbeat min(60 s, lease/3)."""
        lease = DEFAULT_LEASE if lease is None else lease
        lease_ms = to_ms(lease)
        if lease <= MIN_LEASE:
            raise ValidationError("lease", f"must be longer than 2ms, got {lease_ms}ms")
        if lease_ms > MAX_SAFE_INTEGER:
            raise ValidationError("lease", f"must be at most {MAX_SAFE_INTEGER}ms")
        if heartbeat is None:
            heartbeat = min(MAX_DEFAULT_HEARTBEAT, lease / 3)
        heartbeat_ms = to_ms(heartbeat)
        if heartbeat_ms < 0:
            raise ValidationError("heartbeat", "must not be negative (0 turns heartbeats off)")
        if heartbeat_ms != 0 and heartbeat_ms * 2 >= lease_ms:
            raise ValidationError(
                "heartbeat",
                f"must be 0 (off) or below lease/2 ({lease_ms / 2:g}ms), got {heartbeat_ms}ms",
            )
        return cls(lease=lease, heartbeat=heartbeat)

    @property
    def lease_ms(self) -> int:
        return to_ms(self.lease)

    @functools.cached_property
    def stop_grace(self) -> timedelta:
        """SIGTERM-to-SIGKILL grace of a run under this lease: 10 s, or lease/4 if shorter.

        A run whose lease is going is stopped this long before the lease could
        expire, so it is over before another replica may take the tick over.
        """
        return min(MAX_STOP_GRACE, self.lease / 4)

    @functools.cached_property
    def stop_margin(self) -> timedelta:
        """Slack after the stop sequence, before the lease could expire: 1 s, or lease/10.

        It absorbs what the grace does not: event-loop lag, the child's exit
        and reaping, the heartbeat answer's age.
        """
        return min(MAX_STOP_MARGIN, self.lease / 10)

    @functools.cached_property
    def stop_budget(self) -> timedelta:
        """How long before the lease could expire a run is told to stop."""
        return self.stop_grace + self.stop_margin
