"""The lease table: claim, heartbeat, finalize, and ``run_exclusive``.

Every replica races the same identity; exactly one ``INSERT … ON CONFLICT``
claim wins. Each claim rotates the owner token (which fences the row: a stale
owner can no longer heartbeat or finalize) and draws a new fencing token
(which a downstream system can use to reject writes from an older holder).
All expiry decisions use the database clock, never a worker's.
"""

from __future__ import annotations

import asyncio
import functools
import time
import uuid
import weakref
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any, TypeVar, cast

import structlog

from pgcrond.core.actions import SqlWork
from pgcrond.core.keys import Identity
from pgcrond.core.overlap import ALLOW, Overlap
from pgcrond.core.replica import this_process
from pgcrond.core.timing import LeaseTiming, to_ms
from pgcrond.core.trigger import TriggerKind
from pgcrond.errors import LeaseLost, PgcrondError
from pgcrond.storage import sqljob
from pgcrond.storage.attempt_end import AttemptEnd, columns, finalize_columns
from pgcrond.storage.batch import TurnBatch
from pgcrond.storage.claim_answers import PendingClaim, claim_keys
from pgcrond.storage.claims import Acquired, NotAcquired, Renewal, Standing
from pgcrond.storage.db import Database, Params, Query
from pgcrond.storage.dbclock import ClockFloor
from pgcrond.storage.keepalive import holding
from pgcrond.storage.sql import Queries

T = TypeVar("T")
log = structlog.get_logger("pgcrond.storage.leases")

MAX_ERROR_LENGTH = 4000
# How long a finalize (or a look, ``standings``) waits for the outcomes of
# other runs still open on this replica (co-fired runs end close together,
# rarely in one loop turn, and a tick's look is due as they end), so they
# share one transaction; sent at once when no other run is open. It delays
# only the record and the look, never a run, and is small beside any lease.
FINALIZE_LINGER_S = 0.02


def storable(text: str) -> str:
    """``text`` as PostgreSQL can store it: no NUL, no lone surrogate, bounded.

    A job's error text is arbitrary (a child's stderr, an exception message);
    the database refuses NUL in text and the driver cannot encode a lone
    surrogate, and either must never stop an outcome from being recorded.
    """
    cleaned = text.replace("\x00", "\\0")
    cleaned = cleaned.encode("utf-8", "backslashreplace").decode("utf-8")
    return cleaned[:MAX_ERROR_LENGTH]


def default_owner() -> str:
    """This process's replica name (pgcrond.core.replica): for humans, never for fencing."""
    return this_process().name


