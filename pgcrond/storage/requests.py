"""Requests: detached manual runs (``pgcrond trigger CODE --detach``), and their wake-up.

A request is a row of the requests table (migration 3): the job, the run key,
who asked and when, which replica took it, and when its fire came to an end.
``pgcrond trigger --detach`` inserts it and NOTIFYs the requests channel in the
same statement; each replica LISTENs on one connection of its own
(:class:`RequestListener`, outside the pool: LISTEN is session state) and, on a
notification, takes the pending requests of its jobs with one bounded
statement. Taking is a row update with ``SKIP LOCKED``, so replicas woken
together take disjoint rows; the lease table still decides who runs the run
key, so a request taken twice (its taker died) runs once.

Nothing here polls: an idle listener sends nothing (the kernel's TCP
keepalives are not statements). The take says whether a request is still
open (taken by a replica that may die); the daemon takes again on a slow timer
only while one is, and behind PgBouncer in transaction pooling (where LISTEN
does not survive the transaction) on a faster one (``pgcrond.daemon.requests``).
The same listener hears ``pgcrond resume`` (the resumed channel).
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Literal

import psycopg
from psycopg import sql
from psycopg.rows import DictRow
from psycopg.types.json import Jsonb

from pgcrond.errors import PgcrondError
from pgcrond.storage.db import connection_settings, translate
from pgcrond.storage.leases import LeaseStore

# PostgreSQL truncates identifiers (and refuses pg_notify channels) past 63 bytes.
_MAX_CHANNEL = 63


def channel(store: LeaseStore, kind: str = "requests") -> str:
    """The ``kind`` channel of ``store``'s table: ``<schema>.<table>_<kind>``.

    ``requests`` (a request was made) or ``resumed`` (``pgcrond resume``). Both
    sides use it as is: pg_notify takes it as text, LISTEN as a quoted
    identifier. Names too long for an identifier get a digest instead.
    """
    name = f"{store.queries.schema}.{store.queries.table}_{kind}"
    if len(name.encode()) <= _MAX_CHANNEL:
        return name
    return f"pgcrond_{kind}_" + hashlib.sha256(name.encode()).hexdigest()[:32]


@dataclass(frozen=True)
class Requested:
    """What ``pgcrond trigger --detach`` did: opened a request, or found one pending."""

    opened: bool
    # The request as it was before this one (None: there was none).
    earlier_by: str | None
    earlier_at: datetime | None
    earlier_taken_by: str | None
    earlier_done_at: datetime | None
    earlier_outcome: str | None
    # The pending request's parameters (a request already pending runs with its own).
    earlier_params: dict[str, str] | None
    # The run key's lease row, if any: SUCCESS means nothing will run again.
    lease_status: str | None
    lease_reason: str | None
    lease_owner: str | None
    lease_retry_at: datetime | None


@dataclass(frozen=True)
class Request:
    """A request this replica took."""

    id: int
    code: str
    run_key: str
    requested_by: str
    requested_at: datetime
    taken_at: datetime
    # When a taker's run of it started (recorded for advisory jobs only).
    started_at: datetime | None = None
    # What asked for it (manual, backfill), and the parameters its run gets.
    trigger: Literal["manual", "backfill"] = "manual"
    params: dict[str, str] = field(default_factory=dict)
    # The overlap policy it runs under instead of the job's (``--concurrency``).
    concurrency: str | None = None
    # The backfill it belongs to, if any.
    backfill_id: int | None = None

    @property
    def waited(self) -> timedelta:
        """From the request to its take, by the database's clock."""
        return self.taken_at - self.requested_at


