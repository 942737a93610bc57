"""One fire, start to end: claim -> decide -> run -> record.

Every replica fires every tick. The daemon hands a tick's fires on together
(:meth:`Firing.fire_tick`: claimed a chunk a call, waited once for the fire
time); a single fire (``pgcrond trigger``, a request, catch-up, an open tick
at start) goes through :meth:`Firing.fire`. Each answer is looked up in the
decide table (:mod:`pgcrond.decide`, where the rules are), and the step is
carried out here through the job's guard (its contract is in
``guard/base.py``; no guard kind is known here): run and record as the
current holder, follow on the wheel, wait for a resume, miss, skip, end.
Besides the table:

* a database outage is retried with backoff: a claim until its misfire
  window ends, an outcome until it lands; an unexpected error from the guard
  a few times, and one on a won run is that run's failure, recorded like
  any other;
* a replica fires one identity at most once at a time: a second fire of it
  joins the first's outcome;
* a bounded job's claim (concurrency: forbid, replace, buffer_one,
  max_concurrent) waits while a run of it abandoned here still runs;
* a run stopped because a newer tick replaced it (concurrency: replace) is
  recorded replaced, which frees the job's slot for that tick.
"""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Awaitable, Callable, Coroutine, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any, Literal, TypeVar

import structlog

from pgcrond.config.models import JobConfig
from pgcrond.core.cancel import Cancellation
from pgcrond.core.keys import Identity
from pgcrond.core.outcome import RunResult
from pgcrond.core.retry import retry_delay
from pgcrond.core.schedule import tick_of
from pgcrond.core.trigger import TriggerKind, attempt_trigger
from pgcrond.core.wheel import GRID_S, PER_TURN, wake, wheel
from pgcrond.decide import Answer, FireOutcome, Ran, State, Step, decide
from pgcrond.errors import DatabaseUnavailable, PgcrondError
from pgcrond.events import FireEvents
from pgcrond.guard.base import ClaimRequest, Guard, Held, Outcome, Refused, Verdict
from pgcrond.run import leftovers
from pgcrond.run.attempt import RunRequest
from pgcrond.run.runner import execute

T = TypeVar("T")
log = structlog.get_logger("pgcrond.fire")


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
    # When the job's next tick fires (late_ticks: coalesce): a first claim
    # answered after it gives the tick up as coalesced.
    superseded_at: datetime | None = None
    # False: return at the first lost claim instead of following the tick
    # (`pgcrond trigger` reports and exits).
    follow: bool = True
    # Awaited once this replica won the claim, before the first attempt runs
    # (a request's own record that its run started).
    on_start: Callable[[], Awaitable[None]] | None = None
    # Why it fires (PGCRON_TRIGGER; a won claim may make it a retry or takeover).
    trigger: TriggerKind = "schedule"
    # A request's parameters: extra environment variables for its runs only.
    params: Mapping[str, str] = field(default_factory=dict, compare=False)
    # Why the tick is not run at all (``calendar:<name>``): the claim records
    # it SKIPPED with this reason, once for the cluster; never late, never missed.
    skip_reason: str | None = None

    def asks(self, *, first: bool) -> TriggerKind:
        """The trigger kind its claim asks for: once it ran here, what follows is a retry."""
        return self.trigger if first else "retry"

    def claim_request(self, *, started: bool, first: bool = True) -> ClaimRequest:
        """This fire's claim; ``started``: the tick started already (no misfire bound);
        ``first``: nothing ran here yet."""
        job = self.job
        # Like the misfire bound, coalescing bounds a tick's first start only.
        deadline = None if started else self.tick + job.misfire_grace
        return ClaimRequest(
            self.identity,
            self.tick,
            job.timing,
            overlap=job.overlap,
            deadline=deadline,
            superseded_at=None if started else self.superseded_at,
            suspended=f"suspended: true in {job.source}" if job.suspended else None,
            skip_reason=self.skip_reason,
            trigger=self.asks(first=first),
        )


