"""A claim that carries a calendar's day (``skip_reason``), against each guard and a real database.

The claim statement records the tick SKIPPED with the reason, in a chunk with
ticks that run, however late it comes and before any suspension; a second
claim finds that row; a tick that has a row already is left as it is. The
advisory guard has no table: it refuses the tick and takes no lock.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import psycopg
from psycopg.rows import dict_row

from pgcrond.core.keys import Identity
from pgcrond.core.schedule import run_key_for
from pgcrond.core.timing import LeaseTiming
from pgcrond.guard.advisory import AdvisoryGuard
from pgcrond.guard.base import ClaimRequest, Held, Refused
from pgcrond.guard.lease import LeaseGuard
from pgcrond.storage.db import Database
from pgcrond.storage.leases import LeaseStore

TIMING = LeaseTiming.build(timedelta(seconds=30), timedelta(0))
HOLIDAY = "calendar:holidays"


def request(code: str, tick: datetime, **kwargs: object) -> ClaimRequest:
    return ClaimRequest(
        Identity.schedule(code, run_key_for(tick)),
        tick,
        TIMING,
        deadline=tick + timedelta(seconds=30),
        **kwargs,  # type: ignore[arg-type]
    )


def rows(pg_dsn: str, schema: str) -> dict[str, tuple[str, str | None, int]]:
    with psycopg.connect(pg_dsn, row_factory=dict_row) as conn:
        found = conn.execute(
            f'SELECT code, status, reason, attempt FROM "{schema}".leases'
        ).fetchall()
    return {row["code"]: (row["status"], row["reason"], row["attempt"]) for row in found}


async def test_the_lease_guard_records_a_calendar_day_skipped_in_a_chunk_however_late(
    store: LeaseStore, pg_dsn: str, schema: str
) -> None:
    now = datetime.now(UTC).replace(microsecond=0)
    guard = LeaseGuard(store)
    late = now - timedelta(minutes=5)  # past its 30 s window: a tick that runs is MISSED
    chunk = [
        request("runs", now),
        request("holiday", now, skip_reason=HOLIDAY),
        request("late-holiday", late, skip_reason=HOLIDAY),
        request("late", late),
        request("suspended-holiday", now, skip_reason=HOLIDAY, suspended="suspended: true"),
    ]
    answers = await guard.claim_many(chunk)
    assert isinstance(answers[0], Held)
    assert [("skipped", "SKIPPED", HOLIDAY)] * 2 == [
        (a.reason, a.status, a.cause) for a in answers[1:3] if isinstance(a, Refused)
    ]
    assert isinstance(answers[3], Refused) and "late" == answers[3].reason
    assert isinstance(answers[4], Refused) and "skipped" == answers[4].reason
    assert {
        "runs": ("RUNNING", None, 1),
        "holiday": ("SKIPPED", HOLIDAY, 0),
        "late-holiday": ("SKIPPED", HOLIDAY, 0),
        "late": ("MISSED", "late", 0),
        "suspended-holiday": ("SKIPPED", HOLIDAY, 0),
    } == rows(pg_dsn, schema)
    # Another replica's claim of the same ticks finds the rows: one record for the cluster.
    again = await LeaseGuard(store).claim_many(chunk[1:3])
    assert [("done", "SKIPPED")] * 2 == [
        (a.reason, a.status) for a in again if isinstance(a, Refused)
    ]
    # A tick begun by a replica whose config runs it is left to that replica.
    begun = await LeaseGuard(store).claim_many([request("runs", now, skip_reason=HOLIDAY)])
    assert isinstance(begun[0], Refused) and ("done", "RUNNING") == (
        begun[0].reason,
        begun[0].status,
    )
    assert ("RUNNING", None, 1) == rows(pg_dsn, schema)["runs"]


async def test_the_advisory_guard_refuses_a_calendar_day_and_takes_no_lock(pg_dsn: str) -> None:
    db = Database(pg_dsn, min_size=0, max_size=2)
    await db.open()
    try:
        now = datetime.now(UTC)
        mine, theirs = AdvisoryGuard(db, "k", min_hold=timedelta(0)), AdvisoryGuard(db, "k")
        [skipped] = await mine.claim_many([request("a", now, skip_reason=HOLIDAY)])
        assert isinstance(skipped, Refused)
        assert ("skipped", None, HOLIDAY) == (skipped.reason, skipped.status, skipped.cause)
        # No lock was taken: another replica locks the same key at once.
        [won] = await theirs.claim_many([request("a", now)])
        assert isinstance(won, Held)
        await theirs.forget(won.identity)
    finally:
        await db.close()
