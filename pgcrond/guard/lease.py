"""Lease mode: one row per identity in the lease table, claimed in one statement.

The storage layer (:mod:`pgcrond.storage.leases`) owns the SQL; this module
holds the decisions the Guard contract asks for at the edges of a claim:

* every local deadline comes from the database's answer (``expires_at -
  db_now``, counted from the send), never from when this replica *thinks* the
  lease began;
* a claim answered so late that its lease is already going, or that the tick
  is past its misfire window by the database clock, is not run;
* a tick's claim may be won ahead of its fire time (the tick plan's lead,
  :mod:`pgcrond.tickplan`, so that the round trip is over by then): the
  claim waits until the database clock has surely reached the fire time
  (the store's :class:`~pgcrond.storage.dbclock.ClockFloor`, on the
  replica's :mod:`~pgcrond.core.wheel`), and only then judges the lease as above
  (one that lapsed meanwhile is given back, never run);
* every statement on the run path has a deadline that holds: an unanswered
  statement is left behind (never awaited), so no driver clean-up can stretch
  it.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import functools
import time
import uuid
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import TypeVar

import structlog

from pgcrond.core.actions import Committed, SqlWork
from pgcrond.core.cancel import abandon
from pgcrond.core.keys import Identity
from pgcrond.core.wheel import wheel
from pgcrond.errors import DatabaseUnavailable, PgcrondError
from pgcrond.guard.base import ClaimRequest, Guard, Held, Recorded, Refused, Verdict
from pgcrond.guard.spread import Spread
from pgcrond.storage.attempt_end import AttemptEnd
from pgcrond.storage.claim_answers import PendingClaim
from pgcrond.storage.claims import Acquired, NotAcquired, Standing
from pgcrond.storage.keepalive import holding
from pgcrond.storage.leases import LeaseStore

T = TypeVar("T")
log = structlog.get_logger("pgcrond.guard.lease")

# A claim (one with no misfire deadline too: run-once jobs, retries) or an
# outcome unanswered this long is treated as an outage and retried, with the
# same owner token, so a write that did land is recognised.
STATEMENT_TIMEOUT_S = 5.0
UNSTORABLE_ERROR = "the error text could not be stored"
# A claim answered slower than this is re-checked before anything runs.
SLOW_ANSWER_S = 0.25


@dataclass
class _Open:
    lease: Acquired
    held: Held
    # SUCCESS already committed with the job's own SQL (commit_with).
    committed: bool = False


class LeaseGuard(Guard):
    """The lease table as a :class:`~pgcrond.guard.base.Guard`."""

    remembers = True

    def __init__(
        self,
        store: LeaseStore,
        *,
        spread: Spread | None = None,
        on_heartbeat_failure: Callable[[Identity], None] | None = None,
        clock: Callable[[], float] = time.monotonic,
        wall: Callable[[], datetime] = lambda: datetime.now(UTC),
    ) -> None:
        self.store = store
        self.spread = spread
        self._on_heartbeat_failure = on_heartbeat_failure
        self._clock = clock
        # Before the first answer the local clock stands in for the database's.
        self._wall = wall
        # One owner token per claim, kept while that claim is retried through
        # an outage: a try that committed but lost its answer still counts as won.
        self._tokens: dict[Identity, uuid.UUID] = {}
        self._open: dict[Identity, _Open] = {}

    async def claim(self, request: ClaimRequest) -> Held | Refused:
        return (await self.claim_many([request]))[0]

    async def claim_many(self, requests: Sequence[ClaimRequest]) -> list[Held | Refused]:
        """One claim statement for ``requests`` (the store's :meth:`~LeaseStore.claim_many`).

        The won claims wait once, together, until the database's clock has
        surely reached the latest of their fire times, and for a loop turn
        with room for them (a tick's chunks are judged a chunk a turn,
        :mod:`~pgcrond.core.wheel`); each is then judged on arrival: most
        answers decide with no statement; the few that need one (a re-check
        of a slow answer, a give-back) go together.
        """
        pendings = [self._pending(request) for request in requests]
        bound = min(self._bound(request) for request in requests)
        # Retried through an outage with the same owner tokens: a try that
        # committed but lost its answer still counts as won.
        answers = await _bounded(self.store.claim_many(pendings), bound, "claim")
        for request in requests:
            self._tokens.pop(request.identity, None)
        won = [r.tick for r, a in zip(requests, answers, strict=True) if isinstance(a, Acquired)]
        scheduled = [r.tick for r in requests if r.identity.type == "SCHEDULE"]
        if won and scheduled:
            await self._reached(max(scheduled), len(requests))
        results: list[Held | Refused | None] = []
        later: list[tuple[int, ClaimRequest, Acquired]] = []
        for request, answer in zip(requests, answers, strict=True):
            if isinstance(answer, NotAcquired):
                results.append(self._refused(answer))
                continue
            ready = self._ready(request, answer)
            if ready is None:
                later.append((len(results), request, answer))
            results.append(ready)
        if later:
            # The few that need a statement first (a re-check, a give-back) go together.
            judged = await asyncio.gather(*(self._arrived(r, a) for _, r, a in later))
            for (i, _, _), result in zip(later, judged, strict=True):
                results[i] = result
        return [result for result in results if result is not None]

    def _pending(self, request: ClaimRequest) -> PendingClaim:
        identity = request.identity
        token = self._tokens.get(identity)
        if token is None:
            # Drawn from the system each time: a count seeded once per process
            # repeats in a forked or restored copy of it, and a claim answered
            # with its own token counts as won, so two claimants would both win.
            token = self._tokens[identity] = uuid.uuid4()
        return PendingClaim(
            identity,
            request.timing,
            token,
            request.overlap if request.overlap.bounded and identity.type == "SCHEDULE" else None,
            request.tick if identity.type == "SCHEDULE" else None,
            request.deadline,
            request.superseded_at,
            request.suspended,
            request.skip_reason,
            request.trigger,
        )

    def _bound(self, request: ClaimRequest) -> float:
        """How long the claim's answer is waited for."""
        if request.deadline is None:
            return STATEMENT_TIMEOUT_S
        # A claim is worth nothing after the misfire window: it is bounded by it.
        left = (request.deadline - self._wall()).total_seconds()
        return min(STATEMENT_TIMEOUT_S, max(left, 0.05))

    def _refused(self, answer: NotAcquired) -> Refused:
        if self.spread is not None and answer.status is not None:
            self.spread.saw(answer.owner)  # the row of a current tick: its owner lives
        return Refused(
            answer.identity,
            answer.reason,
            answer.status,
            answer.owner,
            answer.wait,
            answer.attempt,
            answer.detail,
            answer.cause,
        )

    def _ready(self, request: ClaimRequest, lease: Acquired) -> Held | None:
        """``Held`` at once when the answer decides with no statement (most do); else None."""
        fast = lease.received_at - lease.sent_at <= SLOW_ANSWER_S or self._clear(request, lease)
        inside = request.deadline is None or (
            (lease.db_now_at_latest() or request.deadline) <= request.deadline
        )
        if not (fast and inside) or self._clock() >= lease.stop_at:
            return None
        return self._opened(request, lease)

    async def _arrived(self, request: ClaimRequest, answer: Acquired) -> Held | Refused:
        """Judge a won claim whose answer was slow, late or too late to run as it is."""
        precise = True
        if answer.received_at - answer.sent_at > SLOW_ANSWER_S and not self._clear(request, answer):
            fresh = await self._recheck(answer)
            if fresh is None:
                # Lapsed or taken over while the answer was on its way.
                return Refused(request.identity, "held", "RUNNING", wait=timedelta(0))
            precise = fresh is not answer
            answer = fresh
        return await self._on_arrival(request, answer, precise=precise)

    async def _reached(self, fire_time: datetime, claims: int) -> None:
        """Until the database's clock has surely reached ``fire_time``, in a loop turn
        with room for judging ``claims`` answers.

        The time has come when no recent answer bounds the clock (the claim
        that won the tick has just fed the floor, so that is one whose answer
        took longer than the floor keeps any). A tighter floor from a later
        answer lets the waits that begin after it go sooner.
        """
        at = self.store.clock_floor.reaches(fire_time)
        if at is None:
            await wheel().turn(claims)
        else:
            await wheel().until(at, claims)

    def _clear(self, request: ClaimRequest, lease: Acquired) -> bool:
        """Whether a slow answer's safe bounds decide already: live for a while, inside its window.

        The bounds (the lease counted from the send, the database clock at
        most its answer plus all time since) are what :meth:`_on_arrival`
        judges an unconfirmed answer by; when they say "run", a re-check could
        only say the same, one round trip later. At 10,000 co-firing jobs most
        answers are slow (the loop is busy): a re-check each cost a heartbeat
        statement per 500 and that round trip before every run.

        "For a while": half the lease or more before the run's stop deadline,
        so its first heartbeat (at most a third of the lease in) comes well
        before it. Less (a short lease, an old answer), or no heartbeats to
        renew it: re-checked, which renews the lease before the run starts.
        """
        inside = request.deadline is None or (
            (lease.db_now_at_latest() or request.deadline) <= request.deadline
        )
        timing = lease.timing
        left = lease.stop_at - self._clock()
        return inside and bool(timing.heartbeat) and left >= timing.lease.total_seconds() / 2

    async def _recheck(self, lease: Acquired) -> Acquired | None:
        """A slow answer's age is anywhere in its round trip: ask the database again.

        A heartbeat (one fast round trip, if the network is back) gives fresh
        numbers for both decisions on arrival: is the lease live, and is the
        tick still inside its window. None: the lease is gone. No quick answer
        (a busy loop, or the network still away): ``lease`` itself, whose
        numbers, counted from its send, are safe but imprecise (see
        :meth:`_on_arrival`). Giving every such claim back fed a busy replica
        more claims to answer.
        """
        sent = self._clock()
        try:
            renewal = await _bounded(self.store.renew(lease), SLOW_ANSWER_S, "heartbeat")
        except PgcrondError:
            return lease
        if renewal is None:
            return None
        return dataclasses.replace(
            lease,
            sent_at=sent,
            remaining=renewal.remaining,
            db_now=renewal.db_now,
            received_at=self._clock(),
        )

    async def _on_arrival(
        self, request: ClaimRequest, lease: Acquired, *, precise: bool = True
    ) -> Held | Refused:
        """Run nothing on a lease that is not live now, or for a tick past its window.

        Not ``precise`` (a slow answer that no re-check confirmed): the database
        clock is known only to be at most ``db_now_at_latest()``, so a tick that
        may be past its window is given back, not closed: the next claim, ours
        or another replica's, is judged by the database itself.
        """
        late = request.deadline is not None and (
            (lease.db_now_at_latest() or request.deadline) > request.deadline
        )
        if late and not precise and request.deadline is not None:
            return await self._give_back(request, lease, request.deadline)
        if late:
            # Nobody may run it any more: close the row for good, saying why.
            await self._quietly(
                self.store.fail(
                    lease,
                    "the claim was answered after the tick's misfire window",
                    reason="late",
                    retry_after=None,
                ),
                lease,
            )
            return Refused(request.identity, "late", "FAIL", attempt=lease.attempt)
        if self._clock() >= lease.stop_at:
            # The answer came so late that the lease is already going: give it
            # back at once, so the next claim (ours or anyone's) may run it.
            log.warning(
                "claim_answered_too_late",
                job=request.identity.code,
                run_key=request.identity.run_key,
                answer_age_s=round(self._clock() - lease.sent_at, 3),
            )
            await self._quietly(self.store.release(lease), lease)
            return Refused(request.identity, "retry_pending", "FAIL", wait=timedelta(0))
        return self._opened(request, lease)

    def _opened(self, request: ClaimRequest, lease: Acquired) -> Held:
        held = Held(
            identity=request.identity,
            attempt=lease.attempt,
            fencing_token=lease.fencing_token,
            claimed_from=lease.claimed_from,
            stop_grace=lease.timing.stop_grace,
            cancellation=lease.cancellation,
        )
        self._open[request.identity] = _Open(lease, held)
        return held

    async def _give_back(
        self, request: ClaimRequest, lease: Acquired, deadline: datetime
    ) -> Held | Refused:
        """Give the claim back, and claim again at once inside the same window.

        Refused "held" (as before) would have the fire follow the tick with no
        misfire bound, and run it after its window; the re-claim keeps the
        window, so the database refuses it "late" once the window is over.
        The give-back takes back the attempt it counted.
        """
        try:
            given = await _bounded(
                self.store.give_back(lease, deadline), STATEMENT_TIMEOUT_S, "finalize"
            )
        except PgcrondError as exc:
            # The row expires by itself; a follower then decides.
            log.warning(
                "claim_not_returned",
                job=lease.identity.code,
                run_key=lease.identity.run_key,
                error=str(exc),
            )
            return Refused(request.identity, "held", "RUNNING", wait=timedelta(0))
        log.info(
            "claim_given_back",
            job=lease.identity.code,
            run_key=lease.identity.run_key,
            reason=given,
        )
        if given == "late":
            return Refused(request.identity, "late", "FAIL", attempt=lease.attempt)
        if given is None:
            return Refused(request.identity, "held", "RUNNING", wait=timedelta(0))
        return await self.claim(request)

    async def _quietly(
        self, write: Awaitable[object], lease: Acquired, event: str = "claim_not_returned"
    ) -> None:
        """``write``, bounded; a failure is logged as ``event``, never raised."""
        try:
            await _bounded(write, STATEMENT_TIMEOUT_S, "finalize")
        except PgcrondError as exc:
            # The row expires by itself (a follower then decides), or the
            # attempt's record stays as it was: the tick's outcome is not at stake.
            log.warning(
                event,
                job=lease.identity.code,
                run_key=lease.identity.run_key,
                error=str(exc),
            )

    def hold(self, held: Held) -> contextlib.AbstractAsyncContextManager[object]:
        # The store's keep-alive itself, no context manager of its own around
        # it: one per run.
        on_failure = None
        if self._on_heartbeat_failure is not None:
            on_failure = functools.partial(_told, self._on_heartbeat_failure, held.identity)
        return holding(self._open[held.identity].lease, self.store.heartbeat, on_failure)

    async def record(self, held: Held, verdict: Verdict) -> Recorded:
        outcome, error, retry_after = verdict.outcome, verdict.error, verdict.retry_after
        lease = self._open[held.identity].lease
        end = AttemptEnd.of(verdict.run)
        if outcome == "success" and self._open[held.identity].committed:
            # Recorded in the job's own transaction; its attempt record is
            # told what the statements left. The tick is done either way.
            await self._quietly(
                self.store.close_attempt(lease, "success", end), lease, "attempt_not_recorded"
            )
            return "done"
        pending: Awaitable[bool]
        if outcome == "success":
            pending = self.store.complete(lease, end)
        elif outcome == "released":
            pending = self.store.release(lease, end)
        elif outcome == "replaced":
            pending = self.store.replaced(lease, end)
        else:
            reason = "timeout" if outcome == "timeout" else "error"
            pending = self.store.fail(
                lease, error or outcome, reason=reason, retry_after=retry_after, end=end
            )
        try:
            recorded = await _bounded(pending, STATEMENT_TIMEOUT_S, "finalize")
        except DatabaseUnavailable:
            raise
        except PgcrondError as exc:
            # Not an outage: the statement itself was refused (say, by text
            # the database cannot take). Record the outcome without the text.
            log.error(
                "outcome_rejected",
                job=held.identity.code,
                run_key=held.identity.run_key,
                error=str(exc),
            )
            if outcome in ("success", "released", "replaced"):
                raise DatabaseUnavailable(str(exc)) from exc
            recorded = await _bounded(
                self.store.fail(lease, UNSTORABLE_ERROR, reason="error", retry_after=retry_after),
                STATEMENT_TIMEOUT_S,
                "finalize",
            )
        if not recorded:
            return "fenced"
        if verdict.retries:
            return "retry"
        return "done"

    async def commit_with(self, held: Held, work: SqlWork) -> Committed:
        opened = self._open[held.identity]
        # Bounded like every statement on the run path: the job's statements by
        # their timeout, the lock and the finalize by the finalize's.
        bound = work.statement_timeout.total_seconds() * len(work.statements)
        task = asyncio.ensure_future(self.store.complete_with(opened.lease, work))
        try:
            committed = await _bounded(task, bound + 2 * STATEMENT_TIMEOUT_S, "sql job")
        except asyncio.CancelledError:
            # The run is being stopped: the transaction must end too (rolled
            # back), not go on behind the caller's back.
            task.cancel()
            raise
        if not committed:
            return "fenced"
        opened.committed = True
        return "done"

    def defers(self, identity: Identity) -> bool:
        return self.spread is not None and self.spread.defers(identity)

    async def standings(self, identities: Sequence[Identity]) -> dict[Identity, Standing]:
        return await _bounded(self.store.standings(identities), STATEMENT_TIMEOUT_S, "standings")

    def look_due(self, at: float) -> None:
        self.store.look_due(at)

    async def forget(self, identity: Identity) -> None:
        self._open.pop(identity, None)
        self._tokens.pop(identity, None)


def _told(callback: Callable[[Identity], None], identity: Identity, _: Exception) -> None:
    """A heartbeat of ``identity``'s lease failed: ``callback`` counts it."""
    callback(identity)


async def _bounded(call: Awaitable[T], seconds: float, operation: str) -> T:
    """``await call`` for at most ``seconds``; an unanswered call is left behind.

    ``asyncio.wait_for`` would wait for the cancelled statement's clean-up
    (psycopg sends a cancel request and waits for it), which on a cut network
    takes as long as the cut. Here the task is cancelled and abandoned.
    """
    task = asyncio.ensure_future(call)
    # asyncio.wait's bookkeeping, without the sets: on every statement of every run.
    woken = asyncio.get_running_loop().create_future()

    def wake(_: object = None) -> None:
        if not woken.done():
            woken.set_result(None)

    task.add_done_callback(wake)
    timer = asyncio.get_running_loop().call_later(seconds, wake)
    try:
        await woken
    finally:
        timer.cancel()
        task.remove_done_callback(wake)
    if task.done():
        return task.result()
    abandon(task)
    raise DatabaseUnavailable(f"database unavailable: no answer to the {operation} in {seconds:g}s")
