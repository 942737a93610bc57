"""The Guard contract: what decides whether this replica runs a tick.

:mod:`pgcrond.fire` drives every guard the same way and knows no guard kind::

    answer = await guard.claim(request)          # Held | Refused
    if Held:
        async with guard.hold(held):             # keep it alive while the run goes on
            result = run(...)                    # stops when held.cancellation is set
        after = await guard.record(held, verdict)  # "done" | "retry" | "fenced"
    ...
    await guard.forget(identity)                 # the fire is over: free what is left

Every guard fulfils these rules; the implementations only say how.

* **claim** answers for one identity, in one round trip where there is a
  database. ``Held`` means this replica may start the run *now*: the guard has
  checked, on arrival of the answer, that the claim is live and that the tick
  is inside its misfire window (by the database clock when there is one).
  ``Refused`` says why and, where waiting could change the answer, for how long
  (``wait``, by the database clock): the fire then claims again after it.
* **claim_many** is ``claim`` for a chunk of a tick's fires at once, answered
  in their order: the lease guard sends one statement and waits once for the
  fire time; the others claim one after another.
* **hold** sets ``held.cancellation`` (reason ``lease_lost``, ``lease_expired``
  or ``lock_lost``) early enough that the run's whole stop sequence is over
  before anyone else may claim the identity. It never extends a claim that has
  already lapsed.
* **record** stores the outcome as the current holder only. ``"fenced"`` means
  someone else holds the identity now: nothing was recorded, and nothing must
  be. ``"retry"`` means the failure will be claimed again, by any replica; the
  next claim says when. A database outage while recording is raised as
  :class:`~pgcrond.errors.DatabaseUnavailable` (the fire retries with the same
  arguments, which must be safe); no other error escapes.
* **forget** ends the guard's interest in an identity (an advisory lock still
  held for retries is released); it is called once per fire, always.
* **defers** / **standings** (optional; guards that spread a tick's runs):
  ``defers(identity)`` says another live replica is preferred for it, so
  its fire waits for the hold-back and is looked at in one batch with the
  tick's other such fires; ``standings`` reads where those ticks stand
  (settled, or how long until a claim could take them) without claiming.
  A settled tick needs nothing more from this replica; any other is claimed.
* **commit_with** (optional; for ``sql:`` jobs) runs the job's database work
  and records SUCCESS in one transaction, after checking under a row lock that
  ``held`` is still the current holder: ``"done"`` both committed, ``"fenced"``
  neither ran. A failing statement raises
  :class:`~pgcrond.errors.SqlJobFailed` (nothing committed); an outage raises
  :class:`~pgcrond.errors.DatabaseUnavailable`, and whether it committed is
  unknown, so only a failure may be recorded after it (a SUCCESS that did land
  fences it). A later ``record(held, "success")`` answers ``"done"`` at once.
  Guards without a row to commit with raise :class:`Unsupported`; the config
  refuses ``sql:`` under them.
"""

from __future__ import annotations

import abc
import contextlib
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Literal

from pgcrond.core.actions import Committed, SqlWork
from pgcrond.core.cancel import Cancellation
from pgcrond.core.keys import Identity
from pgcrond.core.outcome import RunResult
from pgcrond.core.overlap import ALLOW, Overlap
from pgcrond.core.timing import MAX_STOP_GRACE, LeaseTiming
from pgcrond.core.trigger import TriggerKind
from pgcrond.errors import Unsupported
from pgcrond.storage.claims import NotAcquiredReason, Standing

# Why a claim was refused: the store's answer, named once (storage/claims.py).
RefusalReason = NotAcquiredReason
# What recording an outcome came to.
Recorded = Literal["done", "retry", "fenced"]
# How a run ended, as the guard records it. "released": given back at
# shutdown so a survivor may take it over; "replaced": stopped because a
# newer tick replaced it (concurrency: replace; its cancellation says so).
Outcome = Literal["success", "fail", "timeout", "released", "replaced"]


@dataclass(frozen=True)
class Verdict:
    """How a run ended, as a guard records it."""

    outcome: Outcome
    # The failure's text (fail, timeout).
    error: str | None = None
    # A failure to be claimed again after this long; None: final.
    retry_after: timedelta | None = None
    # What the run left (exit code, duration, output), for a guard that keeps
    # attempt records; None where nothing ran.
    run: RunResult | None = field(default=None, compare=False, repr=False)

    @property
    def retries(self) -> bool:
        return self.outcome in ("fail", "timeout") and self.retry_after is not None


