"""The lease table: claim, heartbeat, finalize, and ``run_exclusive``.

Every replica races the same identity; exactly one ``INSERT … ON CONFLICT``
claim wins. Each claim rotates the owner token (which fences the row: a stale
owner can no longer heartbeat or finalize) and draws a new fencing token
(which a downstream system can use to reject writes from an older holder).
All expiry decisions use the database clock, never a worker's.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import math
import time
import uuid
import weakref
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any, TypeVar

import structlog

from pgcrond.core.actions import SqlWork
from pgcrond.core.keys import Identity, lock_id
from pgcrond.core.replica import this_process
from pgcrond.core.schedule import tick_of
from pgcrond.core.timing import LeaseTiming, to_ms
from pgcrond.errors import LeaseLost, PgcrondError
from pgcrond.storage import sqljob
from pgcrond.storage.attempt_end import AttemptEnd, columns, finalize_columns
from pgcrond.storage.batch import TurnBatch
from pgcrond.storage.claims import Acquired, NotAcquired, NotAcquiredReason, Renewal
from pgcrond.storage.db import Database
from pgcrond.storage.sql import Queries, migrations

T = TypeVar("T")
log = structlog.get_logger("pgcrond.storage.leases")

MAX_ERROR_LENGTH = 4000
# How long a finalize waits for the outcomes of other runs still open on this
# replica (co-fired runs end close together, rarely in one loop turn), so they
# share one statement; sent at once when no other run is open. It delays only
# the record, never a run, and is small beside any lease.
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
    """Lease operations on one table; async. See :class:`SyncLeaseStore` for sync code."""

    def __init__(
        self,
        db: Database,
        *,
        schema: str = "pgcrond",
        table: str = "leases",
        owner: str | None = None,
        sql_db: Database | None = None,
    ) -> None:
        """``sql_db``: where sql: jobs' transactions run (``Database.for_sql_jobs``); ``db``
        when not given, for tools that run one job on one connection."""
        self.db = db
        self.sql_db = db if sql_db is None else sql_db
        self.queries = Queries(schema, table)
        self.owner = owner or default_owner()
        self._claims: TurnBatch[Acquired | NotAcquired] = TurnBatch(self._claim, keys=_claim_keys)
        # Leases won and not yet finalized: a hint only (a fenced lease is never
        # finalized, and leaves when it is dropped), so held weakly.
        self._unfinalized: weakref.WeakSet[Acquired] = weakref.WeakSet()
        self._finalizes: TurnBatch[bool] = TurnBatch(
            self._finalize_batch,
            keys=_lease_id,
            linger=FINALIZE_LINGER_S,
            expected=lambda: len(self._unfinalized),
        )
        self._beats: TurnBatch[Renewal | None] = TurnBatch(self._heartbeat_batch, keys=_lease_id)

    async def migrate(self) -> list[int]:
        """Create or upgrade the table; safe when many replicas migrate at once.

        An up-to-date table is recognised without any DDL, so a role that may
        only read and write the table can start replicas once it is migrated.
        """
        if await self._up_to_date():
            return []
        applied_now: list[int] = []
        async with self.db.connection() as conn, conn.transaction():
            await conn.execute(
                self.queries.get("migration_lock"),
                {"lock_id": lock_id(f"migrate:{self.queries.schema}")},
            )
            # CREATE SCHEMA IF NOT EXISTS needs CREATE on the whole database
            # even when the schema exists; a least-privilege role owns only its
            # schema, so ask first.
            cursor = await conn.execute(
                self.queries.get("schema_exists"), {"schema": self.queries.schema}
            )
            found = await cursor.fetchone()
            if not (found and found["present"]):
                await conn.execute(self.queries.create_schema())
            await conn.execute(self.queries.get("migrations_table"))
            cursor = await conn.execute(self.queries.get("applied_migrations"))
            done = {row["version"] for row in await cursor.fetchall()}
            for version, template in migrations():
                if version in done:
                    continue
                # A migration holds several statements: never prepared, even
                # with database.prepared_statements on.
                await conn.execute(self.queries.migration(template), prepare=False)
                await conn.execute(self.queries.get("record_migration"), {"version": version})
                applied_now.append(version)
        return applied_now

    async def _up_to_date(self) -> bool:
        async with self.db.connection() as conn:
            cursor = await conn.execute(
                self.queries.get("table_exists"), {"name": self.queries.migrations_name}
            )
            found = await cursor.fetchone()
            if not (found and found["present"]):
                return False
            cursor = await conn.execute(self.queries.get("applied_migrations"))
            done = {row["version"] for row in await cursor.fetchall()}
        return {version for version, _ in migrations()} <= done

    async def claim(
        self,
        identity: Identity,
        timing: LeaseTiming | None = None,
        *,
        forbid_overlap: bool = False,
        owner_token: uuid.UUID | None = None,
        fire_time: datetime | None = None,
        late_after: datetime | None = None,
        superseded_at: datetime | None = None,
        suspended: str | None = None,
    ) -> Acquired | NotAcquired:
        """Claim ``identity`` in one round trip; never takes a SUCCESS or live RUNNING row.

        Claims made in the same turn of the event loop (the co-firing jobs of
        one tick) are sent together, as one statement. Pass the same
        ``owner_token`` when retrying a claim whose answer was lost: a claim
        that did commit is then recognised as won, not as held by a stranger.
        ``fire_time`` / ``late_after``: by the database clock, a claim before
        the first is refused ``not_due`` (with the wait), after the second
        ``late`` (and the tick, if it has no row, recorded MISSED/late).
        ``superseded_at``: when the job's next tick fires (late_ticks:
        coalesce); a first claim after it, by the database clock, is refused
        ``coalesced`` and the tick, if it has no row, recorded MISSED/coalesced
        (a row another replica wrote is answered as usual).
        A tick of a paused job (``pgcrond pause``), or of a ``suspended`` one
        (the text says where it is suspended), is recorded SKIPPED and refused
        ``paused``; a manual run key (not a tick's) is never paused.
        """
        request = _ClaimRequest(
            identity,
            timing or LeaseTiming.build(),
            owner_token or uuid.uuid4(),
            forbid_overlap and identity.type == "SCHEDULE",
            fire_time,
            late_after,
            superseded_at,
            suspended,
        )
        return await self._claims.submit(request)

    async def claim_room(self, below: int) -> None:
        """Until fewer than ``below`` claims wait for their answer (:meth:`TurnBatch.room`)."""
        await self._claims.room(below)

    async def _claim(
        self, batch: list[_ClaimRequest]
    ) -> Callable[[_ClaimRequest], Acquired | NotAcquired]:
        # The send time, not the time the batch started waiting for a
        # connection: the answer's age is judged from it.
        sent = [time.monotonic()]

        def on_send() -> None:
            sent[0] = time.monotonic()

        forbid_codes = sorted({r.identity.code for r in batch if r.forbid_overlap})
        try:
            params = {
                "lock_keys": [r.identity.idempotency_key for r in batch],
                "types": [r.identity.type for r in batch],
                "codes": [r.identity.code for r in batch],
                "run_keys": [r.identity.run_key for r in batch],
                "owner_tokens": [r.token for r in batch],
                "lease_ms": [r.timing.lease_ms for r in batch],
                "forbid_overlap": [r.forbid_overlap for r in batch],
                "fire_times": [r.fire_time for r in batch],
                "late_after": [r.late_after for r in batch],
                "superseded_at": [r.superseded_at for r in batch],
                "pausable": [r.pausable for r in batch],
                "suspended": [r.suspended if r.pausable else None for r in batch],
                "owner": self.owner,
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
        by_key = {row["lock_key"]: row for row in rows}

        def answer(request: _ClaimRequest) -> Acquired | NotAcquired:
            outcome = request.outcome(
                by_key.get(request.identity.idempotency_key), sent[0], received_at
            )
            if isinstance(outcome, Acquired):
                self._unfinalized.add(outcome)
            return outcome

        return answer

    async def heartbeat(self, lease: Acquired) -> timedelta | None:
        """Extend a live lease; how long it now has left, or None when fenced or lapsed.

        Heartbeats of co-running leases in one loop turn share one statement;
        each row is still matched by its own owner token.
        """
        renewal = await self.renew(lease)
        return None if renewal is None else renewal.remaining

    async def renew(self, lease: Acquired) -> Renewal | None:
        """As :meth:`heartbeat`, with the database's clock at the answer."""
        return await self._beats.submit(lease)

    async def _heartbeat_batch(
        self, leases: list[Acquired]
    ) -> Callable[[Acquired], Renewal | None]:
        rows = await self.db.fetchall(
            self.queries.get("heartbeat"),
            {
                "ids": [lease.id for lease in leases],
                "owner_tokens": [lease.owner_token for lease in leases],
            },
        )
        renewed = {
            row["id"]: Renewal(row["expires_at"] - row["db_now"], row["db_now"]) for row in rows
        }
        return lambda lease: renewed.get(lease.id)

    async def complete(self, lease: Acquired, end: AttemptEnd | None = None) -> bool:
        """Record SUCCESS; False when fenced. A SUCCESS row is never claimed again.

        ``end`` (here and for :meth:`fail` and :meth:`release`): what the
        attempt left, for its attempt record, closed in the same statement.
        """
        return await self._finalize(lease, "SUCCESS", None, None, None, end=end)

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

    async def fail(
        self,
        lease: Acquired,
        error: str,
        *,
        reason: str = "error",
        retry_after: timedelta | None = timedelta(0),
        end: AttemptEnd | None = None,
    ) -> bool:
        """Record FAIL; False when fenced. ``retry_after=None`` makes the failure final."""
        return await self._finalize(lease, "FAIL", reason, error, retry_after, end=end)

    async def release(self, lease: Acquired, end: AttemptEnd | None = None) -> bool:
        """Give a running claim back (e.g. at shutdown) so that a survivor may take it."""
        return await self._finalize(
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

    async def _finalize(
        self,
        lease: Acquired,
        status: str,
        reason: str | None,
        error: str | None,
        retry_after: timedelta | None,
        *,
        end: AttemptEnd | None,
    ) -> bool:
        """Record an outcome; co-finishing runs share one statement (see FINALIZE_LINGER_S)."""
        self._unfinalized.discard(lease)
        return await self._finalizes.submit(
            _Outcome(
                lease,
                status,
                reason,
                None if error is None else storable(error),
                None if retry_after is None else to_ms(retry_after),
                end,
            )
        )

    async def _finalize_batch(self, outcomes: list[_Outcome]) -> Callable[[_Outcome], bool]:
        rows = await self.db.fetchall(
            self.queries.get("finalize"),
            {
                "ids": [o.lease.id for o in outcomes],
                "owner_tokens": [o.lease.owner_token for o in outcomes],
                "statuses": [o.status for o in outcomes],
                "reasons": [o.reason for o in outcomes],
                "errors": [o.error for o in outcomes],
                "retry_ms": [o.retry_ms for o in outcomes],
                "fencing_tokens": [o.lease.fencing_token for o in outcomes],
                **finalize_columns([o.end for o in outcomes]),
            },
        )
        recorded = {row["id"] for row in rows}
        # A finalize given up on was sent all the same (or, given up before
        # the send, is not): its caller retries it, and a repeated finalize
        # that did land is recorded again (see the finalize query).
        return lambda outcome: outcome.lease.id in recorded

    async def keep_alive(
        self,
        lease: Acquired,
        on_failure: Callable[[Exception], None] | None = None,
        *,
        first_wait_done: bool = False,
    ) -> None:
        """Heartbeat until cancelled; set ``lease.cancellation`` when the lease is going.

        A fenced or lapsed heartbeat means the lease is gone: "lease_lost".
        Otherwise the run goes on only while the lease surely holds, by the
        database's own numbers at the last answer (``expires_at - db_now``,
        counted from when that statement was *sent*), less the stop budget
        (the runner's stop grace and a safety margin), so that the run is over
        before another replica may take the tick over: "lease_expired". A
        heartbeat that hangs (a partition) is not waited for past that point:
        its statement is left behind, never awaited, so no driver clean-up
        (a cancel request, a reconnect) can hold the run past its lease.
        ``first_wait_done``: the caller waited :func:`first_wait` already.
        """
        interval = lease.timing.heartbeat.total_seconds()
        budget = lease.timing.stop_budget.total_seconds()
        # After a failure, try again sooner: one lost heartbeat must not cost the run.
        retry = max(0.05, interval / 4)
        stop_at = lease.stop_at
        pause = interval
        pending: asyncio.Task[timedelta | None] | None = None
        try:
            while True:
                remaining = stop_at - time.monotonic()
                if remaining <= 0:
                    lease.cancellation.cancel("lease_expired")
                    log.warning(
                        "lease_expired", job=lease.identity.code, run_key=lease.identity.run_key
                    )
                    return
                if pending is None:
                    if first_wait_done:
                        first_wait_done = False
                    else:
                        await asyncio.sleep(_next_wait(interval, pause, remaining))
                    if not interval or time.monotonic() >= stop_at:
                        continue
                    sent = time.monotonic()
                    pending = asyncio.ensure_future(self.heartbeat(lease))
                done, _ = await asyncio.wait({pending}, timeout=max(stop_at - time.monotonic(), 0))
                if not done:
                    continue  # the stop deadline came first: stop the run (loop top)
                task, pending = pending, None
                try:
                    renewed = task.result()
                except Exception as exc:  # any failure: keep the lease while it surely holds
                    if on_failure is not None:
                        on_failure(exc)
                    log.warning(
                        "heartbeat_failed",
                        job=lease.identity.code,
                        run_key=lease.identity.run_key,
                        error=str(exc) or type(exc).__name__,
                        stop_in_s=round(stop_at - time.monotonic(), 3),
                    )
                    pause = retry
                    continue
                if renewed is None:
                    lease.cancellation.cancel("lease_lost")
                    log.warning(
                        "lease_lost", job=lease.identity.code, run_key=lease.identity.run_key
                    )
                    return
                stop_at = sent + renewed.total_seconds() - budget
                pause = interval
        finally:
            if pending is not None:
                _abandon(pending)

    @contextlib.asynccontextmanager
    async def holding(
        self, lease: Acquired, on_failure: Callable[[Exception], None] | None = None
    ) -> AsyncIterator[Acquired]:
        """Keep ``lease`` alive in the background for the duration of the block.

        The heartbeat's task is made only when its first beat (or the stop
        deadline) is due: most runs end before, and cost a timer, not a task.
        """
        loop = asyncio.get_running_loop()
        task: asyncio.Task[None] | None = None

        def start() -> None:
            nonlocal task
            task = loop.create_task(self.keep_alive(lease, on_failure, first_wait_done=True))

        remaining = max(lease.stop_at - time.monotonic(), 0.0)
        interval = lease.timing.heartbeat.total_seconds()
        timer = loop.call_later(_next_wait(interval, interval, remaining), start)
        try:
            yield lease
        finally:
            timer.cancel()
            if task is not None:
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task

    async def run_exclusive(
        self,
        identity: Identity,
        fn: Callable[[Acquired], Awaitable[T]],
        *,
        timing: LeaseTiming | None = None,
        forbid_overlap: bool = False,
        retry_after: timedelta | None = timedelta(0),
    ) -> T | NotAcquired:
        """Acquire, heartbeat while ``fn(lease)`` runs, record its outcome.

        The job's exception is recorded as FAIL (reclaimable after
        ``retry_after``; None makes it final) and re-raised. When the lease was
        lost meanwhile (``lease.cancellation`` tells ``fn``), nothing is
        recorded as success: :class:`LeaseLost` is raised instead.
        """
        lease = await self.claim(identity, timing, forbid_overlap=forbid_overlap)
        if isinstance(lease, NotAcquired):
            return lease
        async with self.holding(lease):
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


# Heartbeats wake on a grid of the loop's clock, so that co-running leases
# (claimed together, renewed at the same interval) beat in the same loop turn
# and share one statement. The stop deadline itself is never moved onto the grid.
_BEAT_GRID_S = 0.05


def _next_wait(interval: float, pause: float, remaining: float) -> float:
    """Until the next heartbeat (on the grid), or the stop deadline if that comes first."""
    beat_soon = interval and pause < remaining - _BEAT_GRID_S
    return _on_grid(pause) if beat_soon else remaining


def _on_grid(seconds: float) -> float:
    now = asyncio.get_running_loop().time()
    wake = math.ceil((now + seconds) / _BEAT_GRID_S) * _BEAT_GRID_S
    return max(wake - now, 0.0)


def _claim_keys(request: _ClaimRequest) -> list[str]:
    # One identity per statement, and one tick per forbid job (a statement
    # cannot see the rows it inserts itself, so a second tick would not find
    # the first one running).
    keys = [request.identity.idempotency_key]
    if request.forbid_overlap:
        keys.append(f"forbid:{request.identity.code}")
    return keys


def _lease_id(request: Acquired | _Outcome) -> list[int]:
    lease = request.lease if isinstance(request, _Outcome) else request
    return [lease.id]


@dataclass(frozen=True)
class _Outcome:
    lease: Acquired
    status: str
    reason: str | None
    error: str | None
    retry_ms: int | None
    end: AttemptEnd | None = None


def _abandon(task: asyncio.Task[Any]) -> None:
    """Cancel ``task`` without waiting for it; its outcome is of no interest any more."""
    task.cancel()
    task.add_done_callback(lambda done: done.cancelled() or done.exception())


@dataclass(frozen=True)
class _ClaimRequest:
    identity: Identity
    timing: LeaseTiming
    token: uuid.UUID
    forbid_overlap: bool
    fire_time: datetime | None = None
    late_after: datetime | None = None
    superseded_at: datetime | None = None
    suspended: str | None = None

    @property
    def pausable(self) -> bool:
        """Pause stops ticks and run-once jobs; a manual run key is the operator's own ask."""
        return self.identity.type == "INITIAL" or tick_of(self.identity.run_key or "") is not None

    def outcome(
        self, row: dict[str, Any] | None, sent_at: float, received_at: float
    ) -> Acquired | NotAcquired:
        if row is None:
            # The conflicting row was inserted by a claim that committed after
            # this statement's snapshot: a live lease, just granted.
            return NotAcquired(self.identity, "held", "RUNNING", None, self.timing.lease)
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
    if status == "SKIPPED" and row["claimed"]:
        reason: NotAcquiredReason = "overlap" if row["reason"] == "overlap" else "paused"
        return NotAcquired(identity, reason, status, owner, attempt=attempt, detail=row["detail"])
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
            # Due for a retry, but another tick of the job runs: no retry under forbid.
            return NotAcquired(identity, "overlap", status, owner, attempt=attempt)
        return NotAcquired(
            identity, "retry_pending", status, owner, wait, attempt, cause=row["reason"]
        )
    return NotAcquired(identity, "done", status, owner, attempt=attempt)


class SyncLeaseStore:
    """The same lease store for synchronous code, run on anyio's blocking portal.

    The library is async first; sync callers get the same code run on the
    portal's private loop instead of a second, drifting implementation.
    """

    def __init__(self, conninfo: str, **options: Any) -> None:
        """``options``: :class:`LeaseStore`'s (``schema``, ``table``, ``owner``)."""
        from anyio.from_thread import start_blocking_portal

        self._db = Database(conninfo)
        self.store = LeaseStore(self._db, **options)
        self._portal_cm = start_blocking_portal()
        self._portal = self._portal_cm.__enter__()
        try:
            self._portal.call(self._db.open)
        except BaseException:
            # The portal's thread is not a daemon: leaving it would hang the exit.
            self._portal_cm.__exit__(None, None, None)
            raise

    def close(self) -> None:
        self._portal.call(self._db.close)
        self._portal_cm.__exit__(None, None, None)

    def __enter__(self) -> SyncLeaseStore:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def migrate(self) -> list[int]:
        return self._portal.call(self.store.migrate)

    def claim(
        self, identity: Identity, timing: LeaseTiming | None = None, *, forbid_overlap: bool = False
    ) -> Acquired | NotAcquired:
        return self._portal.call(
            functools.partial(self.store.claim, identity, timing, forbid_overlap=forbid_overlap)
        )

    def heartbeat(self, lease: Acquired) -> timedelta | None:
        return self._portal.call(self.store.heartbeat, lease)

    def complete(self, lease: Acquired) -> bool:
        return self._portal.call(self.store.complete, lease)

    def fail(
        self,
        lease: Acquired,
        error: str,
        *,
        reason: str = "error",
        retry_after: timedelta | None = timedelta(0),
    ) -> bool:
        return self._portal.call(
            functools.partial(self.store.fail, lease, error, reason=reason, retry_after=retry_after)
        )

    def release(self, lease: Acquired) -> bool:
        return self._portal.call(self.store.release, lease)

    def run_exclusive(
        self,
        identity: Identity,
        fn: Callable[[Acquired], T],
        *,
        timing: LeaseTiming | None = None,
        forbid_overlap: bool = False,
    ) -> T | NotAcquired:
        """As :meth:`LeaseStore.run_exclusive`; ``fn`` runs in a worker thread."""

        async def in_thread(lease: Acquired) -> T:
            return await asyncio.to_thread(fn, lease)

        return self._portal.call(
            functools.partial(
                self.store.run_exclusive,
                identity,
                in_thread,
                timing=timing,
                forbid_overlap=forbid_overlap,
            )
        )