async def request_run(
    store: LeaseStore,
    code: str,
    run_key: str,
    *,
    by: str,
    params: Mapping[str, str] | None = None,
    concurrency: str | None = None,
) -> Requested:
    """Record a request for ``(code, run_key)`` and wake every listening replica.

    ``params``: extra environment variables for that run only; ``concurrency``:
    the overlap policy it runs under instead of the job's (``--concurrency``).
    """
    row = await store.db.fetchone(
        store.queries.get("request_run"),
        {
            "code": code,
            "run_key": run_key,
            "by": by,
            "channel": channel(store),
            "params": Jsonb(dict(params)) if params else None,
            "concurrency": concurrency,
        },
    )
    if row is None:  # pragma: no cover - the statement selects one row from `woken`
        raise PgcrondError("the request statement returned no row")
    return Requested(
        opened=bool(row["opened"]),
        earlier_by=row["requested_by"],
        earlier_at=row["requested_at"],
        earlier_taken_by=row["taken_by"],
        earlier_done_at=row["done_at"],
        earlier_outcome=row["outcome"],
        earlier_params=row["params"],
        lease_status=row["lease_status"],
        lease_reason=row["lease_reason"],
        lease_owner=row["lease_owner"],
        lease_retry_at=row["lease_retry_at"],
    )


@dataclass(frozen=True)
class Progress:
    """Where a request stands, for ``pgcrond trigger`` that waits for it."""

    taken_by: str | None
    taken_at: datetime | None
    done_at: datetime | None
    # What the taker's fire came to (success, fail, lose, ...), once done.
    outcome: str | None
    # The run key's lease row (None for an advisory job, or before a claim).
    lease_id: int | None
    lease_status: str | None
    lease_owner: str | None
    lease_attempt: int | None
    lease_error: str | None


async def request_progress(store: LeaseStore, code: str, run_key: str) -> Progress:
    """The request of ``(code, run_key)`` and its run key's lease row, as they are now."""
    row = await store.db.fetchone(
        store.queries.get("request_progress"), {"code": code, "run_key": run_key}
    )
    assert row is not None  # one row from (SELECT 1)
    return Progress(**{name: row[name] for name in Progress.__dataclass_fields__})


class Taken(list[Request]):
    """The requests one take took, oldest first, and whether any is still open."""

    def __init__(self, found: Iterable[Request] = (), *, open: bool = False) -> None:
        super().__init__(found)
        self.open = open


async def take_requests(
    store: LeaseStore,
    codes: list[str],
    *,
    by: str,
    within: timedelta,
    retake_after: timedelta,
    limit: int,
    running: Sequence[int] = (),
) -> Taken:
    """Take up to ``limit`` pending requests of ``codes`` for replica ``by``: one statement.

    ``running``: the ids of the requests ``by`` runs now, kept taken by it.
    """
    if not codes:
        return Taken()
    rows = await store.db.fetchall(
        store.queries.get("take_requests"),
        {
            "codes": codes,
            "by": by,
            "within_ms": int(within.total_seconds() * 1000),
            "retake_ms": int(retake_after.total_seconds() * 1000),
            "limit": limit,
            "running": list(running),
        },
    )
    found = sorted(
        (_request(row) for row in rows if row["id"] is not None),
        key=lambda r: (r.requested_at, r.id),
    )
    return Taken(found, open=any(bool(row["open"]) for row in rows if row["id"] is None))


async def start_request(store: LeaseStore, request: Request, *, by: str) -> bool:
    """Record that ``request``'s run starts here; False if it is not ours any more."""
    touched = await store.db.execute(
        store.queries.get("start_request"), {"id": request.id, "by": by}
    )
    return touched == 1


async def prune_requests(
    store: LeaseStore, older_than: timedelta, *, batch_size: int = 1000
) -> int:
    """Delete requests whose fire ended more than ``older_than`` ago; how many."""
    params = {"older_than_ms": int(older_than.total_seconds() * 1000), "batch_size": batch_size}
    total = 0
    while True:
        deleted = await store.db.execute(store.queries.get("prune_requests"), params)
        total += deleted
        if deleted < batch_size:
            # A backfill goes once its last request went.
            await store.db.execute(
                store.queries.get("prune_backfills"),
                {"older_than_ms": params["older_than_ms"]},
            )
            return total


async def finish_request(store: LeaseStore, request: Request, *, by: str, outcome: str) -> bool:
    """Mark ``request`` done with what its fire came to here; False if it was not ours.

    A backfill's request wakes the replicas too: the backfill's next tick may be taken.
    """
    row = await store.db.fetchone(
        store.queries.get("finish_request"),
        {"id": request.id, "by": by, "outcome": outcome, "channel": channel(store)},
    )
    return row is not None and row["finished"] == 1


