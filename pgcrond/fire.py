"""One fire, start to end: misfire check -> guard -> runner -> record.

Every replica fires every tick; this module decides, through the job's guard,
whether this replica runs it, runs it, and records the outcome. The daemon
calls :meth:`Firing.fire` for each tick APScheduler hands it; ``pgcrond
trigger`` calls it once for a manual run.

Lease mode, in short:

* claim (one round trip); a loss because the tick is **held** by a live lease
  is followed: the replica checks again once that lease could have expired,
  and a survivor reclaims the tick of a dead winner (**takeover**) as long as
  that happens within ``misfire_grace`` of the tick;
* the winner heartbeats while the runner runs, then records SUCCESS or FAIL as
  the current owner only; a failure with retries left is recorded with a retry
  time, and claimed again through the lease, so exactly one replica retries;
* a database outage is retried with backoff: a claim until ``misfire_grace``
  runs out, an outcome until it lands (or the lease is known lost).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import math
import time
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any, Literal, TypeVar

import structlog

from pgcrond.config.loader import JobConfig
from pgcrond.core.keys import Identity
from pgcrond.core.retry import retry_delay
from pgcrond.core.timing import MAX_STOP_GRACE
from pgcrond.daemon.metrics import Metrics
from pgcrond.errors import DatabaseUnavailable
from pgcrond.run.cancel import Cancellation
from pgcrond.run.runner import RunRequest, RunResult, execute
from pgcrond.storage.advisory import advisory_lock
from pgcrond.storage.db import Database
from pgcrond.storage.leases import Acquired, LeaseStore, NotAcquired

T = TypeVar("T")
log = structlog.get_logger("pgcrond.fire")

# What one fire came to on this replica. "lose": its claim lost (another replica
# runs or ran the tick); "lease_lost": it won, but lost the lease while running.
FireOutcome = Literal[
    "success", "fail", "timeout", "cancelled", "lease_lost", "lose", "skip", "misfire"
]

# Outage retries: fast enough to catch a database restart, slow enough not to
# hammer a struggling server.
_BACKOFF_FIRST = 0.2
_BACKOFF_MAX = 5.0
# Re-check a held lease a little after it could have expired, so the holder's
# last heartbeat and clock jitter do not make the check land just before it.
_FOLLOW_MARGIN = timedelta(milliseconds=100)
_LOST_REASONS = frozenset({"lease_lost", "lease_expired", "lock_lost"})
# Re-checks wake together on a grid of the loop's clock, so that the re-checks
# of co-firing ticks (whose leases expire a few ms apart) share one claim.
_RECHECK_GRID_S = 0.25


@dataclass
class Firing:
    """Shared state of one replica: where to claim, what to count, how to stop."""

    store: LeaseStore
    advisory_db: Database
    metrics: Metrics
    replica: str
    # Set at shutdown: no new claims, followers give up, runs get stop_grace.
    stopping: asyncio.Event = field(default_factory=asyncio.Event)
    running: dict[str, Cancellation] = field(default_factory=dict)
    clock: Callable[[], datetime] = field(default=lambda: datetime.now(UTC))
    _slots: dict[float, asyncio.Future[None]] = field(default_factory=dict, repr=False)

    async def fire(
        self, job: JobConfig, tick: datetime, identity: Identity, *, follow: bool = True
    ) -> FireOutcome:
        """Handle one fire of ``job`` for ``tick``; returns what this replica did.

        ``follow=False`` returns at the first lost claim instead of waiting to
        take over or retry (``pgcrond trigger`` reports and exits).
        """
        self.metrics.fires.labels(job.code).inc()
        bound = log.bind(job=job.code, run_key=identity.run_key)
        if identity.type == "SCHEDULE" and self._too_late(job, tick):
            return self._misfire(job, bound, tick, "late")
        if job.guard == "advisory":
            return await self._fire_advisory(job, tick, identity, bound)
        return await self._fire_lease(job, tick, identity, bound, follow)

    def _too_late(self, job: JobConfig, tick: datetime) -> bool:
        return self.clock() - tick > job.misfire_grace

    def _misfire(
        self,
        job: JobConfig,
        bound: structlog.typing.FilteringBoundLogger,
        tick: datetime,
        cause: str,
    ) -> FireOutcome:
        self.metrics.misfires.labels(job.code).inc()
        bound.warning(
            "tick_missed",
            cause=cause,
            tick=tick.isoformat(),
            lateness_s=round((self.clock() - tick).total_seconds(), 3),
            misfire_grace_s=job.misfire_grace.total_seconds(),
        )
        return "misfire"

    # -- lease mode ---------------------------------------------------------

    async def _fire_lease(
        self,
        job: JobConfig,
        tick: datetime,
        identity: Identity,
        bound: structlog.typing.FilteringBoundLogger,
        follow: bool,
    ) -> FireOutcome:
        # A run-once job must eventually run while one replica lives: it is
        # followed without the misfire bound of a tick.
        deadline = None if identity.type == "INITIAL" else tick + job.misfire_grace
        forbid = job.concurrency == "forbid"
        outcome: FireOutcome | None = None  # set once this replica ran or lost the tick
        while not self.stopping.is_set():
            # One token per claim, reused while the claim is retried through an
            # outage: a try that committed but lost its answer still counts as won.
            token = uuid.uuid4()
            claim = await self._with_outage_retry(
                job,
                "claim",
                functools.partial(
                    self.store.acquire,
                    identity,
                    job.timing,
                    forbid_overlap=forbid,
                    owner_token=token,
                ),
                deadline,
            )
            if claim is None:
                # Still unreachable at the end of the misfire window. A tick
                # this replica already ran or lost is not a miss of its own.
                if outcome is None:
                    return self._misfire(job, bound, tick, "database_unavailable")
                return outcome
            if isinstance(claim, Acquired):
                outcome = await self._run_lease(job, tick, claim)
                if outcome not in ("fail", "timeout") or claim.attempt > job.retries:
                    return outcome
                # The failure was recorded with a retry time; the next claim
                # says how long until then (by the database clock). The winner
                # follows its own retries, like every other replica may.
                deadline = None  # a started tick's retries are not misfires
                continue
            if claim.reason == "overlap":
                self.metrics.skips.labels(job.code, "overlap").inc()
                bound.info(
                    "tick_skipped",
                    reason="overlap",
                    detail="the previous tick of this job is still running",
                )
                return "skip"
            if outcome is None:
                outcome = "lose"
                self.metrics.losses.labels(job.code, claim.reason).inc()
                bound.debug(
                    "claim_lost",
                    reason=claim.reason,
                    status=claim.status,
                    owner=claim.owner,
                    recheck_in_s=None if claim.wait is None else claim.wait.total_seconds(),
                )
            # Without follow (`pgcrond trigger`) only this replica's own retries
            # are followed: a tick it lost is left to the daemons.
            wait = self._follow(job, bound, claim, deadline)
            if wait is None or (outcome == "lose" and not follow):
                return outcome
            await self._sleep_on_grid(wait)
        return outcome or "lose"

    def _follow(
        self,
        job: JobConfig,
        bound: structlog.typing.FilteringBoundLogger,
        refusal: NotAcquired,
        deadline: datetime | None,
    ) -> float | None:
        """Seconds to wait before claiming again, or None to stop following."""
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
        recheck_at = self.clock() + refusal.wait + _FOLLOW_MARGIN
        if deadline is not None and recheck_at > deadline:
            if refusal.reason == "held":
                bound.debug(
                    "takeover_out_of_reach",
                    owner=refusal.owner,
                    lease_free_at=recheck_at.isoformat(),
                    misfire_deadline=deadline.isoformat(),
                )
            return None
        return (refusal.wait + _FOLLOW_MARGIN).total_seconds()

    async def _run_lease(self, job: JobConfig, tick: datetime, lease: Acquired) -> FireOutcome:
        self.metrics.wins.labels(job.code).inc()
        if lease.claimed_from == "takeover":
            self.metrics.takeovers.labels(job.code).inc()
        heartbeat_failures = self.metrics.heartbeat_failures.labels(job.code)
        async with self.store.holding(lease, lambda _: heartbeat_failures.inc()):
            result = await self._execute(
                job,
                tick,
                lease.identity,
                attempt=lease.attempt,
                fencing_token=lease.fencing_token,
                cancellation=lease.cancellation,
                claimed_from=lease.claimed_from,
                stop_grace=lease.timing.stop_grace,
            )
        # Heartbeats end with the run: one racing the finalize would find the
        # row finished and cry "lease lost".
        return await self._record(job, lease, result)

    async def _record(self, job: JobConfig, lease: Acquired, result: RunResult) -> FireOutcome:
        """Record the outcome as the current owner; retried through an outage."""
        bound = log.bind(job=job.code, run_key=lease.identity.run_key, attempt=lease.attempt)
        reason = lease.cancellation.reason
        if result.outcome == "cancelled" and reason in _LOST_REASONS:
            # Another replica may own the tick now: nothing is recorded, and
            # nothing must be, by a fenced owner.
            return "lease_lost"
        if result.outcome == "success":
            write = lambda: self.store.complete(lease)  # noqa: E731
        elif result.outcome == "cancelled":
            # Shutdown: give the tick back so that a survivor can take it over.
            write = lambda: self.store.release(lease)  # noqa: E731
        else:
            retry_after: timedelta | None = None
            if lease.attempt <= job.retries:
                retry_after = retry_delay(lease.attempt, job.retry_delay)
            elif lease.identity.type == "INITIAL":
                # A run-once job is never given up on for good: the next start
                # of any replica tries it again.
                retry_after = job.retry_delay
            write = lambda: self.store.fail(  # noqa: E731
                lease,
                result.error or result.outcome,
                reason="timeout" if result.outcome == "timeout" else "error",
                retry_after=retry_after,
            )
        try:
            recorded = await self._with_outage_retry(job, "finalize", write, None)
        except asyncio.CancelledError:
            bound.error(
                "outcome_not_recorded",
                outcome=result.outcome,
                detail="the replica stopped before the database came back",
            )
            raise
        if not recorded:
            bound.warning(
                "outcome_fenced",
                outcome=result.outcome,
                detail="another replica took this tick over meanwhile",
            )
            return "lease_lost"
        if result.outcome == "success":
            self.metrics.last_success.labels(job.code).set(time.time())
        return result.outcome

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
        while True:
            try:
                return await call()
            except DatabaseUnavailable as exc:
                self.metrics.database_errors.labels(operation).inc()
                log.warning(
                    "database_unavailable",
                    job=job.code,
                    operation=operation,
                    error=str(exc),
                    retry_in_s=delay,
                )
            if deadline is not None and self.clock() + timedelta(seconds=delay) > deadline:
                return None
            if operation == "claim" and self.stopping.is_set():
                return None
            await asyncio.sleep(delay)
            delay = min(delay * 2, _BACKOFF_MAX)

    async def _sleep_on_grid(self, seconds: float) -> None:
        """Sleep at least ``seconds``, waking with every follower of the same grid slot."""
        loop = asyncio.get_running_loop()
        slot = math.ceil((loop.time() + seconds) / _RECHECK_GRID_S) * _RECHECK_GRID_S
        wake = self._slots.get(slot)
        if wake is None:
            wake = self._slots[slot] = loop.create_future()
            loop.call_at(slot, self._ring, slot)
        stop: asyncio.Future[Any] = asyncio.ensure_future(self.stopping.wait())
        try:
            await asyncio.wait({wake, stop}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            stop.cancel()

    def _ring(self, slot: float) -> None:
        self._slots.pop(slot).set_result(None)

    async def _sleep(self, seconds: float) -> None:
        """Sleep, but wake at once when the replica starts stopping."""
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self.stopping.wait(), seconds)

    # -- advisory mode ------------------------------------------------------

    async def _fire_advisory(
        self,
        job: JobConfig,
        tick: datetime,
        identity: Identity,
        bound: structlog.typing.FilteringBoundLogger,
    ) -> FireOutcome:
        key = job.lock_key if job.lock_key is not None else job.code
        try:
            async with advisory_lock(
                self.advisory_db, key, key_hash=job.key_hash, min_hold=job.min_hold, tick=tick
            ) as lock:
                if not lock.acquired:
                    self.metrics.losses.labels(job.code, "held").inc()
                    bound.debug("claim_lost", reason="held", guard="advisory")
                    return "lose"
                self.metrics.wins.labels(job.code).inc()
                attempt = 1
                while True:
                    # Each attempt has its own signal (a timeout ends only that
                    # attempt), which the lock's loss or shutdown also sets.
                    result = await self._execute(
                        job,
                        tick,
                        identity,
                        attempt=attempt,
                        fencing_token=None,
                        cancellation=lock.cancellation.child(),
                        claimed_from=None,
                    )
                    if lock.lost or (
                        result.outcome == "cancelled" and lock.cancellation.reason in _LOST_REASONS
                    ):
                        return "lease_lost"
                    if result.outcome not in ("fail", "timeout") or attempt > job.retries:
                        if result.outcome == "success":
                            self.metrics.last_success.labels(job.code).set(time.time())
                        return result.outcome
                    # Advisory mode remembers nothing: retries happen here,
                    # under the same lock, or not at all.
                    await self._sleep(retry_delay(attempt, job.retry_delay).total_seconds())
                    if self.stopping.is_set():
                        return result.outcome
                    attempt += 1
        except DatabaseUnavailable as exc:
            self.metrics.database_errors.labels("advisory_lock").inc()
            bound.warning("database_unavailable", operation="advisory_lock", error=str(exc))
            return self._misfire(job, bound, tick, "database_unavailable")

    # -- both ---------------------------------------------------------------

    async def _execute(
        self,
        job: JobConfig,
        tick: datetime,
        identity: Identity,
        *,
        attempt: int,
        fencing_token: int | None,
        cancellation: Cancellation,
        claimed_from: str | None,
        stop_grace: timedelta = MAX_STOP_GRACE,
    ) -> RunResult:
        run_key = identity.run_key or ""
        started = self.clock()
        lateness = (started - tick).total_seconds()
        self.metrics.lateness.labels(job.code).observe(max(lateness, 0.0))
        bound = log.bind(
            job=job.code,
            run_key=identity.run_key,
            idempotency_key=identity.idempotency_key,
            attempt=attempt,
            replica=self.replica,
        )
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
            fire_time=tick,
            attempt=attempt,
            idempotency_key=identity.idempotency_key,
            idempotency_key_hex=identity.idempotency_key_hex,
            fencing_token=fencing_token,
            env=job.env,
            cwd=job.cwd,
            timeout=job.timeout,
            stop_grace=stop_grace,
        )
        run_id = f"{identity}#{attempt}"
        self.running[run_id] = cancellation
        self.metrics.running.labels(job.code).inc()
        try:
            result = await execute(request, cancellation)
        finally:
            self.metrics.running.labels(job.code).dec()
            del self.running[run_id]
        outcome: str = result.outcome
        if outcome == "cancelled" and cancellation.reason in _LOST_REASONS:
            outcome = "lease_lost"
        self.metrics.run_duration.labels(job.code).observe(result.duration_s)
        self.metrics.runs.labels(job.code, outcome).inc()
        level = bound.info if outcome == "success" else bound.warning
        level(
            "run_finished",
            outcome=outcome,
            duration_ms=round(result.duration_s * 1000, 1),
            error=result.error,
            exit_code=result.exit_code,
        )
        return result
