"""An in-memory guard with lease semantics, for unit tests of the fire's decisions.

Not a mode: nothing is shared between processes. It follows the Guard contract
as the lease guard does (one winner per identity, retries and takeover after
expiry, fencing of a stale holder) on a clock the test controls, and lets a
test script what the "database" does next: refuse with a given reason, be
unreachable for a number of calls, fence the holder.
"""

from __future__ import annotations

import contextlib
from collections import deque
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta

from pgcrond.core.keys import Identity
from pgcrond.core.timing import MAX_STOP_GRACE
from pgcrond.errors import DatabaseUnavailable
from pgcrond.guard.base import (
    ClaimRequest,
    Guard,
    Held,
    Recorded,
    Refused,
    Verdict,
)


@dataclass
class Row:
    """One identity's state, as the lease table would hold it."""

    status: str
    attempt: int
    token: int
    expires_at: datetime
    retry_at: datetime | None = None
    reason: str | None = None
    error: str | None = None


@dataclass
class MemoryGuard(Guard):
    """Lease semantics in a dict. ``script`` is consumed one entry per call."""

    clock: Callable[[], datetime] = field(default=lambda: datetime.now(UTC))
    rows: dict[Identity, Row] = field(default_factory=dict)
    # Entries: "unavailable" (raise DatabaseUnavailable), "fence" (the next
    # record finds the holder fenced), or a Refused to answer with.
    script: deque[str | Refused] = field(default_factory=deque)
    calls: list[str] = field(default_factory=list)
    remembers: bool = True
    # What a won claim allows a run to stop in (a lease's is its stop budget).
    stop_grace: timedelta = MAX_STOP_GRACE
    _tokens: int = 0
    _fenced: set[Identity] = field(default_factory=set)

    def _next(self, operation: str) -> str | Refused | None:
        self.calls.append(operation)
        entry = self.script.popleft() if self.script else None
        if entry == "unavailable":
            raise DatabaseUnavailable(f"database unavailable (scripted, {operation})")
        if entry == "fence":
            self._fenced.update(self.rows)
            return None
        return entry

    async def claim(self, request: ClaimRequest) -> Held | Refused:
        scripted = self._next("claim")
        if isinstance(scripted, Refused):
            return scripted
        now = self.clock()
        identity = request.identity
        if request.skip_reason is not None:
            # As the claim statement does: recorded once, before any pause, at
            # any lateness; a tick that has a row already is answered with it.
            row = self.rows.get(identity)
            if row is not None:
                return Refused(identity, "done", row.status, attempt=row.attempt)
            self.rows[identity] = Row("SKIPPED", 0, 0, now, reason=request.skip_reason)
            return Refused(identity, "skipped", "SKIPPED", attempt=0, cause=request.skip_reason)
        if request.suspended is not None and identity.pausable:
            return Refused(identity, "paused", detail=request.suspended)
        if identity.type == "SCHEDULE" and now < request.tick:
            return Refused(identity, "not_due", wait=request.tick - now)
        if request.deadline is not None and now > request.deadline:
            return Refused(identity, "late")
        row = self.rows.get(identity)
        if request.superseded_at is not None and now >= request.superseded_at:
            # As the claim statement does: a row another claim wrote answers.
            return Refused(identity, "coalesced") if row is None else _refusal(identity, row, now)
        if row is not None:
            reclaimable = (
                row.status == "FAIL" and row.retry_at is not None and row.retry_at <= now
            ) or (row.status == "RUNNING" and row.expires_at <= now)
            if not reclaimable:
                return _refusal(identity, row, now)
        self._tokens += 1
        claimed_from = None if row is None else ("takeover" if row.status == "RUNNING" else "retry")
        attempt = 1 if row is None else row.attempt + 1
        self.rows[identity] = Row("RUNNING", attempt, self._tokens, now + request.timing.lease)
        self._fenced.discard(identity)
        return Held(
            identity,
            self.rows[identity].attempt,
            self._tokens,
            claimed_from,
            stop_grace=self.stop_grace,
        )

    def hold(self, held: Held) -> contextlib.AbstractAsyncContextManager[Held]:
        return self._hold(held)

    @contextlib.asynccontextmanager
    async def _hold(self, held: Held) -> AsyncIterator[Held]:
        yield held

    async def record(self, held: Held, verdict: Verdict) -> Recorded:
        outcome, retry_after = verdict.outcome, verdict.retry_after
        self._next(f"record:{outcome}")
        row = self.rows[held.identity]
        if held.identity in self._fenced or row.token != held.fencing_token:
            return "fenced"
        now = self.clock()
        if outcome == "success":
            row.status, row.retry_at = "SUCCESS", None
        elif outcome == "released":
            row.status, row.retry_at, row.reason = "FAIL", now, "released"
        elif outcome == "replaced":
            row.status, row.retry_at, row.reason = "SKIPPED", None, "replaced"
        else:
            row.status, row.error = "FAIL", verdict.error
            row.reason = "timeout" if outcome == "timeout" else "error"
            row.retry_at = None if retry_after is None else now + retry_after
        if verdict.retries:
            return "retry"
        return "done"


def _refusal(identity: Identity, row: Row, now: datetime) -> Refused:
    if row.status == "RUNNING":
        return Refused(identity, "held", row.status, wait=row.expires_at - now, attempt=row.attempt)
    if row.status == "FAIL" and row.retry_at is not None:
        return Refused(
            identity,
            "retry_pending",
            row.status,
            wait=row.retry_at - now,
            attempt=row.attempt,
            cause=row.reason,
        )
    if row.status == "FAIL":
        return Refused(identity, "failed", row.status, attempt=row.attempt)
    return Refused(identity, "done", row.status, attempt=row.attempt)