class LeaseStore:
    """Lease operations on one table; async. See :mod:`pgcrond.storage.sync_store` for sync code."""

    def __init__(
        self,
        db: Database,
        *,
        schema: str = "pgcrond",
        table: str = "leases",
        owner: str | None = None,
        sql_db: Database | None = None,
        claim_ahead: timedelta = timedelta(0),
    ) -> None:
        """``sql_db``: where sql: jobs' transactions run (``Database.for_sql_jobs``); ``db``
        when not given, for tools that run one job on one connection. ``claim_ahead``:
        how long before its fire time (by the database clock) a claim may be won: the lease
        counts from the fire time, and the guard holds the run until then (the
        daemon's lead is the tick plan's, :mod:`pgcrond.tickplan`)."""
        self.db = db
        self._claim_ahead_ms = claim_ahead // timedelta(milliseconds=1)
        self.sql_db = db if sql_db is None else sql_db
        self.queries = Queries(schema, table)
        self.owner = owner or default_owner()
        # The database's clock from the claims' and heartbeats' answers.
        self.clock_floor = ClockFloor()
        # Leases won and not yet finalized: a hint only (a fenced lease is never
        # finalized, and leaves when it is dropped), so held weakly.
        self._unfinalized: weakref.WeakSet[Acquired] = weakref.WeakSet()
        # Outcomes and looks: what a replica writes and reads after a tick's runs.
        self._records: TurnBatch[bool | dict[Identity, Standing]] = TurnBatch(
            self._record_batch,
            keys=_lease_id,
            linger=FINALIZE_LINGER_S,
            expected=self._records_expected,
        )
        # When the next look is due (the loop's clock), as told by look_due.
        self._look_at: float | None = None
        self._beats: TurnBatch[Renewal | None] = TurnBatch(
            functools.partial(self._heartbeat_batch, revive=False), keys=_lease_id
        )
        self._wake_checks: TurnBatch[Renewal | None] = TurnBatch(
            functools.partial(self._heartbeat_batch, revive=True), keys=_lease_id
        )

    async def claim(
        self,
        identity: Identity,
        timing: LeaseTiming | None = None,
        *,
        overlap: Overlap = ALLOW,
        owner_token: uuid.UUID | None = None,
        fire_time: datetime | None = None,
        late_after: datetime | None = None,
        superseded_at: datetime | None = None,
        suspended: str | None = None,
        skip_reason: str | None = None,
        trigger: TriggerKind = "schedule",
    ) -> Acquired | NotAcquired:
        """Claim ``identity`` in one round trip; never takes a SUCCESS or live RUNNING row.

        Pass the same
        ``owner_token`` when retrying a claim whose answer was lost: a claim
        that did commit is then recognised as won, not as held by a stranger.
        ``fire_time`` / ``late_after``: by the database clock, a claim more
        than ``claim_ahead`` before the first is refused ``not_due`` (with
        the wait: a claim inside it is won, and the run waits for the fire
        time; a claim inside it that would record SKIPPED is refused
        ``not_due`` too and writes nothing), after the second
        ``late`` (and the tick, if it has no row, recorded MISSED/late).
        ``superseded_at``: when the job's next tick fires (late_ticks:
        coalesce); a first claim after it, by the database clock, is refused
        ``coalesced`` and the tick, if it has no row, recorded MISSED/coalesced
        (a row another replica wrote is answered as usual).
        A tick of a paused job (``pgcrond pause``), or of a ``suspended`` one
        (the text says where it is suspended), is recorded SKIPPED and refused
        ``paused``; a manual run key (not a tick's) is never paused.
        A tick with a ``skip_reason`` (``calendar:<name>``) is recorded
        SKIPPED with it, before any pause and at any lateness (never MISSED),
        and refused ``skipped``; one that has a row already is refused
        ``done`` (a replica whose config runs it follows it, not this one).
        ``trigger``: why the fire runs, for the attempt record the won claim starts.
        """
        request = PendingClaim(
            identity,
            timing or LeaseTiming.build(),
            owner_token or uuid.uuid4(),
            overlap if overlap.bounded and identity.type == "SCHEDULE" else None,
            fire_time,
            late_after,
            superseded_at,
            suspended,
            skip_reason,
            trigger,
        )
        return (await self.claim_many([request]))[0]

    async def claim_many(self, requests: Sequence[PendingClaim]) -> list[Acquired | NotAcquired]:
        """Claim every one of ``requests`` in one statement, answered in their order.

        As :meth:`claim` does one. A statement touches a row at most once,
        and cannot see the rows it inserts itself: a request that shares a
        key with an earlier one (the same identity, a second tick of the same
        forbid job) goes in a statement sent after the earlier one's answer.
        """
        answers: dict[int, Acquired | NotAcquired] = {}
        left = list(enumerate(requests))
        while left:
            seen: set[str] = set()
            now: list[tuple[int, PendingClaim]] = []
            later: list[tuple[int, PendingClaim]] = []
            for index, request in left:
                keys = claim_keys(request)
                if seen.intersection(keys):
                    later.append((index, request))
                else:
                    seen.update(keys)
                    now.append((index, request))
            answer = await self._claim([request for _, request in now])
            answers.update((index, answer(request)) for index, request in now)
            left = later
        return [answers[index] for index in range(len(requests))]

    async def _claim(
        self, batch: list[PendingClaim]
    ) -> Callable[[PendingClaim], Acquired | NotAcquired]:
        # The send time, not the time the batch started waiting for a
        # connection: the answer's age is judged from it.
        sent = [time.monotonic()]

        def on_send() -> None:
            sent[0] = time.monotonic()

        forbid_codes = sorted({r.identity.code for r in batch if r.overlap is not None})
        try:
            params = {
                "lock_keys": [r.identity.idempotency_key for r in batch],
                "types": [r.identity.type for r in batch],
                "codes": [r.identity.code for r in batch],
                "run_keys": [r.identity.run_key for r in batch],
                "owner_tokens": [r.token for r in batch],
                "lease_ms": [r.timing.lease_ms for r in batch],
                "overlap_policies": [r.overlap and r.overlap.policy for r in batch],
                "overlap_limits": [r.overlap and r.overlap.limit for r in batch],
                "fire_times": [r.fire_time for r in batch],
                "late_after": [r.late_after for r in batch],
                "superseded_at": [r.superseded_at for r in batch],
                "pausable": [r.identity.pausable for r in batch],
                "suspended": [r.suspended if r.identity.pausable else None for r in batch],
                "skip_reasons": [r.skip_reason for r in batch],
                "triggers": [r.trigger for r in batch],
                "owner": self.owner,
                "claim_ahead_ms": self._claim_ahead_ms,
            }
            if forbid_codes:
                # Same round trip, same transaction: the per-job lock first.
                params["forbid_codes"] = forbid_codes
                rows = await self.db.fetchall_after(
                    self.queries.get("forbid_lock"),
                    self.queries.get("claim"),
                    params,
                    on_send=on_send,
                )
            else:
                rows = await self.db.fetchall(self.queries.get("claim"), params, on_send=on_send)
        finally:
            received_at = time.monotonic()
        self._saw_clock(rows, received_at)
        by_key = {row["lock_key"]: row for row in rows}

        def answer(request: PendingClaim) -> Acquired | NotAcquired:
            outcome = request.outcome(
                by_key.get(request.identity.idempotency_key), sent[0], received_at
            )
            if isinstance(outcome, Acquired):
                self._unfinalized.add(outcome)
            return outcome

        return answer

    def _saw_clock(self, rows: list[dict[str, Any]], received_at: float) -> None:
        if rows:
            # Read row by row as the statement went: the last read is the tightest.
            self.clock_floor.saw(max(row["db_now"] for row in rows), received_at)

    async def standings(self, identities: Sequence[Identity]) -> dict[Identity, Standing]:
        """Where each tick stands now, in one statement; a tick with no row is left out.

        Read in the transaction of the finalizes sent with it: a look due
        while this replica's runs end waits for their outcomes as a finalize
        does (``FINALIZE_LINGER_S`` at most), and shares their round trip.
        """
        now = asyncio.get_running_loop().time()
        if self._look_at is not None and self._look_at <= now + FINALIZE_LINGER_S:
            self._look_at = None  # the look told of: no longer waited for
        return cast(
            "dict[Identity, Standing]", await self._records.submit(_Look(tuple(identities)))
        )

    def look_due(self, at: float) -> None:
        """A look (:meth:`standings`) is due at the loop's time ``at``.

        Outcomes recorded within ``FINALIZE_LINGER_S`` of it wait for it, as
        for the outcome of a run still open: a tick's look is due as its runs
        end, and one transaction carries both.
        """
        now = asyncio.get_running_loop().time()
        if self._look_at is None or self._look_at < now - FINALIZE_LINGER_S or at < self._look_at:
            self._look_at = at

    def _records_expected(self) -> int:
        """Requests the record batch waits for: the runs still open, and a look due now."""
        look = self._look_at
        now = asyncio.get_running_loop().time()
        due = look is not None and now - FINALIZE_LINGER_S < look <= now + FINALIZE_LINGER_S
        return len(self._unfinalized) + due

    async def heartbeat(self, lease: Acquired, *, revive: bool = False) -> timedelta | None:
        """Extend a live lease; how long it now has left, or None when fenced or lapsed.

        Heartbeats of co-running leases in one loop turn share one statement;
        each row is still matched by its own owner token. ``revive``: extend
        the lease even if it lapsed, as long as nobody claimed the row since
        (the owner's check after its loop stood still; see the query).
        """
        renewal = await self.renew(lease, revive=revive)
        return None if renewal is None else renewal.remaining

    def renew(self, lease: Acquired, *, revive: bool = False) -> asyncio.Future[Renewal | None]:
        """As :meth:`heartbeat`, with the database's clock at the answer."""
        return (self._wake_checks if revive else self._beats).submit(lease)

    async def _heartbeat_batch(
        self, leases: list[Acquired], *, revive: bool
    ) -> Callable[[Acquired], Renewal | None]:
        rows = await self.db.fetchall(
            self.queries.get("heartbeat"),
            {
                "ids": [lease.id for lease in leases],
                "owner_tokens": [lease.owner_token for lease in leases],
                "revive": revive,
            },
        )
        self._saw_clock(rows, time.monotonic())
        renewed = {
            row["id"]: Renewal(row["expires_at"] - row["db_now"], row["db_now"])
            for row in rows
            if not row["replaced"]
        }
        replaced = {row["id"] for row in rows if row["replaced"]}

        def answer(lease: Acquired) -> Renewal | None:
            if lease.id in replaced:
                # A newer tick replaced this one (concurrency: replace): the
                # lease is gone, and the run's owner is to record the stop.
                lease.cancellation.cancel("replaced")
            return renewed.get(lease.id)

        return answer

    def complete(self, lease: Acquired, end: AttemptEnd | None = None) -> asyncio.Future[bool]:
        """Record SUCCESS; False when fenced. A SUCCESS row is never claimed again.

        ``end`` (here and for :meth:`fail` and :meth:`release`): what the
        attempt left, for its attempt record, closed in the same statement.
        """
        return self._finalize(lease, "SUCCESS", None, None, None, end=end)

    async def close_attempt(self, lease: Acquired, status: str, end: AttemptEnd | None) -> None:
        """Tell a finished attempt's record what it left (an sql: job's committed SUCCESS)."""
        await self.db.execute(
            self.queries.get("attempt_close"),
            {"id": lease.id, "fencing_token": lease.fencing_token, "status": status,
             "error": None, **columns(end)},
        )  # fmt: skip

    async def complete_with(self, lease: Acquired, work: SqlWork) -> bool:
        """Run an sql: job's statements and record SUCCESS in one transaction; False when fenced.

        On the sql: jobs' own connections (``sql_db``); see :mod:`pgcrond.storage.sqljob`.
        """
        self._unfinalized.discard(lease)
        return await sqljob.commit_with(self.sql_db, self.queries, lease, work)

    def fail(
        self,
        lease: Acquired,
        error: str,
        *,
        reason: str = "error",
        retry_after: timedelta | None = timedelta(0),
        end: AttemptEnd | None = None,
    ) -> asyncio.Future[bool]:
        """Record FAIL; False when fenced. ``retry_after=None`` makes the failure final."""
        return self._finalize(lease, "FAIL", reason, error, retry_after, end=end)

    def replaced(self, lease: Acquired, end: AttemptEnd | None = None) -> asyncio.Future[bool]:
        """Record that a replaced run stopped (SKIPPED/replaced): the job's slot is free.

        Only for a lease a newer tick marked replaced (its heartbeat said so);
        False otherwise, or when fenced.
        """
        return self._finalize(
            lease, "SKIPPED", "replaced", "stopped: a newer tick replaced it", None, end=end
        )

    def release(self, lease: Acquired, end: AttemptEnd | None = None) -> asyncio.Future[bool]:
        """Give a running claim back (e.g. at shutdown) so that a survivor may take it."""
        return self._finalize(
            lease, "FAIL", "released", "released by its owner", timedelta(0), end=end
        )

    async def give_back(self, lease: Acquired, late_after: datetime) -> str | None:
        """Give back a claim that ran nothing; the database judges its window (``give_back``).

        "released": inside the window, reclaimable at once with the attempt
        not counted; "late": closed for good; None: fenced (nothing changed).
        """
        self._unfinalized.discard(lease)
        row = await self.db.fetchone(
            self.queries.get("give_back"),
            {"id": lease.id, "owner_token": lease.owner_token, "late_after": late_after},
        )
        return None if row is None else str(row["reason"])

    def _finalize(
        self,
        lease: Acquired,
        status: str,
        reason: str | None,
        error: str | None,
        retry_after: timedelta | None,
        *,
        end: AttemptEnd | None,
    ) -> asyncio.Future[bool]:
        """Record an outcome; co-finishing runs share one statement (see FINALIZE_LINGER_S)."""
        self._unfinalized.discard(lease)
        outcome = _Outcome(
            lease,
            status,
            reason,
            None if error is None else storable(error),
            None if retry_after is None else to_ms(retry_after),
            end,
        )
        # Only an outcome's answer is a bool (_record_batch).
        return cast("asyncio.Future[bool]", self._records.submit(outcome))

    async def _record_batch(
        self, requests: list[_Outcome | _Look]
    ) -> Callable[[_Outcome | _Look], bool | dict[Identity, Standing]]:
        """The batch's finalizes and looks: one statement each, both in one transaction."""
        outcomes = [r for r in requests if isinstance(r, _Outcome)]
        looks = {i.idempotency_key: i for r in requests if isinstance(r, _Look) for i in r.ticks}
        statements: list[tuple[Query, Params]] = []
        if outcomes:
            statements.append((self.queries.get("finalize"), _finalize_params(outcomes)))
        if looks:
            statements.append((self.queries.get("standings"), {"lock_keys": list(looks)}))
        if len(statements) == 1:
            answers = [await self.db.fetchall(*statements[0])]
        else:
            answers = await self.db.fetchall_each(statements)
        recorded = {row["id"] for row in answers[0]} if outcomes else set()
        standings = {looks[row["lock_key"]]: _standing(row) for row in answers[-1]} if looks else {}

        def answer(request: _Outcome | _Look) -> bool | dict[Identity, Standing]:
            if isinstance(request, _Look):
                return {i: standings[i] for i in request.ticks if i in standings}
            # A finalize given up on was sent all the same (or, given up before
            # the send, is not): its caller retries it, and a repeated finalize
            # that did land is recorded again (see the finalize query).
            return request.lease.id in recorded

        return answer

    async def run_exclusive(
        self,
        identity: Identity,
        fn: Callable[[Acquired], Awaitable[T]],
        *,
        timing: LeaseTiming | None = None,
        overlap: Overlap = ALLOW,
        retry_after: timedelta | None = timedelta(0),
    ) -> T | NotAcquired:
        """Acquire, heartbeat while ``fn(lease)`` runs, record its outcome.

        The job's exception is recorded as FAIL (reclaimable after
        ``retry_after``; None makes it final) and re-raised. When the lease was
        lost meanwhile (``lease.cancellation`` tells ``fn``), nothing is
        recorded as success: :class:`LeaseLost` is raised instead.
        """
        lease = await self.claim(identity, timing, overlap=overlap)
        if isinstance(lease, NotAcquired):
            return lease
        async with holding(lease, self.heartbeat):
            try:
                value = await fn(lease)
            except Exception as exc:
                try:
                    await self.fail(lease, f"{type(exc).__name__}: {exc}", retry_after=retry_after)
                except PgcrondError as record_exc:
                    # The job's own exception is the one the caller must see.
                    log.error(
                        "outcome_not_recorded",
                        job=identity.code,
                        run_key=identity.run_key,
                        error=str(record_exc),
                    )
                raise
        if lease.cancellation.is_set():
            raise LeaseLost(f"lease of {identity} lost ({lease.cancellation.reason})")
        if not await self.complete(lease):
            raise LeaseLost(f"lease of {identity} was taken over before it completed")
        return value


