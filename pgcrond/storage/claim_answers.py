"""A claim as the turn's statement sends it, and how its row becomes the answer.

One :class:`PendingClaim` per identity claimed, waiting in its turn's batch;
the claim statement answers each with a row, read here as
:class:`~pgcrond.storage.claims.Acquired` (the lease) or
:class:`~pgcrond.storage.claims.NotAcquired` and why.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from pgcrond.core.keys import Identity
from pgcrond.core.overlap import Overlap
from pgcrond.core.timing import LeaseTiming
from pgcrond.core.trigger import TriggerKind
from pgcrond.storage.claims import Acquired, NotAcquired, NotAcquiredReason


def claim_keys(request: PendingClaim) -> list[str]:
    # One identity per statement, and one tick per job whose running ticks
    # are counted (a statement cannot see the rows it inserts itself, so a
    # second tick would not find the first one running).
    keys = [request.identity.idempotency_key]
    if request.overlap is not None:
        keys.append(f"forbid:{request.identity.code}")
    return keys


@dataclass(frozen=True)
class PendingClaim:
    identity: Identity
    timing: LeaseTiming
    token: uuid.UUID
    # The job's overlap policy where the claim counts its running ticks
    # (a bounded policy, a tick or manual run); None: it does not.
    overlap: Overlap | None
    fire_time: datetime | None = None
    late_after: datetime | None = None
    superseded_at: datetime | None = None
    suspended: str | None = None
    skip_reason: str | None = None
    # Why the fire runs (the attempt record's trigger kind, unless the won row
    # makes it a takeover or a retry).
    trigger: TriggerKind = "schedule"

    def outcome(
        self, row: dict[str, Any] | None, sent_at: float, received_at: float
    ) -> Acquired | NotAcquired:
        if row is None:
            # The conflicting row was inserted by a claim that committed after
            # this statement's snapshot: a live lease, just granted.
            return NotAcquired(self.identity, "held", "RUNNING", None, self.timing.lease)
        if self.skip_reason is not None and row["id"] is not None and not row["claimed"]:
            # The tick has a row already: skipped by another replica, or begun
            # by one whose config runs it, which follows it (not this one).
            return NotAcquired(self.identity, "done", row["status"], row["owner"], None)
        won = row["claimed"] or row["owner_token"] == self.token  # an earlier try committed
        if won and row["status"] == "RUNNING":
            return Acquired(
                identity=self.identity,
                id=row["id"],
                owner_token=self.token,
                fencing_token=row["fencing_token"],
                attempt=row["attempt"],
                expires_at=row["expires_at"],
                timing=self.timing,
                claimed_from=row["reason"],
                sent_at=sent_at,
                remaining=row["expires_at"] - row["db_now"],
                received_at=received_at,
                db_now=row["db_now"],
            )
        return _refusal(self.identity, row)


# What a SKIPPED row that a claim recorded says, by its reason; any other is a fire's skip_reason.
_SKIPS: dict[str, NotAcquiredReason] = {
    "overlap": "overlap",
    "paused": "paused",
    "suspended": "paused",
}


def _refusal(identity: Identity, row: dict[str, Any]) -> NotAcquired:
    status: str = row["status"]
    owner: str | None = row["owner"]
    attempt: int = row["attempt"]
    db_now: datetime = row["db_now"]
    if status == "NOT_DUE":
        # expires_at carries the tick's fire time here.
        return NotAcquired(identity, "not_due", None, None, row["expires_at"] - db_now)
    if status == "LATE":
        return NotAcquired(identity, "late", None, None)
    if status == "PAUSED":
        # A run-once job while paused: no row, so it runs once resumed.
        return NotAcquired(identity, "paused", None, None, detail=row["detail"])
    if status == "MISSED" and row["claimed"]:
        # Past its window or coalesced, and this claim recorded the tick MISSED.
        missed: NotAcquiredReason = "coalesced" if row["reason"] == "coalesced" else "late"
        return NotAcquired(identity, missed, status, owner, attempt=attempt, detail=row["detail"])
    if status == "SKIPPED" and row["claimed"] and row["reason"] == "replaced":
        # A replaced tick whose owner died, closed by this claim: settled.
        return NotAcquired(identity, "done", status, owner, attempt=attempt, detail=row["detail"])
    if status == "SKIPPED" and row["claimed"]:
        # The reason this claim recorded: overlap, a pause, or the fire's own (calendar:<name>).
        reason = _SKIPS.get(row["reason"], "skipped")
        return NotAcquired(
            identity,
            reason,
            status,
            owner,
            attempt=attempt,
            detail=row["detail"],
            cause=row["reason"],
        )
    paused: str | None = row["paused"]
    if row["locked"]:
        # Another transaction holds the row (an sql: job's, while it runs; a
        # claim or finalize of it just now): its owner has it, for now.
        return NotAcquired(
            identity, "held", status, owner, max(row["expires_at"] - db_now, timedelta()), attempt
        )
    if status == "RUNNING":
        wait = max(row["expires_at"] - db_now, timedelta())
        if paused and not wait:
            # Expired while the job is paused: no takeover until it is resumed.
            return NotAcquired(identity, "paused", status, owner, attempt=attempt)
        if row["busy"] and not wait:
            # Expired, but another tick of the job runs: no takeover under forbid.
            return NotAcquired(identity, "overlap", status, owner, attempt=attempt)
        return NotAcquired(identity, "held", status, owner, wait, attempt)
    if status == "FAIL":
        retry_at: datetime | None = row["retry_at"]
        if retry_at is None:
            return NotAcquired(identity, "failed", status, owner, attempt=attempt)
        wait = max(retry_at - db_now, timedelta())
        if paused and not wait:
            # Due for a retry, but the job is paused: the retry waits for resume.
            return NotAcquired(identity, "paused", status, owner, attempt=attempt)
        if row["busy"] and not wait:
            # Due, but the job's slots are taken: a tick its overlap policy
            # keeps waiting (buffer_one, replace) waits on; a retry is blocked.
            blocked: NotAcquiredReason = "waiting" if row["reason"] == "waiting" else "overlap"
            return NotAcquired(identity, blocked, status, owner, attempt=attempt)
        return NotAcquired(
            identity, "retry_pending", status, owner, wait, attempt, cause=row["reason"]
        )
    return NotAcquired(identity, "done", status, owner, attempt=attempt)