# Outage retries: fast enough to claim within about a second of the database
# answering again, slow enough not to hammer a struggling server.
_BACKOFF_FIRST = 0.2
_BACKOFF_MAX = 1.0
_LOST_REASONS = frozenset({"lease_lost", "lease_expired", "lock_lost"})
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
    # Runs a fire as a task of its own (the daemon tracks it for the drain);
    # None: a task kept here.
    spawn: Callable[[Fire, Coroutine[Any, Any, FireOutcome]], object] | None = None
    # Fires asleep on the wheel until they claim again: stop() wakes them.
    _asleep: set[asyncio.Future[None]] = field(default_factory=set, repr=False)
    # The one place that knows which identities this replica fires now: a
    # second fire of one (a request, catch-up, a resumed open tick) joins the
    # first's outcome instead of claiming with the same owner token. The
    # outcome's future is made when a second fire joins (None until then):
    # nearly none does, and every fire of a tick is entered here.
    _in_flight: dict[Identity, asyncio.Future[FireOutcome] | None] = field(
        default_factory=dict, repr=False
    )
    # Rung by resumed(): fires of started ticks waiting out a pause. The
    # count lets a fire see a resume that came while its claim was on its way.
    _resume: asyncio.Event = field(default_factory=asyncio.Event, repr=False)
    _resumes: int = 0
    _halted: bool = False
    _tasks: set[asyncio.Future[FireOutcome]] = field(default_factory=set, repr=False)

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
        if fire.identity in self._in_flight:
            log.info("fire_joined", job=fire.job.code, run_key=fire.identity.run_key)
            current = self._in_flight[fire.identity]
            if current is None:
                current = asyncio.get_running_loop().create_future()
                self._in_flight[fire.identity] = current
            return await asyncio.shield(current)
        self._enter(fire)
        return await self._carry(fire)

    async def fire_tick(
        self, fires: Sequence[Fire], defer: Callable[[Fire], bool] | None = None
    ) -> None:
        """Claim a tick's fires together; a task only for a fire that runs or follows.

        The tick is handed on :data:`~pgcrond.core.wheel.PER_TURN` fires a
        turn of the wheel, and the fires this replica claims go ``PER_TURN``
        a call per guard (``Guard.claim_many``: the lease guard sends one
        statement, and judges the answers in a turn of their own once the
        fire time came). Each answer is decided at once: one that ends the
        fire (lost, missed, skipped) costs no task; a won claim starts its
        run, one to follow goes on as a fire of its own. ``defer`` takes a
        scheduled fire that another live replica is preferred for
        (:mod:`pgcrond.deferral`). A fire whose tick started already, a
        run-once job's, and one this replica fires already (it is left to
        that fire) are not claimed here.
        """
        claims: list[asyncio.Future[None]] = []
        # Each guard's fires to claim, gathered over turns: a replica that
        # defers most of a tick still sends full chunks, not one per turn.
        pending: dict[int, tuple[Guard, list[Fire]]] = {}
        try:
            for start in range(0, len(fires), PER_TURN):
                chunk = fires[start : start + PER_TURN]
                if start:
                    await wheel().turn(len(chunk))
                for guard, group in self._first_claims(chunk, defer):
                    gathered = pending.setdefault(id(guard), (guard, []))[1]
                    gathered.extend(group)
                    if len(gathered) >= PER_TURN:
                        claims.append(
                            asyncio.ensure_future(self._claim_chunk(guard, gathered[:PER_TURN]))
                        )
                        del gathered[:PER_TURN]
        finally:
            # Fires handed on are claimed (and so end) even if this task is cancelled.
            claims.extend(
                asyncio.ensure_future(self._claim_chunk(guard, gathered))
                for guard, gathered in pending.values()
                if gathered
            )
        await asyncio.gather(*claims)

    def _first_claims(
        self, fires: Sequence[Fire], defer: Callable[[Fire], bool] | None
    ) -> list[tuple[Guard, list[Fire]]]:
        """The fires of a chunk to claim together, by guard; the rest deferred or ended here."""
        groups: dict[int, tuple[Guard, list[Fire]]] = {}
        for fire in fires:
            if fire.identity in self._in_flight or self.stopping.is_set():
                continue
            scheduled = fire.identity.type == "SCHEDULE"
            if scheduled and defer is not None and defer(fire):
                continue
            self._enter(fire)
            if fire.started or not scheduled:
                self._spawn_fire(fire, self._carry(fire))
                continue
            self.events.fired(fire.job)
            cause = self._given_up_here(fire)
            if cause is not None:
                self._leave(fire, self._misfire(fire.job, _bound(fire), fire, cause))
                continue
            guard = self.guards(fire.job)
            self._first_start(guard, fire)
            groups.setdefault(id(guard), (guard, []))[1].append(fire)
        return list(groups.values())

    async def _claim_chunk(self, guard: Guard, fires: list[Fire]) -> None:
        """First claims of a chunk of a tick's fires, in one call; each answer handed on."""
        resumes = self._resumes
        alone = [f for f in fires if f.job.overlap.bounded and leftovers.still_running(f.job.code)]
        for fire in alone:
            # A run of the job abandoned here still runs: claimed once it ended.
            self._spawn_fire(fire, self._carry(fire, counted=True))
        together = [fire for fire in fires if fire not in alone] if alone else fires
        if not together:
            return
        requests = [fire.claim_request(started=False) for fire in together]
        # Given up on at the first window's end; a fire with a longer one claims on alone.
        deadline = min(request.deadline or request.tick for request in requests)
        try:
            answers = await self._with_outage_retry(
                together[0].job,
                "claim",
                functools.partial(self._send_claims, guard, together, requests),
                deadline,
            )
        except Exception as exc:
            for fire in together:
                # Past every retry: said once per fire, with the error, and the fire ends.
                _bound(fire).exception("fire_crashed", error=_describe(exc))
                await guard.forget(fire.identity)
                self._leave(fire, "crashed")
            return
        for index, fire in enumerate(together):
            # No answer by the chunk's first window end: a fire with a longer
            # window claims on alone (not once the replica stops).
            alone_now = answers is None and not self.stopping.is_set()
            try:
                if alone_now and (requests[index].deadline or deadline) > deadline:
                    self._spawn_fire(fire, self._carry(fire, counted=True))
                else:
                    answer = None if answers is None else answers[index]
                    await self._answered(guard, fire, answer, resumes)
            except Exception as exc:
                # One fire's bug ends that fire only, never the rest of its chunk.
                _bound(fire).exception("fire_crashed", error=_describe(exc))
                if fire.identity in self._in_flight:
                    self._leave(fire, "crashed")

    async def _answered(
        self, guard: Guard, fire: Fire, answer: Held | Refused | None, resumes: int
    ) -> None:
        """Hand one answer of a chunk on: a task if it runs or follows, else the fire ends here."""
        if isinstance(answer, Refused) and answer.reason == "paused":
            self.events.paused(fire.job, True)
        state = State(
            fire.job,
            follow=fire.follow,
            stopping=self.stopping.is_set(),
            skip_reason=fire.skip_reason,
        )
        step = decide(answer, state)
        if step.kind in ("run", "release", "follow", "resume"):
            # A chunk's answers are judged in a turn of their own (PER_TURN):
            # its runs start in the next.
            self._spawn_fire(fire, self._carry(fire, counted=True, first=answer, resumes=resumes))
            return
        outcome = self._end(fire, fire.job, _bound(fire), answer, step)
        await guard.forget(fire.identity)
        self._leave(fire, outcome)

    def _enter(self, fire: Fire) -> None:
        """``fire`` is this replica's fire of its identity until :meth:`_leave`."""
        self._in_flight[fire.identity] = None

    def _leave(self, fire: Fire, outcome: FireOutcome | None) -> None:
        """The fire is over (``outcome``; None: cancelled): a second fire of it joins no more."""
        joined = self._in_flight.pop(fire.identity)
        if joined is not None:  # another fire waits for this one's outcome
            if outcome is None:
                joined.cancel()
            else:
                joined.set_result(outcome)
        self.events.fire_done(fire.job, fire.identity, outcome or "cancelled")

    def _spawn_fire(self, fire: Fire, carry: Coroutine[Any, Any, FireOutcome]) -> None:
        if self.spawn is not None:
            self.spawn(fire, carry)
            return
        task = asyncio.ensure_future(carry)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _carry(
        self,
        fire: Fire,
        *,
        counted: bool = False,
        first: Answer | Literal["claim"] = "claim",
        resumes: int | None = None,
    ) -> FireOutcome:
        """``fire`` from its claim (or ``first``, its answer) to its end.

        ``counted``: told and judged already (by :meth:`fire_tick`).
        """
        try:
            outcome = await self._fire_once(fire, counted=counted, first=first, resumes=resumes)
        except BaseException:
            self._leave(fire, None)
            raise
        self._leave(fire, outcome)
        return outcome

    async def _fire_once(
        self,
        fire: Fire,
        *,
        counted: bool,
        first: Answer | Literal["claim"],
        resumes: int | None,
    ) -> FireOutcome:
        job, identity = fire.job, fire.identity
        bound = _bound(fire)
        if not counted:
            self.events.fired(job)
            if identity.type == "SCHEDULE" and not fire.started:
                cause = self._given_up_here(fire)
                if cause is not None:
                    return self._misfire(job, bound, fire, cause)
        guard = self.guards(job)
        if not counted and identity.type == "SCHEDULE" and not fire.started:
            self._first_start(guard, fire)
        try:
            return await self._fire(fire, guard, bound, first, resumes)
        except Exception as exc:
            # Past every retry: said once, with the error, and the fire ends.
            bound.exception("fire_crashed", error=_describe(exc))
            return "crashed"
        finally:
            await guard.forget(identity)

    def _first_start(self, guard: Guard, fire: Fire) -> None:
        # A fire another replica is preferred for comes here once that one let it pass.
        identity = fire.identity
        self.events.first_start(fire.job, identity, fire.tick, lambda: not guard.defers(identity))

    async def _send_claims(
        self, guard: Guard, fires: list[Fire], requests: list[ClaimRequest]
    ) -> list[Held | Refused]:
        for fire in fires:
            self.events.claim_sent(fire.job, fire.identity)
        return await guard.claim_many(requests)

    async def _send_claim(self, guard: Guard, fire: Fire, request: ClaimRequest) -> Held | Refused:
        self.events.claim_sent(fire.job, fire.identity)
        return await guard.claim(request)

    def _given_up_here(self, fire: Fire) -> str | None:
        """Why a guard without history gives a tick up before claiming it: late, coalesced."""
        job, tick, superseded_at = fire.job, fire.tick, fire.superseded_at
        # A guard that remembers judges both in its claim, by the database's
        # clock, and records the miss itself: this replica's clock (stepped
        # forward, or running ahead) must not decide for the cluster. A tick
        # that never runs is never late: its claim says it is skipped.
        if self.guards(job).remembers or fire.skip_reason is not None:
            return None
        now = self.clock()
        if now - tick > job.misfire_grace:
            return "late"
        return "coalesced" if superseded_at is not None and now >= superseded_at else None

    def _misfire(
        self,
        job: JobConfig,
        bound: structlog.typing.FilteringBoundLogger,
        fire: Fire,
        cause: str,
        *,
        recorded: bool = False,
    ) -> FireOutcome:
        tick = fire.tick
        self.events.missed(job, fire.identity, tick, cause, recorded)
        bound.warning(
            "tick_missed",
            cause=cause,
            tick=tick.isoformat(),
            lateness_s=round((self.clock() - tick).total_seconds(), 3),
            misfire_grace_s=job.misfire_grace.total_seconds(),
        )
        return "misfire"

    async def _fire(
        self,
        fire: Fire,
        guard: Guard,
        bound: structlog.typing.FilteringBoundLogger,
        first: Answer | Literal["claim"],
        resumes: int | None,
    ) -> FireOutcome:
        """Claim, and carry out each step the decide table gives, until one ends the fire.

        ``first``: the answer of a claim made already (with ``resumes``, the
        resume count before it), acted on before any claim of its own.
        """
        job = fire.job
        # A run-once job must eventually run while one replica lives: it is
        # followed without the misfire bound of a tick; so is a started tick.
        started = fire.identity.type == "INITIAL" or fire.started
        # What this replica did with the tick so far; None: nothing yet.
        outcome: FireOutcome | None = None
        answer: Answer = None
        while True:
            if self.stopping.is_set() and first == "claim":
                return outcome or "lose"
            if first == "claim":
                resumes = self._resumes
                answer = await self._claim(
                    fire, guard, bound, started=started, first=outcome is None
                )
                if isinstance(answer, Refused) and answer.reason == "paused":
                    self.events.paused(job, True)
            else:
                # Claimed by the tick's chunk, which told the events already.
                answer, first = first, "claim"
                resumes = self._resumes if resumes is None else resumes
            in_force = self._in_force(job) if isinstance(answer, Held) else job
            state = State(
                fire.job,
                outcome=outcome,
                follow=fire.follow,
                stopping=self.stopping.is_set(),
                halted=self._halted,
                in_force=in_force is not None,
                skip_reason=fire.skip_reason,
            )
            step = decide(answer, state)
            if isinstance(answer, Held) and step.kind == "run" and in_force is not None:
                job = in_force
                answer = await self._run_won(fire, job, guard, answer, first=outcome is None)
                step = decide(answer, state)
            outcome = step.outcome
            started = started or step.started
            if step.kind == "follow":
                if step.lost:
                    self._lost(job, bound, answer)
                await self._sleep(step.wait.total_seconds())
            elif step.kind == "resume":
                assert isinstance(answer, Refused)
                await self._wait_for_resume(bound, answer, resumes)
            elif step.kind == "release":
                assert isinstance(answer, Held) and step.cause is not None
                await self._release_unstarted(job, guard, answer, bound, step.cause)
                return step.outcome or "lose"
            else:
                return self._end(fire, job, bound, answer, step)

    def _end(
        self,
        fire: Fire,
        job: JobConfig,
        bound: structlog.typing.FilteringBoundLogger,
        answer: Answer,
        step: Step,
    ) -> FireOutcome:
        """Carry out a step that ends the fire (miss, skip, done); what the fire came to."""
        if step.lost:
            self._lost(job, bound, answer)
        if step.kind == "miss":
            assert step.cause is not None
            return self._misfire(job, bound, fire, step.cause, recorded=step.recorded)
        if step.kind == "skip":
            self._skipped(job, bound, answer, step)
        return step.outcome or "lose"

    async def _claim(
        self,
        fire: Fire,
        guard: Guard,
        bound: structlog.typing.FilteringBoundLogger,
        *,
        started: bool,
        first: bool,
    ) -> Held | Refused | None:
        """One claim of ``fire``, retried through an outage; None: no answer came."""
        job = fire.job
        request = fire.claim_request(started=started, first=first)
        claim: Callable[[], Awaitable[Held | Refused | None]]
        claim = functools.partial(self._send_claim, guard, fire, request)
        if request.overlap.bounded:
            # Asked before every try: a run of the job here may be
            # abandoned while the claim retries through an outage.
            claim = functools.partial(self._claim_alone, job, bound, request.deadline, claim)
        return await self._with_outage_retry(job, "claim", claim, request.deadline)

    async def _run_won(
        self, fire: Fire, job: JobConfig, guard: Guard, held: Held, *, first: bool
    ) -> Ran:
        """Run a won claim as ``job`` (the config in force) and record it."""
        if held.identity.type == "INITIAL" or tick_of(held.identity.run_key or ""):
            self.events.paused(job, False)  # a tick ran: not paused
        if fire.on_start is not None and first:
            await fire.on_start()
        kind = attempt_trigger(fire.asks(first=first), held.claimed_from)
        outcome, retry = await self._run(job, guard, fire, held, kind)
        return Ran(outcome, retry)

    def _lost(
        self,
        job: JobConfig,
        bound: structlog.typing.FilteringBoundLogger,
        answer: Answer,
    ) -> None:
        assert isinstance(answer, Refused)
        self.events.claim_lost(job, answer.reason)
        bound.debug(
            "claim_lost",
            reason=answer.reason,
            status=answer.status,
            owner=answer.owner,
            cause=answer.cause,
            recheck_in_s=None if answer.wait is None else answer.wait.total_seconds(),
        )

    def _skipped(
        self,
        job: JobConfig,
        bound: structlog.typing.FilteringBoundLogger,
        answer: Answer,
        step: Step,
    ) -> None:
        reason = step.cause
        assert reason is not None
        self.events.skipped(job, reason)
        if reason == "paused":
            assert isinstance(answer, Refused)
            bound.info("tick_skipped", reason=reason, detail=answer.detail)
        elif reason == "overlap":
            detail = "the previous tick of this job is still running"
            bound.info("tick_skipped", reason=reason, detail=detail)
        else:
            # The fire's own reason (calendar:<name>); recorded: the guard stored it.
            bound.info("tick_skipped", reason=reason, recorded=step.recorded)

    def _in_force(self, job: JobConfig) -> JobConfig | None:
        """``job`` as the config in force defines it now; None once a reload removed it."""
        return job if self.jobs is None else self.jobs(job.code)

    async def _release_unstarted(
        self,
        job: JobConfig,
        guard: Guard,
        held: Held,
        bound: structlog.typing.FilteringBoundLogger,
        why: str,
    ) -> None:
        """Give back a claim that must not start: the replica is halted, or its job is gone.

        A claim won ahead of its tick waits for the tick; a forced stop or a
        reload may come meanwhile. Released (not run, not left RUNNING until
        its lease lapses), a live replica whose config still has the job takes it over.
        """
        bound.info("claim_released", reason=why, attempt=held.attempt)
        await self._with_outage_retry(
            job, "finalize", lambda: guard.record(held, Verdict("released", why)), None
        )

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
            # Looked at again each grid slot of the wheel: a thread gives no
            # signal when it ends.
            await wheel().sleep(GRID_S)

    async def _run(
        self, job: JobConfig, guard: Guard, fire: Fire, held: Held, kind: TriggerKind
    ) -> tuple[FireOutcome, bool]:
        """Run a won claim and record it; (what came of it, whether a retry follows)."""
        self.events.claim_won(job, held)
        self.events.run_trigger(job, held, kind)
        result: RunResult | None = None
        try:
            async with guard.hold(held):
                result = await self._execute(job, fire, held, guard, kind)
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
        # Bound only where a line is said: most records say none.
        bound = functools.partial(_held_bound, job, held)
        if result.outcome == "cancelled" and held.cancellation.reason in _LOST_REASONS:
            # Another replica may own the tick now: nothing is recorded, and
            # nothing must be, by a fenced owner.
            self.events.unrecorded(job, held, "lease_lost")
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
            bound().error(
                "outcome_not_recorded",
                outcome=result.outcome,
                detail="the replica stopped before the database came back",
            )
            raise
        except Exception as exc:
            # The guard kept failing (a bug, not an outage): the row stays
            # RUNNING until its lease lapses, and this replica follows the tick
            # like a lost lease, so that it is taken over, not left open.
            bound().exception(
                "outcome_not_recorded",
                outcome=result.outcome,
                error=_describe(exc),
                detail="followed until its lease lapses, then taken over",
            )
            self.events.unrecorded(job, held, "not_recorded")
            return "lease_lost", False
        if recorded == "fenced":
            bound().warning(
                "outcome_fenced",
                outcome=result.outcome,
                detail="another replica took this tick over meanwhile",
            )
            self.events.unrecorded(job, held, "fenced")
            return "lease_lost", False
        # The alert gauges: the table's truth at start, kept current by what
        # this replica records; a row with no retry time is a final failure.
        self.events.recorded(job, kind, final=retry_after is None)
        # A run-once job out of retries is retried by the next start, not now.
        retry = recorded == "retry" and held.attempt <= job.retries
        if kind == "success":
            self.events.succeeded(job, held, result)
        elif kind in ("fail", "timeout") and not retry:
            try:
                self.events.failed_for_good(job, held, result)
            except Exception as exc:
                bound().exception("failure_hook_crashed", error=_describe(exc))
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

    async def _execute(
        self, job: JobConfig, fire: Fire, held: Held, guard: Guard, kind: TriggerKind
    ) -> RunResult:
        tick = fire.tick
        identity, attempt, cancellation = held.identity, held.attempt, held.cancellation
        fencing_token, claimed_from = held.fencing_token, held.claimed_from
        run_key = identity.run_key or ""
        bound = log.bind(
            job=job.code,
            run_key=identity.run_key,
            idempotency_key=identity.idempotency_key,
            attempt=attempt,
            replica=self.replica,
            trigger=kind,
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
            trigger=kind,
            # A request's parameters after the job's own env: named by the operator.
            env={**job.env, **fire.params} if fire.params else job.env,
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


def _bound(fire: Fire) -> structlog.typing.FilteringBoundLogger:
    bound: structlog.typing.FilteringBoundLogger = log.bind(
        job=fire.job.code, run_key=fire.identity.run_key
    )
    return bound


def _held_bound(job: JobConfig, held: Held) -> structlog.typing.FilteringBoundLogger:
    bound: structlog.typing.FilteringBoundLogger = log.bind(
        job=job.code, run_key=held.identity.run_key, attempt=held.attempt
    )
    return bound


def _describe(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}"