@dataclass(frozen=True)
class ClaimRequest:
    """One fire's claim: the identity, and the bounds the guard must enforce."""

    identity: Identity
    tick: datetime
    # The job's validated lease and heartbeat (config built it once).
    timing: LeaseTiming
    # The job's overlap policy (the claim statement applies it).
    overlap: Overlap = ALLOW
    # The end of the misfire window, or None (run-once jobs, retries).
    deadline: datetime | None = None
    # When the job's next tick fires, for a first claim of a job with
    # late_ticks: coalesce: a claim answered after it is refused "coalesced".
    superseded_at: datetime | None = None
    # suspended: true in the YAML (the text says where): refused "paused" like
    # a pause in the database. Manual run keys are never paused.
    suspended: str | None = None
    # Why the tick is not to run at all (``calendar:<name>``): refused
    # "skipped", before any pause, at any lateness (a tick that never runs is
    # never missed). Manual run keys never carry one.
    skip_reason: str | None = None
    # Why the fire runs: recorded with the attempt a won claim starts.
    trigger: TriggerKind = "schedule"


@dataclass(frozen=True)
class Held:
    """A won claim: this replica runs the identity until it records or is fenced."""

    identity: Identity
    attempt: int
    # Strictly increasing per claim; None where the guard has none (advisory).
    fencing_token: int | None
    # "takeover", "retry" or None for a fresh claim.
    claimed_from: str | None
    # SIGTERM-to-SIGKILL grace the runner may use when the claim is going.
    stop_grace: timedelta = MAX_STOP_GRACE
    # Set when the claim is lost or about to lapse: whoever runs must stop.
    cancellation: Cancellation = field(default_factory=Cancellation, compare=False, repr=False)


@dataclass(frozen=True)
class Refused:
    """A claim that did not win, and why."""

    identity: Identity
    reason: RefusalReason
    status: str | None = None
    owner: str | None = None
    wait: timedelta | None = None
    attempt: int | None = None
    # paused: who paused the job, when and why; late: what was recorded.
    detail: str | None = None
    # The refusing record's own reason: a retry_pending after "error" or
    # "timeout" is a real retry (no misfire bound); after "released" it is not.
    cause: str | None = None


class Guard(abc.ABC):
    """Decides, per identity, which replica runs it. See the module docstring."""

    #: Whether outcomes are remembered across the cluster (history, retries
    #: by any replica, run-once). A guard that does not remember retries
    #: under the claim it still holds.
    remembers: bool

    @abc.abstractmethod
    async def claim(self, request: ClaimRequest) -> Held | Refused:
        """Try to win ``request.identity``; see the module docstring."""

    async def claim_many(self, requests: Sequence[ClaimRequest]) -> list[Held | Refused]:
        """:meth:`claim` each of ``requests`` (a chunk of one tick's fires), answered in order.

        A guard with a database claims them in one statement; this default
        claims them one after another. An outage is raised for the whole
        chunk (every claim is safe to repeat).
        """
        return [await self.claim(request) for request in requests]

    @abc.abstractmethod
    def hold(self, held: Held) -> contextlib.AbstractAsyncContextManager[object]:
        """Keep ``held`` alive while the block runs; set its cancellation when going."""

    @abc.abstractmethod
    async def record(self, held: Held, verdict: Verdict) -> Recorded:
        """Store ``verdict`` as the current holder; its ``retry_after`` asks for a retry."""

    def defers(self, identity: Identity) -> bool:
        """Whether another live replica is preferred for ``identity`` (see the module docstring)."""
        return False

    async def standings(self, identities: Sequence[Identity]) -> dict[Identity, Standing]:
        """Where each of ``identities`` stands; one with no record is left out."""
        raise Unsupported(f"{type(self).__name__} defers no fire")

    def look_due(self, at: float) -> None:  # noqa: B027 - optional hook
        """A look (``standings``) is due at the loop's time ``at``: writes then may wait for it."""

    async def forget(self, identity: Identity) -> None:  # noqa: B027 - optional hook
        """The fire of ``identity`` is over on this replica."""

    async def commit_with(self, held: Held, work: SqlWork) -> Committed:
        """Run ``work`` and record SUCCESS in one transaction; see the module docstring."""
        raise Unsupported(f"{type(self).__name__} cannot commit database work with an outcome")


@contextlib.asynccontextmanager
async def held_as_is(held: Held) -> AsyncIterator[Held]:
    """A ``hold`` for claims that need no keep-alive."""
    yield held