def _lease_id(request: Acquired | _Outcome | _Look) -> list[int]:
    if isinstance(request, _Look):
        return []  # a look only reads: any number share a statement
    lease = request.lease if isinstance(request, _Outcome) else request
    return [lease.id]


def _finalize_params(outcomes: list[_Outcome]) -> dict[str, Any]:
    return {
        "ids": [o.lease.id for o in outcomes],
        "owner_tokens": [o.lease.owner_token for o in outcomes],
        "statuses": [o.status for o in outcomes],
        "reasons": [o.reason for o in outcomes],
        "errors": [o.error for o in outcomes],
        "retry_ms": [o.retry_ms for o in outcomes],
        "fencing_tokens": [o.lease.fencing_token for o in outcomes],
        **finalize_columns([o.end for o in outcomes]),
    }


def _standing(row: dict[str, Any]) -> Standing:
    wait = None if row["wait_s"] is None else timedelta(seconds=float(row["wait_s"]))
    return Standing(status=row["status"], settled=row["settled"], wait=wait)


@dataclass(frozen=True)
class _Outcome:
    lease: Acquired
    status: str
    reason: str | None
    error: str | None
    retry_ms: int | None
    end: AttemptEnd | None = None


@dataclass(frozen=True)
class _Look:
    """A look at where ticks stand (``standings``), sent with the outcomes of its turn."""

    ticks: tuple[Identity, ...]
