"""One fire, start to end: misfire check -> guard -> runner -> record.

Every replica fires every tick; this module decides, through the job's guard
(:mod:`pgcrond.guard`, whose contract is in ``guard/base.py``), whether this
replica runs it, runs it, and records the outcome. It knows no guard kind. The
daemon calls :meth:`Firing.fire` for each tick APScheduler hands it; ``pgcrond
trigger`` calls it once for a manual run.

In short:

* claim (one round trip); a loss because the tick is **held** is followed:
  the replica claims again once the holder's claim could have lapsed, and a
  survivor reclaims the tick of a dead winner (**takeover**), however long
  after the tick: ``misfire_grace`` bounds only a tick's first start. A
  started tick stays followed by every replica until it is done, whatever
  became of this replica's own attempt (lease lost, fenced, answered too
  late);
* the winner keeps the claim alive while the runner runs, then records SUCCESS
  or FAIL as the current holder only; a failure with retries left is claimed
  again (by whichever replica follows it; retries are not misfires);
* a database outage is retried with backoff: a claim until ``misfire_grace``
  runs out, an outcome until it lands; an unexpected error from the guard is
  retried the same way a few times, and one on a won run is that run's
  failure, recorded like any other;
* a replica fires one identity at most once at a time: a second fire of it
  joins the first's outcome;
* a takeover, a retry or a run-once job refused ``paused`` waits for
  :meth:`Firing.resumed` (``pgcrond resume``), then claims again.
* a started tick's retry refused ``overlap`` (a newer tick of its forbid job
  runs) is claimed again once that run could be over, never dropped.
"""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Literal, TypeVar

import structlog

from pgcrond.config.models import JobConfig
from pgcrond.core.cancel import Cancellation
from pgcrond.core.keys import Identity
from pgcrond.core.outcome import RunResult
from pgcrond.core.retry import retry_delay
from pgcrond.core.schedule import tick_of
from pgcrond.core.wheel import wake, wheel
from pgcrond.errors import DatabaseUnavailable, PgcrondError
from pgcrond.events import FireEvents
from pgcrond.guard.base import ClaimRequest, Guard, Held, Outcome, Refused, Verdict
from pgcrond.run import leftovers
from pgcrond.run.attempt import RunRequest
from pgcrond.run.runner import execute

T = TypeVar("T")
log = structlog.get_logger("pgcrond.fire")

# What one fire came to on this replica. "lose": its claim lost (another replica
# runs or ran the tick); "lease_lost": it won, but lost the lease while running;
# "crashed": an unexpected error ended it (logged as fire_crashed).
FireOutcome = Literal[
    "success", "fail", "timeout", "cancelled", "lease_lost", "lose", "skip", "misfire", "crashed"
]


@dataclass(frozen=True, slots=True)
class Fire:
    """One fire of one identity, carried whole from whoever fires it to its record."""

    job: JobConfig
    # When it fires: the tick, moved by the job's jitter (misfire counts from it).
    tick: datetime
    identity: Identity
    # The tick already ran (a retry or takeover pending, seen at start or by a
    # look): followed with no misfire bound, which bounds a tick's first start only.
    started: bool = False
    # The hold-back for another preferred replica is over already (a deferred
    # fire, pgcrond.deferral): its claim goes out at once.
    claim_at_once: bool = False
    # When the job's next tick fires (late_ticks: coalesce): a first claim
    # answered after it gives the tick up as coalesced.
    superseded_at: datetime | None = None
    # False: return at the first lost claim instead of following the tick
    # (`pgcrond trigger` reports and exits).
    follow: bool = True
    # Awaited once this replica won the claim, before the first attempt runs
    # (a request's own record that its run started).
    on_start: Callable[[], Awaitable[None]] | None = None


