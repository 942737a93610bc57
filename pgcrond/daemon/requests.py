"""Requests on one replica: run the detached manual runs of ``pgcrond trigger --detach``.

A replica LISTENs on one connection of its own and, on a notification (and
once at start and after every reconnect), takes the pending requests of its
jobs with one bounded statement, then fires each through its guard exactly as
``pgcrond trigger`` does (``Firing.fire(job, now, Identity.schedule(code,
run_key))``): whichever replicas take it, the lease runs it once.

While a request of its jobs is open anywhere (taken by a replica that might
die), the replica takes again every :data:`SWEEP_EVERY_S` seconds: the same
statement keeps its own running requests taken and takes a dead taker's once
:data:`RETAKE_AFTER` passed. With no open request nothing is sent.

Behind a pooler in transaction mode (the start-up probe says so) LISTEN does
not work: the notification never reaches a client whose server connection
went back to the pool. The replica then says so in one log line and takes
requests every :data:`POLL_EVERY_S` seconds instead (one bounded statement
each): a request runs within that, and idle replicas are no longer silent. A
probe that could not tell ("unknown") listens *and* takes at that pace.

The listener also hears ``pgcrond resume`` and wakes the fires waiting for it
(:meth:`Firing.resumed`); when polling, those are woken at every poll.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime, timedelta
from typing import Any

import structlog

from pgcrond.config.models import Config, JobConfig
from pgcrond.core import params
from pgcrond.core.keys import Identity
from pgcrond.errors import PgcrondError, ValidationError
from pgcrond.fire import Fire, Firing
from pgcrond.storage.leases import LeaseStore
from pgcrond.storage.pooling import Pooling
from pgcrond.storage.requests import (
    Request,
    RequestListener,
    channel,
    finish_request,
    release_request,
    start_request,
    take_requests,
)

log = structlog.get_logger("pgcrond.daemon.requests")

# Behind transaction pooling: how often a replica takes requests instead.
POLL_EVERY_S = 5.0
# A request older than this is not run any more (e.g. made while no replica ran
# for days): it stays in the table, pending, for an operator to see.
REQUEST_WITHIN = timedelta(hours=24)
# A request taken and not kept taken for this long may be taken again (its
# taker died): firing it again is safe, the lease decides.
RETAKE_AFTER = timedelta(minutes=1)
# While a request is open: how often a replica takes again (one statement),
# which also keeps its own running requests taken. Below RETAKE_AFTER.
SWEEP_EVERY_S = 30.0
# Requests taken per statement; more are taken by the next statement at once.
TAKE_LIMIT = 100
# Reconnecting the listener: 0.5 s, doubling, at most 10 s.
RECONNECT_FIRST_S = 0.5
RECONNECT_MAX_S = 10.0
# Outcomes of a fire that ran the request here: at shutdown it is done only if
# its tick is final too (no retry pending).
_RAN = frozenset({"success", "fail", "timeout"})


class Requests:
    """Takes and runs this replica's requests; :meth:`run` for the daemon's life."""

    def __init__(
        self,
        *,
        store: LeaseStore,
        conninfo: str,
        config: Callable[[], Config],
        firing: Firing,
        tasks: set[asyncio.Task[Any]],
        stopping: asyncio.Event,
        replica: str,
        poll_every_s: float = POLL_EVERY_S,
        retake_after: timedelta = RETAKE_AFTER,
        sweep_every_s: float = SWEEP_EVERY_S,
    ) -> None:
        self.store = store
        self.conninfo = conninfo
        self.config = config
        self.firing = firing
        # The daemon's fire tasks: shutdown drains them, requests' too.
        self.tasks = tasks
        self.stopping = stopping
        self.replica = replica
        self.poll_every_s = poll_every_s
        self.retake_after = retake_after
        self.sweep_every_s = sweep_every_s
        self.channel = channel(store)
        self.resumed_channel = channel(store, "resumed")
        # Take statements sent (the idle cost, for tests and the docs).
        self.takes = 0
        # The requests this replica runs now, by id: every take keeps them
        # taken (so only a dead taker's go stale) and never takes them again.
        self._running: set[int] = set()
        # The last take said a request of these jobs is open somewhere.
        self._open = False

    async def run(self, pooling: Awaitable[Pooling]) -> None:
        """Wait for the pooling probe, then listen (or poll behind transaction pooling)."""
        found = await pooling
        if found.mode in ("transaction", "unknown"):
            log.warning(
                "requests_polled",
                mode=found.mode,
                every_s=self.poll_every_s,
                detail="LISTEN does not work through a pooler in transaction mode: this "
                f"replica takes `pgcrond trigger --detach` requests every {self.poll_every_s:g}s "
                "(one statement each)"
                + (
                    " instead of on a notification"
                    if found.transaction_pooled
                    else ", and listens too (the pooling probe could not tell)"
                ),
            )
        if found.transaction_pooled:
            await self._poll()
        else:
            await self._listen(every_s=self.poll_every_s if found.mode == "unknown" else None)

    async def _listen(self, every_s: float | None) -> None:
        """Listen; take on a notification, and every ``every_s`` (else while one is open)."""
        delay = RECONNECT_FIRST_S
        connected_before = False
        while not self.stopping.is_set():
            listener = RequestListener(
                self.conninfo,
                self.channel,
                self.resumed_channel,
                application_name=f"pgcrond-listen/{self.replica}",
            )
            try:
                await listener.open()
                log.info("requests_listening", channel=self.channel, reconnected=connected_before)
                connected_before, delay = True, RECONNECT_FIRST_S
                # What was requested (or resumed) while nobody (or not this
                # replica) listened.
                self.firing.resumed()
                await self.take()
                while not self.stopping.is_set():
                    timeout = every_s or (self.sweep_every_s if self._open else None)
                    heard = await listener.wait(timeout)
                    if self.resumed_channel in heard or (every_s and not heard):
                        self.firing.resumed()
                    if self.channel in heard or not heard:
                        await self.take()
            except PgcrondError as exc:
                if self.stopping.is_set():
                    return
                log.warning(
                    "requests_listener_lost",
                    error=str(exc),
                    retry_in_s=delay,
                    detail="requests are taken again once it reconnects",
                )
                await self._sleep(delay)
                delay = min(delay * 2, RECONNECT_MAX_S)
            finally:
                await listener.close()

    async def _poll(self) -> None:
        while not self.stopping.is_set():
            # No notification arrives here: a fire waiting out a pause asks again.
            self.firing.resumed()
            try:
                await self.take()
            except PgcrondError as exc:
                log.warning("requests_take_failed", error=str(exc), retry_in_s=self.poll_every_s)
            await self._sleep(self.poll_every_s)

    async def _sleep(self, seconds: float) -> None:
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self.stopping.wait(), seconds)

    async def take(self) -> int:
        """Take every pending request of this replica's jobs and start each; how many."""
        taken = 0
        while not self.stopping.is_set():
            jobs = self.config().jobs
            found = await take_requests(
                self.store,
                sorted(jobs),
                by=self.replica,
                within=REQUEST_WITHIN,
                retake_after=self.retake_after,
                limit=TAKE_LIMIT,
                running=sorted(self._running),
            )
            self.takes += 1
            self._open = found.open
            for request in found:
                self._start(request)
            taken += len(found)
            if len(found) < TAKE_LIMIT:
                break
        return taken

    def _start(self, request: Request) -> None:
        self._running.add(request.id)
        task = asyncio.create_task(
            self._run_request(request), name=f"request:{request.code}:{request.run_key}"
        )
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)
        task.add_done_callback(lambda _: self._running.discard(request.id))

    async def _run_request(self, request: Request) -> None:
        job = self.config().jobs.get(request.code)
        bound = log.bind(job=request.code, run_key=request.run_key)
        if job is None:  # removed by a reload since it was taken
            await self._give_back(request, bound)
            return
        bound.info(
            "request_taken",
            requested_by=request.requested_by,
            requested_at=request.requested_at.isoformat(),
            waited_s=round(request.waited.total_seconds(), 3),
            trigger=request.trigger,
            backfill=request.backfill_id,
            params=params.shown(request.params),
        )
        refused = _refused_params(job, request)
        if refused is None and request.concurrency is not None:
            try:
                job = job.with_concurrency(request.concurrency)
            except ValidationError as exc:
                refused = f"--concurrency {exc}"
        if refused is not None:
            # Made against another config (or not by pgcrond): nothing runs.
            bound.warning("request_refused", detail=refused)
            await self._finish(request, "refused", bound)
            return
        # A guard that remembers nothing (advisory) leaves the request row the
        # only record that its run started, and one that started is not run again.
        advisory = not self.firing.guards(job).remembers
        if advisory and request.started_at is not None:
            bound.warning(
                "request_outcome_unknown",
                started_at=request.started_at.isoformat(),
                detail="an earlier taker started this advisory-guarded run and did not record "
                "its end; it is not run again (request it again with another --run-key)",
            )
            await self._finish(request, "unknown", bound)
            return
        identity = Identity.schedule(request.code, request.run_key)

        async def started() -> None:
            try:
                await start_request(self.store, request, by=self.replica)
            except PgcrondError as exc:
                # It still runs: only a retake after a lost finish as well
                # would then run it again.
                bound.warning("request_start_not_recorded", error=str(exc))

        # An unexpected error is Firing's to record and log ("crashed").
        with structlog.contextvars.bound_contextvars(job=job.code, run_key=identity.run_key):
            outcome = await self.firing.fire(
                Fire(
                    job,
                    datetime.now(UTC),
                    identity,
                    # A backfill's tick has its row already (filed FAIL, due
                    # now): a retry of it, with no misfire bound.
                    started=request.backfill_id is not None,
                    on_start=started if advisory else None,
                    trigger=request.trigger,
                    params=request.params,
                )
            )
        if self.firing.stopping.is_set() and not await self._final(identity, outcome, advisory):
            # Stopped before it ran here, while it ran (its lease is released
            # for a survivor) or with a retry pending: another replica takes it
            # now and follows its tick to the end.
            await self._give_back(request, bound)
            return
        await self._finish(request, outcome, bound)

    async def _final(self, identity: Identity, outcome: str, advisory: bool) -> bool:
        """Whether a fire that ended at shutdown left its tick final (no retry pending).

        A fire follows its tick's retries until the tick is final, but its
        loop ends at shutdown: a failed attempt may have left a retry that no
        replica follows unless the request is taken again.
        """
        if outcome not in _RAN:
            return False
        if outcome == "success" or advisory:  # an advisory guard keeps no retry
            return True
        try:
            standing = (await self.store.standings([identity])).get(identity)
        except PgcrondError:
            return False  # cannot tell: given back, and the lease decides
        return standing is None or standing.settled

    async def _finish(
        self, request: Request, outcome: str, bound: structlog.typing.FilteringBoundLogger
    ) -> None:
        try:
            await finish_request(self.store, request, by=self.replica, outcome=outcome)
        except PgcrondError as exc:
            # Left taken: taken again after RETAKE_AFTER, and the lease says done.
            bound.warning("request_not_recorded", outcome=outcome, error=str(exc))
            return
        bound.info("request_done", outcome=outcome)

    async def _give_back(
        self, request: Request, bound: structlog.typing.FilteringBoundLogger
    ) -> None:
        try:
            await release_request(self.store, request, by=self.replica)
        except PgcrondError as exc:
            bound.warning("request_not_released", error=str(exc))
            return
        bound.info("request_released", detail="another replica takes it")


def _refused_params(job: JobConfig, request: Request) -> str | None:
    """Why ``request``'s parameters may not reach ``job``'s run, or None."""
    for name in request.params:
        problem = params.name_problem(name)
        if problem is None and job.params is not None and name not in job.params:
            problem = f"{name!r} is not among the job's params ({', '.join(job.params) or 'none'})"
        if problem is not None:
            return f"parameter {problem}"
    return None
