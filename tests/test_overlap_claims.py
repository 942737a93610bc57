"""Overlap policies in the claim statement, against a real PostgreSQL.

What each policy writes and answers, claim by claim: the job's running ticks
are counted under its lock, a waiting tick is a row any replica starts, a
replaced tick is stopped by its owner and recorded so.
"""

from __future__ import annotations

import asyncio
import contextlib
from datetime import timedelta

import psycopg
import psycopg.rows

from pgcrond.core.keys import Identity
from pgcrond.core.overlap import Overlap
from pgcrond.core.timing import LeaseTiming
from pgcrond.storage import status
from pgcrond.storage.claims import Acquired, NotAcquired
from tests.helpers.store import open_store

TIMING = LeaseTiming.build(timedelta(seconds=30), timedelta(seconds=5))
BUFFER_ONE = Overlap("buffer_one", 1)
REPLACE = Overlap("replace", 1)


def tick(code: str, minute: int) -> Identity:
    return Identity.schedule(code, f"2026-01-01T00:{minute:02d}:00Z")


def rows(dsn: str, schema: str, code: str) -> dict[str, dict[str, object]]:
    """The job's lease rows by run key, with each one's newest attempt record's status."""
    with psycopg.connect(dsn, autocommit=True, row_factory=psycopg.rows.dict_row) as conn:
        found = conn.execute(
            f"SELECT l.run_key, l.status, l.reason, l.attempt, l.error, l.retry_at, "
            f'(SELECT a.status FROM "{schema}".leases_attempts a WHERE a.lease_id = l.id '
            f" ORDER BY a.fencing_token DESC LIMIT 1) AS attempt_status "
            f'FROM "{schema}".leases l WHERE l.code = %s',
            (code,),
        ).fetchall()
    return {str(r["run_key"]): r for r in found}