# How often a forbid job's claim looks again whether an abandoned run of it
# ended (a thread gives no signal when it ends).
LEFTOVER_POLL_S = 0.05
# Outage retries: fast enough to claim within about a second of the database
# answering again, slow enough not to hammer a struggling server.
_BACKOFF_FIRST = 0.2
_BACKOFF_MAX = 1.0
# Re-check a held lease (claim, or look at, it again) a little after it could
# have expired, so the holder's last heartbeat and clock jitter do not make
# the check land just before it.
FOLLOW_MARGIN = timedelta(milliseconds=100)
_LOST_REASONS = frozenset({"lease_lost", "lease_expired", "lock_lost"})
# How often a tick that waits for the job's slot is claimed again (a retry a
# newer running tick blocks; a buffer_one or replace tick): it starts within
# this of the running tick's end, at one claim per waiting tick and replica.
_BLOCKED_RETRY_RECHECK = timedelta(seconds=1)
# A guard call that raises an error which is not a PgcrondError (a bug, say a
# batch answering a request given up on) is retried like an outage, since
# every guard call is safe to repeat (the contract); this many times in a row.
_UNEXPECTED_TRIES = 3


@dataclass
class Firing:
    """Shared state of one replica: which guard decides, what to count, how to stop."""

    guards: Callable[[JobConfig], Guard]
    replica: str
    # Told what each fire decided and how each run ended (pgcrond/events.py):
    # the daemon's metrics, accounting and failure hooks.
    events: FireEvents = field(default_factory=FireEvents)
    # Set at shutdown (:meth:`stop`): no new claims, followers give up, runs get stop_grace.
    stopping: asyncio.Event = field(default_factory=asyncio.Event)
    # The attempts running here: (identity, attempt) -> how to stop it.
    running: dict[tuple[Identity, int], Cancellation] = field(default_factory=dict)
    clock: Callable[[], datetime] = field(default=lambda: datetime.now(UTC))
    # The config in force: a job by its code, None once a reload removed it.
    # A won claim runs the job as defined when its tick comes (None here: as fired).
    jobs: Callable[[str], JobConfig | None] | None = None
    # Fires asleep on the wheel until they claim again: stop() wakes them.
    _asleep: set[asyncio.Future[None]] = field(default_factory=set, repr=False)
    # The one place that knows which identities this replica fires now: a
    # second fire of one (a request, catch-up, a resumed open tick) joins the
    # first's outcome instead of claiming with the same owner token.
    _in_flight: dict[Identity, asyncio.Future[FireOutcome]] = field(
        default_factory=dict, repr=False
    )
    # Rung by resumed(): fires of started ticks waiting out a pause. The
    # count lets a fire see a resume that came while its claim was on its way.
    _resume: asyncio.Event = field(default_factory=asyncio.Event, repr=False)
    _resumes: int = 0
    _halted: bool = False

    def stop(self) -> None:
        """Shutdown: no new claims, and every fire asleep until a claim wakes and gives up."""
        self.stopping.set()
        for woken in self._asleep:
            wake(woken)

    def halt(self) -> None:
        """The shutdown's grace is over (or forced): no run starts any more.

        A claim won and not yet started (one won ahead of its tick, waiting
        for it) is released when its answer is acted on, never run.
        """
        self._halted = True
        self.stop()

    def in_flight(self, identity: Identity) -> bool:
        """Whether this replica fires ``identity`` now."""
        return identity in self._in_flight

    def resumed(self) -> None:
        """A pause may have been lifted: every fire waiting for one claims again."""
        self._resumes += 1
        self._resume.set()
        self._resume = asyncio.Event()

    async def fire(self, fire: Fire) -> FireOutcome:
        """Handle ``fire``; returns what this replica did.

        An identity this replica fires already is not fired twice: the call
        returns what that fire comes to.
        """
        identity = fire.identity
        current = self._in_flight.get(identity)
        if current is not None:
            log.info("fire_joined", job=fire.job.code, run_key=identity.run_key)
            return await asyncio.shield(current)
        done: asyncio.Future[FireOutcome] = asyncio.get_running_loop().create_future()
        self._in_flight[identity] = done
        try:
            outcome = await self._fire_once(fire)
        except BaseException:
            done.cancel()
            raise
        finally:
            del self._in_flight[identity]
        done.set_result(outcome)
        return outcome

    async def _fire_once(self, fire: Fire) -> FireOutcome:
        job, identity = fire.job, fire.identity
        self.events.fired(job)
        bound = log.bind(job=job.code, run_key=identity.run_key)
        if identity.type == "SCHEDULE" and not fire.started:
            cause = self._given_up_here(fire)
            if cause is not None:
                return self._misfire(job, bound, identity, fire.tick, cause)
        guard = self.guards(job)
        try:
            return await self._fire(fire, guard, bound)
        except Exception as exc:
            # Past every retry: said once, with the error, and the fire ends.
            bound.exception("fire_crashed", error=_describe(exc))
            return "crashed"
        finally:
            await guard.forget(identity)

    def _given_up_here(self, fire: Fire) -> str | None:
        """Why a guard without history gives a tick up before claiming it: late, coalesced."""
        job, tick, superseded_at = fire.job, fire.tick, fire.superseded_at
        # A guard that remembers judges both in its claim, by the database's
        # clock, and records the miss itself: this replica's clock (stepped
        # forward, or running ahead) must not decide for the cluster.
        if self.guards(job).remembers:
            return None
        now = self.clock()
        if now - tick > job.misfire_grace:
            return "late"
        return "coalesced" if superseded_at is not None and now >= superseded_at else None

    def _misfire(
        self,
        job: JobConfig,
        bound: structlog.typing.FilteringBoundLogger,
        identity: Identity,
        tick: datetime,
        cause: str,
        *,
        recorded: bool = False,
    ) -> FireOutcome:
        self.events.missed(job, identity, tick, cause, recorded)
        bound.warning(
            "tick_missed",
            cause=cause,
            tick=tick.isoformat(),
            lateness_s=round((self.clock() - tick).total_seconds(), 3),
            misfire_grace_s=job.misfire_grace.total_seconds(),
        )
        return "misfire"

    async def _fire(
        self, fire: Fire, guard: Guard, bound: structlog.typing.FilteringBoundLogger
    ) -> FireOutcome:
        job, tick, identity = fire.job, fire.tick, fire.identity
        # A run-once job must eventually run while one replica lives: it is
        # followed without the misfire bound of a tick; so is a started tick.
        unbounded = identity.type == "INITIAL" or fire.started
        deadline = None if unbounded else tick + job.misfire_grace
        outcome: FireOutcome | None = None  # set once this replica ran or lost the tick
        while not self.stopping.is_set():
            request = ClaimRequest(
                identity,
                tick,
                job.timing,
                overlap=job.overlap,
                deadline=deadline,
                # Like the misfire bound, coalescing bounds a tick's first start only.
                superseded_at=fire.superseded_at if deadline is not None else None,
                suspended=f"suspended: true in {job.source}" if job.suspended else None,
                spreadable=not fire.claim_at_once and outcome is None and deadline is not None,
            )
            resumes = self._resumes
            claim: Callable[[], Awaitable[Held | Refused | None]]
            claim = functools.partial(guard.claim, request)
            if request.overlap.bounded:
                # Asked before every try: a run of the job here may be
                # abandoned while the claim retries through an outage.
                claim = functools.partial(self._claim_alone, job, bound, deadline, claim)
            answer = await self._with_outage_retry(job, "claim", claim, deadline)
            if answer is None:
                if self.stopping.is_set():
                    # The replica stops with no answer (none asked for, or the
                    # database unreachable): the tick is the live replicas' to
                    # run, or to record missed, not this one's to call missed.
                    return outcome or "lose"
                # Still unreachable at the end of the misfire window, which
                # only a tick's first start has (a tick this replica ran or
                # follows has none): the first claim never got through.
                return self._misfire(job, bound, identity, tick, "database_unavailable")
            if isinstance(answer, Held):
                # Won, maybe ahead of the tick, and the tick has come: it runs
                # as the config in force now says, and never once halted.
                in_force = self._in_force(job)
                if in_force is None or self._halted:
                    return await self._release_unstarted(job, guard, answer, bound, outcome)
                job = in_force
                if answer.identity.type == "INITIAL" or tick_of(answer.identity.run_key or ""):
                    self.events.paused(job, False)  # a tick ran: not paused
                if fire.on_start is not None and outcome is None:
                    await fire.on_start()
                outcome, retry = await self._run(job, guard, tick, answer)
                # The tick started: from now on it is followed until it is
                # done (retries, takeovers, a give-back); misfire_grace bounds
                # only a tick's first start.
                deadline = None
                if retry or outcome == "lease_lost":
                    # Followed like any replica follows it: the next claim says
                    # how long until the retry, or who holds the tick now.
                    continue
                return outcome
            if answer.reason == "not_due":
                # This replica's clock runs ahead of the database's, or a
                # claim made ahead of the tick is to be judged at the tick
                # (an overlap, a pause): claimed again then, on the wheel.
                await self._sleep((answer.wait or timedelta()).total_seconds())
                continue
            if answer.reason in ("late", "coalesced"):
                if outcome is None:
                    # A guard with history stored the tick (MISSED/late or
                    # /coalesced, or FAIL/late).
                    recorded = answer.status is not None
                    return self._misfire(
                        job, bound, identity, tick, answer.reason, recorded=recorded
                    )
                return outcome
            if answer.reason == "paused":
                self.events.paused(job, True)
                if fire.follow and answer.status != "SKIPPED" and not job.suspended:
                    # A started tick (a takeover or retry due) or a run-once job:
                    # it waits for `pgcrond resume`, not for a replica's restart.
                    # (A new tick was recorded SKIPPED; a YAML suspension ends
                    # with a reload, which fires run-once jobs again.)
                    deadline = None
                    await self._wait_for_resume(bound, answer, resumes)
                    continue
            if answer.reason == "overlap" and answer.status == "FAIL":
                # A started tick's retry (or a claim given back), due while a
                # newer tick of the job runs, or a tick its overlap policy
                # keeps waiting (buffer_one, replace): it waits for the job's
                # slot, not dropped — no replica would ever claim it again.
                deadline = None
                await self._sleep(min(job.timing.lease, _BLOCKED_RETRY_RECHECK).total_seconds())
                continue
            if answer.reason in ("overlap", "paused"):
                self.events.skipped(job, answer.reason)
                bound.info(
                    "tick_skipped",
                    reason=answer.reason,
                    detail=answer.detail
                    if answer.reason == "paused"
                    else "the previous tick of this job is still running",
                )
                return outcome or "skip"
            if outcome is None:
                outcome = "lose"
                self.events.claim_lost(job, answer.reason)
                bound.debug(
                    "claim_lost",
                    reason=answer.reason,
                    status=answer.status,
                    owner=answer.owner,
                    cause=answer.cause,
                    recheck_in_s=None if answer.wait is None else answer.wait.total_seconds(),
                )
            if answer.reason in ("held", "retry_pending"):
                # Some replica started the tick: followed until it is done.
                deadline = None
            # Without follow (`pgcrond trigger`) only this replica's own retries
            # are followed: a tick it lost is left to the daemons.
            wait = self._follow(job, answer)
            if wait is None or (outcome == "lose" and not fire.follow):
                return outcome
            await self._sleep(wait)
        return outcome or "lose"

    def _in_force(self, job: JobConfig) -> JobConfig | None:
        """``job`` as the config in force defines it now; None once a reload removed it."""
        return job if self.jobs is None else self.jobs(job.code)

    async def _release_unstarted(
        self,
        job: JobConfig,
        guard: Guard,
        held: Held,
        bound: structlog.typing.FilteringBoundLogger,
        outcome: FireOutcome | None,
    ) -> FireOutcome:
        """Give back a claim that must not start: the replica is halted, or its job is gone.

        A claim won ahead of its tick waits for the tick; a forced stop or a
        reload may come meanwhile. Released (not run, not left RUNNING until
        its lease lapses), a live replica whose config still has the job takes it over.
        """
        why = "stopping" if self._halted else "job_removed"
        bound.info("claim_released", reason=why, attempt=held.attempt)
        await self._with_outage_retry(
            job, "finalize", lambda: guard.record(held, Verdict("released", why)), None
        )
        return outcome or ("lose" if why == "stopping" else "skip")

    async def _claim_alone(
        self,
        job: JobConfig,
        bound: structlog.typing.FilteringBoundLogger,
        deadline: datetime | None,
        claim: Callable[[], Awaitable[Held | Refused]],
    ) -> Held | Refused | None:
        """Claim a forbid job's tick once no run of it abandoned here still runs.

        Its lease may have lapsed at the database (the thread outlived its stop
        grace), so the claim would be granted: the job would run twice at once.
        Bounded by the tick's window: past it the claim records the miss.
        None, with no claim made, when the replica stops meanwhile.
        """
        if leftovers.still_running(job.code):
            await self._wait_for_leftovers(job, bound, deadline)
            if self.stopping.is_set():
                return None
        return await claim()

    async def _wait_for_leftovers(
        self,
        job: JobConfig,
        bound: structlog.typing.FilteringBoundLogger,
        deadline: datetime | None,
    ) -> None:
        bound.info(
            "claim_waits",
            detail="an earlier run of this job, abandoned after its stop grace, still runs "
            "in this replica (concurrency: forbid)",
        )
        while leftovers.still_running(job.code) and not self.stopping.is_set():
            if deadline is not None and self.clock() >= deadline:
                return
            await asyncio.sleep(LEFTOVER_POLL_S)

    def _follow(self, job: JobConfig, refusal: Refused) -> float | None:
        """Seconds to wait before claiming again, or None to stop following.

        Only a started tick is followed (held, or a retry pending), and with
        no misfire bound: its window bounded its first start only.
        """
        if refusal.reason not in ("held", "retry_pending") or refusal.wait is None:
            return None
        if (
            refusal.reason == "retry_pending"
            and refusal.identity.type == "INITIAL"
            and (refusal.attempt or 0) > job.retries
        ):
            # Out of retries for this start: the next start of a replica tries
            # the run-once job again, not every follower now.
            return None
        return (refusal.wait + FOLLOW_MARGIN).total_seconds()

    async def _run(
        self, job: JobConfig, guard: Guard, tick: datetime, held: Held
    ) -> tuple[FireOutcome, bool]:
        """Run a won claim and record it; (what came of it, whether a retry follows)."""
        self.events.claim_won(job, held)
        result: RunResult | None = None
        try:
            async with guard.hold(held):
                result = await self._execute(job, tick, held, guard)
        except Exception as exc:
            # A bug on the run path (keep-alive, runner, executor): the run won
            # its claim, so it is recorded as this run's failure, never left
            # RUNNING with nobody running it.
            error = _describe(exc)
            log.exception(
                "run_crashed",
                job=job.code,
                run_key=held.identity.run_key,
                attempt=held.attempt,
                error=error,
            )
            if result is None:
                result = RunResult(outcome="fail", error=error, exit_code=None, duration_s=0.0)
        # Keep-alive ends with the run: a heartbeat racing the finalize would
        # find the row finished and cry "lease lost".
        return await self._record(job, guard, held, result)

    async def _record(
        self, job: JobConfig, guard: Guard, held: Held, result: RunResult
    ) -> tuple[FireOutcome, bool]:
        """Record the outcome as the current holder; retried through an outage."""
        bound = log.bind(job=job.code, run_key=held.identity.run_key, attempt=held.attempt)
        if result.outcome == "cancelled" and held.cancellation.reason in _LOST_REASONS:
            # Another replica may own the tick now: nothing is recorded, and
            # nothing must be, by a fenced owner.
            return "lease_lost", False
        kind: Outcome
        retry_after: timedelta | None = None
        if result.outcome == "success":
            kind = "success"
        elif result.outcome == "cancelled":
            # Shutdown: give the tick back so that a survivor can take it over.
            # Replaced (concurrency: replace): record the stop, which frees
            # the job's slot for the newer tick waiting on it.
            kind = "replaced" if held.cancellation.reason == "replaced" else "released"
        else:
            kind = "timeout" if result.outcome == "timeout" else "fail"
            if held.attempt <= job.retries and not result.permanent:
                # Not before the run asked (an HTTP Retry-After), if it did.
                retry_after = max(
                    retry_delay(held.attempt, job.retry_delay), result.retry_after or timedelta(0)
                )
            elif held.identity.type == "INITIAL" and guard.remembers:
                # A run-once job is never given up on for good: the next start
                # of any replica tries it again.
                retry_after = job.retry_delay
        try:
            recorded = await self._with_outage_retry(
                job,
                "finalize",
                lambda: guard.record(
                    held, Verdict(kind, result.error or result.outcome, retry_after, result)
                ),
                None,
            )
        except asyncio.CancelledError:
            bound.error(
                "outcome_not_recorded",
                outcome=result.outcome,
                detail="the replica stopped before the database came back",
            )
            raise
        except Exception as exc:
            # The guard kept failing (a bug, not an outage): the row stays
            # RUNNING until its lease lapses, and this replica follows the tick
            # like a lost lease, so that it is taken over, not left open.
            bound.exception(
                "outcome_not_recorded",
                outcome=result.outcome,
                error=_describe(exc),
                detail="followed until its lease lapses, then taken over",
            )
            return "lease_lost", False
        if recorded == "fenced":
            bound.warning(
                "outcome_fenced",
                outcome=result.outcome,
                detail="another replica took this tick over meanwhile",
            )
            return "lease_lost", False
        # The alert gauges: the table's truth at start, kept current by what
        # this replica records; a row with no retry time is a final failure.
        self.events.recorded(job, kind, final=retry_after is None)
        # A run-once job out of retries is retried by the next start, not now.
        retry = recorded == "retry" and held.attempt <= job.retries
        if kind in ("fail", "timeout") and not retry:
            try:
                self.events.failed_for_good(job, held, result)
            except Exception as exc:
                bound.exception("failure_hook_crashed", error=_describe(exc))
        return result.outcome, retry

    async def _with_outage_retry(
        self,
        job: JobConfig,
        operation: str,
        call: Callable[[], Awaitable[T]],
        deadline: datetime | None,
    ) -> T | None:
        """``call()``, retried with backoff while the database is unreachable.

        Gives up (None) at ``deadline``, or for a claim at shutdown; an outcome
        is retried until it lands even while stopping, bounded by the caller.
        """
        delay = _BACKOFF_FIRST
        unexpected = 0
        while True:
            try:
                answer = await call()
            except PgcrondError as exc:
                if not isinstance(exc, DatabaseUnavailable):
                    raise

                self.events.database(operation, False)
                log.warning(
                    "database_unavailable",
                    job=job.code,
                    operation=operation,
                    error=str(exc),
                    retry_in_s=delay,
                )
            except Exception as exc:
                unexpected += 1
                if unexpected >= _UNEXPECTED_TRIES:
                    raise
                log.exception(
                    "guard_failed",
                    job=job.code,
                    operation=operation,
                    error=_describe(exc),
                    retry_in_s=delay,
                )
            else:
                self.events.database(operation, True)
                return answer
            if deadline is not None and self.clock() + timedelta(seconds=delay) > deadline:
                return None
            if operation == "claim" and self.stopping.is_set():
                return None
            await asyncio.sleep(delay)
            delay = min(delay * 2, _BACKOFF_MAX)

    async def _sleep(self, seconds: float) -> None:
        """Sleep at least ``seconds`` on the replica's wheel, or until :meth:`stop`.

        A sleeping fire (thousands after a big tick, for a lease each) is one
        wake-up on the wheel, no timer of its own: those due together wake in
        one loop turn, and their claims share a statement.
        """
        if self.stopping.is_set():
            return
        woken: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._asleep.add(woken)
        wheel().call_later(seconds, functools.partial(wake, woken))
        try:
            await woken
        finally:
            self._asleep.discard(woken)

    async def _wait_for_resume(
        self, bound: structlog.typing.FilteringBoundLogger, refusal: Refused, resumes: int
    ) -> None:
        """Until :meth:`resumed` rings after the claim went out (or the replica stops)."""
        if self._resumes != resumes:
            return  # rung while the claim that found the pause was on its way
        bound.info(
            "waiting_for_resume",
            status=refusal.status,
            detail=refusal.detail,
            attempt=refusal.attempt,
        )
        resume = asyncio.ensure_future(self._resume.wait())
        stop = asyncio.ensure_future(self.stopping.wait())
        try:
            await asyncio.wait({resume, stop}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            resume.cancel()
            stop.cancel()

    async def _execute(self, job: JobConfig, tick: datetime, held: Held, guard: Guard) -> RunResult:
        identity, attempt, cancellation = held.identity, held.attempt, held.cancellation
        fencing_token, claimed_from = held.fencing_token, held.claimed_from
        run_key = identity.run_key or ""
        bound = log.bind(
            job=job.code,
            run_key=identity.run_key,
            idempotency_key=identity.idempotency_key,
            attempt=attempt,
            replica=self.replica,
        )
        begun = False

        def on_start() -> None:
            # Said once the job is under way, not before: no log line delays a start.
            nonlocal begun
            begun = True
            lateness = (self.clock() - tick).total_seconds()
            self.events.run_started(job, lateness)
            bound.info(
                "run_started",
                guard=job.guard,
                tick=tick.isoformat(),
                lateness_ms=round(lateness * 1000, 1),
                fencing_token=fencing_token,
                claimed_from=claimed_from,
            )

        request = RunRequest(
            job=job.code,
            action=job.action,
            run_key=run_key,
            # The tick's instant, as the run key names it (not moved by jitter).
            fire_time=tick_of(run_key) or tick,
            attempt=attempt,
            idempotency_key=identity.idempotency_key,
            idempotency_key_hex=identity.idempotency_key_hex,
            fencing_token=fencing_token,
            env=job.env,
            cwd=job.cwd,
            box=job.box,
            timeout=job.timeout,
            stop_grace=held.stop_grace,
            # An sql: action's statements commit with SUCCESS through the guard.
            commit=functools.partial(guard.commit_with, held),
        )
        run_id = (identity, attempt)
        self.running[run_id] = cancellation
        try:
            result = await execute(request, cancellation, on_start)
        except BaseException:
            # A bug on the run path (recorded by _run as this run's failure).
            if begun:
                self.events.run_finished(job, "fail", 0.0)
            raise
        finally:
            del self.running[run_id]
        outcome: str = result.outcome
        if outcome == "cancelled" and cancellation.reason in _LOST_REASONS:
            outcome = "lease_lost"
        self.events.run_finished(job, outcome, result.duration_s)
        level = bound.info if outcome == "success" else bound.warning
        level(
            "run_finished",
            outcome=outcome,
            duration_ms=round(result.duration_s * 1000, 1),
            error=result.error,
            exit_code=result.exit_code,
        )
        return result


def _describe(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}"
