"""Requests on one replica: run the detached manual runs of ``pgcrond trigger --detach``.

A replica LISTENs on one connection of its own and, on a notification (and
once at start and after every reconnect), takes the pending requests of its
jobs with one bounded statement, then fires each through its guard exactly as
``pgcrond trigger`` does (``Firing.fire(job, now, Identity.schedule(code,
run_key))``): whichever replicas take it, the lease runs it once. While idle
nothing is sent.

Behind a pooler in transaction mode (the start-up probe says so) LISTEN does
not work: the notification never reaches a client whose server connection
went back to the pool. The replica then says so in one log line and takes
requests every :data:`POLL_EVERY_S` seconds instead (one bounded statement
each): a request runs within that, and idle replicas are no longer silent.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime, timedelta
from typing import Any

import structlog

from pgcrond.config.loader import Config
from pgcrond.core.keys import Identity
from pgcrond.errors import PgcrondError
from pgcrond.fire import FireOutcome, Firing
from pgcrond.storage.leases import LeaseStore
from pgcrond.storage.pooling import Pooling
from pgcrond.storage.requests import (
    Request,
    RequestListener,
    channel,
    finish_request,
    release_request,
    take_requests,
)

log = structlog.get_logger("pgcrond.daemon.requests")

# Behind transaction pooling: how often a replica takes requests instead.
POLL_EVERY_S = 5.0
# A request older than this is not run any more (e.g. made while no replica ran
# for days): it stays in the table, pending, for an operator to see.
REQUEST_WITHIN = timedelta(hours=24)
# A request taken this long ago and not done may be taken again (its taker may
# have died before it claimed): firing it again is safe, the lease decides.
RETAKE_AFTER = timedelta(minutes=1)
# Requests taken per statement; more are taken by the next statement at once.
TAKE_LIMIT = 100
# Reconnecting the listener: 0.5 s, doubling, at most 10 s.
RECONNECT_FIRST_S = 0.5
RECONNECT_MAX_S = 10.0
# Outcomes after which the request is done even at shutdown: it ran here.
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
        self.channel = channel(store)

    async def run(self, pooling: Awaitable[Pooling]) -> None:
        """Wait for the pooling probe, then listen (or poll behind transaction pooling)."""
        found = await pooling
        if found.transaction_pooled:
            log.warning(
                "requests_polled",
                every_s=self.poll_every_s,
                detail="LISTEN does not work through a pooler in transaction mode: this "
                f"replica takes `pgcrond trigger --detach` requests every {self.poll_every_s:g}s "
                "(one statement each) instead of on a notification",
            )
            await self._poll()
        else:
            await self._listen()

    async def _listen(self) -> None:
        delay = RECONNECT_FIRST_S
        connected_before = False
        while not self.stopping.is_set():
            listener = RequestListener(
                self.conninfo, self.channel, application_name=f"pgcrond-listen/{self.replica}"
            )
            try:
                await listener.open()
                log.info("requests_listening", channel=self.channel, reconnected=connected_before)
                connected_before, delay = True, RECONNECT_FIRST_S
                # What was requested while nobody (or not this replica) listened.
                await self.take()
                while not self.stopping.is_set():
                    await listener.wait()
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
                retake_after=RETAKE_AFTER,
                limit=TAKE_LIMIT,
            )
            for request in found:
                self._start(request)
            taken += len(found)
            if len(found) < TAKE_LIMIT:
                break
        return taken

    def _start(self, request: Request) -> None:
        task = asyncio.create_task(
            self._run_request(request), name=f"request:{request.code}:{request.run_key}"
        )
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)

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
        )
        identity = Identity.schedule(request.code, request.run_key)
        outcome: FireOutcome | str
        try:
            with structlog.contextvars.bound_contextvars(job=job.code, run_key=identity.run_key):
                outcome = await self.firing.fire(job, datetime.now(UTC), identity)
        except Exception:
            bound.exception("fire_crashed")
            outcome = "crashed"
        if self.firing.stopping.is_set() and outcome not in _RAN:
            # Stopped before it ran here (or while it ran: its lease is
            # released for a survivor): another replica takes it now.
            await self._give_back(request, bound)
            return
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