async def release_request(store: LeaseStore, request: Request, *, by: str) -> bool:
    """Give ``request`` back (pending again) and wake the other replicas."""
    rows = await store.db.fetchall(
        store.queries.get("release_request"),
        {"id": request.id, "by": by, "channel": channel(store)},
    )
    return bool(rows)


def _request(row: DictRow) -> Request:
    return Request(
        id=int(row["id"]),
        code=str(row["code"]),
        run_key=str(row["run_key"]),
        requested_by=str(row["requested_by"]),
        requested_at=row["requested_at"],
        taken_at=row["taken_at"],
        started_at=row["started_at"],
        trigger="backfill" if row["trigger"] == "backfill" else "manual",
        params=dict(row["params"] or {}),
        concurrency=row["concurrency"],
        backfill_id=row["backfill_id"],
    )


async def _drain(conn: psycopg.AsyncConnection[DictRow], heard: set[str]) -> None:
    """The notifications received and readable now, without waiting for more."""
    async for notify in conn.notifies(timeout=0.0):
        heard.add(notify.channel)


async def _readable(fd: int, within: float | None) -> None:
    """Until ``fd`` can be read (or ``within`` seconds passed): no timer but the deadline's."""
    loop = asyncio.get_running_loop()
    ready: asyncio.Future[None] = loop.create_future()

    def wake() -> None:
        if not ready.done():
            ready.set_result(None)

    loop.add_reader(fd, wake)
    timer = None if within is None else loop.call_later(within, wake)
    try:
        await ready
    finally:
        loop.remove_reader(fd)
        if timer is not None:
            timer.cancel()


class RequestListener:
    """One connection of its own, LISTENing on the requests (and resumed) channels.

    ``open()`` connects and LISTENs; ``wait()`` returns the channels heard once
    one or more notifications arrived (those queued meanwhile are drained with
    it, so a burst wakes the replica once), or nothing after ``within`` seconds, and
    raises :class:`DatabaseUnavailable` when the connection is lost. Nothing is
    sent while it waits, and nothing wakes the replica but the socket: psycopg's
    own wait for notifications (``notifies()``) wakes every 100 ms to look for
    an interrupt, which an idle replica paid for ten times a second.
    """

    def __init__(self, conninfo: str, *channel_names: str, application_name: str) -> None:
        self.conninfo = conninfo
        self.channels = channel_names
        self.application_name = application_name
        self._conn: psycopg.AsyncConnection[DictRow] | None = None

    async def open(self) -> None:
        try:
            conn: psycopg.AsyncConnection[DictRow] = await psycopg.AsyncConnection.connect(
                self.conninfo,
                **connection_settings(self.conninfo, application_name=self.application_name),
            )
        except psycopg.Error as exc:
            raise translate(exc) from exc
        self._conn = conn
        try:
            for name in self.channels:
                await conn.execute(sql.SQL("LISTEN {}").format(sql.Identifier(name)))
        except psycopg.Error as exc:
            await self.close()
            raise translate(exc) from exc

    async def wait(self, within: float | None = None) -> set[str]:
        """Until a notification arrives (or ``within`` seconds passed); the channels heard."""
        conn = self._conn
        if conn is None:
            raise PgcrondError("the request listener is not open")
        deadline = None if within is None else time.monotonic() + within
        heard: set[str] = set()
        try:
            # What an earlier read took in already, then what the socket brings;
            # it may bring something else (a server notice): waited for again.
            await _drain(conn, heard)
            while not heard:
                left = None if deadline is None else deadline - time.monotonic()
                if left is not None and left <= 0:
                    break
                await _readable(conn.fileno(), left)
                await _drain(conn, heard)
        except psycopg.Error as exc:
            raise translate(exc) from exc
        return heard

    async def close(self) -> None:
        conn, self._conn = self._conn, None
        if conn is not None:
            with contextlib.suppress(psycopg.Error):  # closing a broken connection
                await conn.close()
