"""What a claim and a heartbeat answer: a won claim (its lease), a lost one and why.

Plain values, apart from the lease store that makes them, so that what runs
with a lease (an sql: job's transaction, :mod:`pgcrond.storage.sqljob`) and the
store itself import them, and not each other.
"""

from __future__ import annotations

import time
import uuid
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Literal

from pgcrond.core.cancel import Cancellation
from pgcrond.core.keys import Identity
from pgcrond.core.timing import LeaseTiming

NotAcquiredReason = Literal[
    # Another replica holds a live claim (wait: until it could lapse).
    "held",
    # The identity is finished (SUCCESS or SKIPPED), or failed for good.
    "done",
    "failed",
    # A failure with a retry time (wait: until then).
    "retry_pending",
    # The job's overlap policy bounds its running ticks and the bound is
    # reached: a new tick is recorded SKIPPED/overlap (status SKIPPED); a
    # started tick's retry or takeover is blocked (status FAIL or RUNNING).
    "overlap",
    # A tick its overlap policy keeps waiting for the running one to end
    # (buffer_one; replace, while the replaced run stops): FAIL/waiting, due
    # whenever the job's slot is free, which any replica following it claims.
    "waiting",
    # The tick is not due yet by the database clock (wait: until it is).
    "not_due",
    # The claim arrived, or would start, later than the tick's misfire window
    # (a guard that keeps history records the tick MISSED/late).
    "late",
    # A first claim answered once the job's next tick had come (late_ticks:
    # coalesce): only the newest of late ticks runs (a guard that keeps
    # history records this one MISSED/coalesced).
    "coalesced",
    # The job is paused (`pgcrond pause`) or suspended (YAML): a guard that
    # keeps history records the tick SKIPPED; detail says who, when, why.
    "paused",
    # The fire carried a reason not to run the tick (``skip_reason``: a
    # calendar's day): a guard that keeps history records it SKIPPED with
    # that reason (cause says it), once for the cluster.
    "skipped",
]


@dataclass(frozen=True, eq=False)
class Acquired:
    """A won claim: this replica runs the identity until it finalizes or is fenced.

    Each claim is its own (its owner token is drawn per claim): equal only to
    itself, and hashed by identity, not by its fields (the store keeps the
    unfinalized ones in a weak set: hashing every field of each, twice a run,
    was ~1.5 % of a 10,000-job tick).
    """

    identity: Identity
    id: int
    owner_token: uuid.UUID
    fencing_token: int
    attempt: int
    expires_at: datetime
    timing: LeaseTiming
    # "takeover" (reclaimed an expired RUNNING row), "retry" (a FAIL row) or None.
    claimed_from: str | None = None
    # Local monotonic time the claim was sent, and how long the lease had left
    # by the database's own numbers (expires_at - db_now) when it answered.
    # The server answered after the send, so the lease surely holds until
    # sent_at + remaining, and no later can be assumed: a retried claim whose
    # first try committed keeps the expiry of that first try.
    sent_at: float = field(default_factory=time.monotonic, compare=False)
    remaining: timedelta | None = field(default=None, compare=False)
    # Local monotonic time the answer arrived (how stale db_now may be).
    received_at: float = field(default_factory=time.monotonic, compare=False)
    db_now: datetime | None = field(default=None, compare=False)
    # Set when the lease is lost or expires: whoever runs the job must stop.
    cancellation: Cancellation = field(default_factory=Cancellation, compare=False, repr=False)

    @property
    def idempotency_key(self) -> str:
        return self.identity.idempotency_key

    @property
    def valid_until(self) -> float:
        """Local monotonic instant until which the lease surely holds."""
        remaining = self.timing.lease if self.remaining is None else self.remaining
        return self.sent_at + remaining.total_seconds()

    @property
    def stop_at(self) -> float:
        """When the run must be told to stop: its whole stop sequence ends before expiry."""
        return self.valid_until - self.timing.stop_budget.total_seconds()

    def db_now_at_latest(self) -> datetime | None:
        """An upper bound of the database clock now (db_now plus all time since the send)."""
        if self.db_now is None:
            return None
        return self.db_now + timedelta(seconds=time.monotonic() - self.sent_at)


@dataclass(frozen=True)
class Renewal:
    """A heartbeat's answer: how long the lease has left, and the database's clock then."""

    remaining: timedelta
    db_now: datetime


@dataclass(frozen=True)
class NotAcquired:
    """A lost claim, and why: held by a live lease, done, failed for good, or a skip."""

    identity: Identity
    reason: NotAcquiredReason
    status: str | None
    owner: str | None
    # held: until the holder's lease could expire; retry_pending: until the retry
    # time. Both by the database clock, so replicas with skewed clocks agree.
    wait: timedelta | None = None
    # Attempts made so far (None when the refusing row was not visible yet).
    attempt: int | None = None
    # paused: who paused the job, when and why; late: the MISSED row's text.
    detail: str | None = None
    # The refusing row's own reason (a FAIL row's "error", "timeout", "released", ...).
    cause: str | None = None


@dataclass(frozen=True)
class Standing:
    """Where a tick with a row stands, for a replica that did not claim it.

    ``settled``: no claim will ever take the row again (SUCCESS, MISSED,
    SKIPPED, FAIL with no retry). Otherwise ``wait``: how long until a claim
    could take it (a RUNNING row's expiry, a FAIL row's retry time; zero or
    less: now), by the database clock.
    """

    status: str
    settled: bool
    wait: timedelta | None