def lapse(dsn: str, schema: str, lease: Acquired) -> None:
    """As if the lease's owner had died: its expiry passed."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(
            f"UPDATE \"{schema}\".leases SET expires_at = now() - interval '1 second' "
            "WHERE id = %s",
            (lease.id,),
        )


def shape(answer: Acquired | NotAcquired) -> tuple[str, str | None]:
    if isinstance(answer, Acquired):
        return ("won", answer.claimed_from)
    return (answer.reason, answer.status)


async def test_max_concurrent_runs_n_ticks_and_skips_the_next_until_a_slot_frees(
    pg_dsn: str, schema: str
) -> None:
    bound = Overlap("allow", 2)
    async with open_store(pg_dsn, schema) as store:
        first = await store.claim(tick("j", 0), TIMING, overlap=bound)
        second = await store.claim(tick("j", 1), TIMING, overlap=bound)
        third = await store.claim(tick("j", 2), TIMING, overlap=bound)
        assert [("won", None), ("won", None), ("overlap", "SKIPPED")] == [
            shape(a) for a in (first, second, third)
        ]
        assert isinstance(first, Acquired) and isinstance(second, Acquired)
        assert await store.complete(first)
        assert ("won", None) == shape(await store.claim(tick("j", 3), TIMING, overlap=bound))
        # A dead owner's slot frees when its lease lapses; its tick is then
        # not taken over beside the two that run: closed SKIPPED/overlap.
        lapse(pg_dsn, schema, second)
        assert ("won", None) == shape(await store.claim(tick("j", 4), TIMING, overlap=bound))
        assert ("overlap", "SKIPPED") == shape(
            await store.claim(tick("j", 1), TIMING, overlap=bound)
        )
        assert ("overlap", "SKIPPED") == shape(
            await store.claim(tick("j", 5), TIMING, overlap=bound)
        )
    assert {"SUCCESS": 1, "RUNNING": 2, "SKIPPED": 3} == _count(rows(pg_dsn, schema, "j"))


async def test_max_concurrent_holds_when_every_replica_claims_every_tick_at_once(
    pg_dsn: str, schema: str
) -> None:
    """Eight replicas race for six ticks of a job bounded at 3: three run, never four."""
    bound = Overlap("allow", 3)
    async with contextlib.AsyncExitStack() as stack:
        await stack.enter_async_context(open_store(pg_dsn, schema))
        stores = [
            await stack.enter_async_context(
                open_store(pg_dsn, schema, owner=f"replica:{n}", migrate=False, max_size=1)
            )
            for n in range(8)
        ]
        answers = await asyncio.gather(
            *(
                store.claim(tick("j", minute), TIMING, overlap=bound)
                for minute in range(6)
                for store in stores
            )
        )
    won = {a.identity for a in answers if isinstance(a, Acquired)}
    assert 3 == len(won)
    statuses = _count(rows(pg_dsn, schema, "j"))
    assert {"RUNNING": 3, "SKIPPED": 3} == statuses


async def test_buffer_one_keeps_one_tick_waiting_and_skips_the_rest(
    pg_dsn: str, schema: str
) -> None:
    async with (
        open_store(pg_dsn, schema) as store,
        open_store(pg_dsn, schema, owner="other:2", migrate=False) as other,
    ):
        running = await store.claim(tick("b", 0), TIMING, overlap=BUFFER_ONE)
        assert isinstance(running, Acquired)
        # The next tick waits (a FAIL/waiting row), on every replica that fires it.
        assert ("waiting", "FAIL") == shape(
            await store.claim(tick("b", 1), TIMING, overlap=BUFFER_ONE)
        )
        assert ("waiting", "FAIL") == shape(
            await other.claim(tick("b", 1), TIMING, overlap=BUFFER_ONE)
        )
        # One waits already: the one after is skipped.
        assert ("overlap", "SKIPPED") == shape(
            await other.claim(tick("b", 2), TIMING, overlap=BUFFER_ONE)
        )
        waiting = rows(pg_dsn, schema, "b")["2026-01-01T00:01:00Z"]
        assert ("FAIL", "waiting", 0) == (waiting["status"], waiting["reason"], waiting["attempt"])
        assert await store.complete(running)
        # The running tick ended: the waiting one starts, as a first attempt under its own key.
        started = await other.claim(tick("b", 1), TIMING, overlap=BUFFER_ONE)
        assert isinstance(started, Acquired)
        assert (1, None, "2026-01-01T00:01:00Z") == (
            started.attempt,
            started.claimed_from,
            started.identity.run_key,
        )
        # Now it runs: the next tick waits in its turn.
        assert ("waiting", "FAIL") == shape(
            await store.claim(tick("b", 3), TIMING, overlap=BUFFER_ONE)
        )


async def test_replace_stops_the_running_tick_through_its_heartbeat_and_records_it_replaced(
    pg_dsn: str, schema: str
) -> None:
    async with (
        open_store(pg_dsn, schema) as store,
        open_store(pg_dsn, schema, owner="other:2", migrate=False) as other,
    ):
        old = await store.claim(tick("r", 0), TIMING, overlap=REPLACE)
        assert isinstance(old, Acquired)
        # The new tick marks the old one replaced and waits for its stop.
        assert ("waiting", "FAIL") == shape(
            await other.claim(tick("r", 1), TIMING, overlap=REPLACE)
        )
        assert not old.cancellation.is_set()
        assert await store.heartbeat(old) is None
        assert "replaced" == old.cancellation.reason
        # Still stopping: it holds the job's slot until its owner records the stop.
        assert ("waiting", "FAIL") == shape(
            await other.claim(tick("r", 1), TIMING, overlap=REPLACE)
        )
        assert await store.replaced(old)
        new = await other.claim(tick("r", 1), TIMING, overlap=REPLACE)
        assert ("won", None) == shape(new)
    found = rows(pg_dsn, schema, "r")
    stopped = found["2026-01-01T00:00:00Z"]
    assert ("SKIPPED", "replaced", "replaced") == (
        stopped["status"],
        stopped["reason"],
        stopped["attempt_status"],
    )
    assert "replaced by the tick 2026-01-01T00:01:00Z" in str(stopped["error"])
    assert isinstance(new, Acquired)
    assert ("RUNNING", 1) == (found["2026-01-01T00:01:00Z"]["status"], new.attempt)


async def test_replace_also_replaces_a_tick_still_waiting_and_closes_a_dead_owners_tick(
    pg_dsn: str, schema: str
) -> None:
    async with open_store(pg_dsn, schema) as store:
        old = await store.claim(tick("r", 0), TIMING, overlap=REPLACE)
        assert isinstance(old, Acquired)
        assert ("waiting", "FAIL") == shape(
            await store.claim(tick("r", 1), TIMING, overlap=REPLACE)
        )
        assert ("waiting", "FAIL") == shape(
            await store.claim(tick("r", 2), TIMING, overlap=REPLACE)
        )
        # The owner of the old tick died before it saw the mark: its lease lapses.
        lapse(pg_dsn, schema, old)
        newest = await store.claim(tick("r", 2), TIMING, overlap=REPLACE)
        assert ("won", None) == shape(newest)
        # A follower of the dead owner's tick closes it, never runs it again.
        assert ("done", "SKIPPED") == shape(
            await store.claim(tick("r", 0), TIMING, overlap=REPLACE)
        )
        # The tick replaced while it waited is settled.
        assert ("done", "SKIPPED") == shape(
            await store.claim(tick("r", 1), TIMING, overlap=REPLACE)
        )
    found = rows(pg_dsn, schema, "r")
    assert [
        ("SKIPPED", "replaced", "lost"),
        ("SKIPPED", "replaced", None),
        ("RUNNING", None, "running"),
    ] == [
        (found[key]["status"], found[key]["reason"], found[key]["attempt_status"])
        for key in sorted(found)
    ]
    assert "replaced before it started by the tick 2026-01-01T00:02:00Z" in str(
        found["2026-01-01T00:01:00Z"]["error"]
    )


async def test_a_replaced_runs_own_outcome_stands_when_it_ended_before_it_saw_the_mark(
    pg_dsn: str, schema: str
) -> None:
    async with open_store(pg_dsn, schema) as store:
        old = await store.claim(tick("r", 0), TIMING, overlap=REPLACE)
        assert isinstance(old, Acquired)
        assert ("waiting", "FAIL") == shape(
            await store.claim(tick("r", 1), TIMING, overlap=REPLACE)
        )
        assert await store.complete(old)
        assert ("won", None) == shape(await store.claim(tick("r", 1), TIMING, overlap=REPLACE))
        # A lease no newer tick marked cannot be recorded replaced.
        fresh = await store.claim(tick("q", 0), TIMING, overlap=REPLACE)
        assert isinstance(fresh, Acquired)
        assert not await store.replaced(fresh)
    assert "SUCCESS" == rows(pg_dsn, schema, "r")["2026-01-01T00:00:00Z"]["status"]


async def test_a_waiting_tick_is_no_failure_in_status_or_on_the_page(
    pg_dsn: str, schema: str
) -> None:
    async with open_store(pg_dsn, schema) as store:
        done = await store.claim(tick("b", 0), TIMING, overlap=BUFFER_ONE)
        assert isinstance(done, Acquired) and await store.complete(done)
        running = await store.claim(tick("b", 1), TIMING, overlap=BUFFER_ONE)
        assert isinstance(running, Acquired)
        assert ("waiting", "FAIL") == shape(
            await store.claim(tick("b", 2), TIMING, overlap=BUFFER_ONE)
        )

        async def seen() -> tuple[list[str], str, int, object]:
            (row,) = await status.job_status(store, ["b"])
            (ticks,) = await status.job_ticks(store, ["b"])
            return (
                await status.failing(store, ["b"]),
                row["last_status"],
                row["consecutive_failures"],
                ticks.last_failure,
            )

        assert ([], "SUCCESS", 0, None) == await seen()
        # A real failure shows, beside the waiting tick.
        assert await store.fail(running, "boom", retry_after=None)
        failing, last, failures, failure = await seen()
        assert (["b"], "FAIL", 1) == (failing, last, failures)
        assert failure is not None


def _count(found: dict[str, dict[str, object]]) -> dict[str, int]:
    counts: dict[str, int] = {}
    for r in found.values():
        counts[str(r["status"])] = counts.get(str(r["status"]), 0) + 1
    return counts
