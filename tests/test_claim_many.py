"""Guard.claim_many: a chunk of a tick's fires claimed as one call, answered in order.

The lease guard sends one claim statement for the chunk and waits once for
the fire time; the in-memory and advisory guards claim one after another.
Each answer means what a single claim's would.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import psycopg

from pgcrond.core.keys import Identity
from pgcrond.core.overlap import ALLOW, FORBID
from pgcrond.core.schedule import run_key_for
from pgcrond.core.timing import LeaseTiming
from pgcrond.guard.advisory import AdvisoryGuard
from pgcrond.guard.base import ClaimRequest, Held, Refused
from pgcrond.guard.lease import LeaseGuard
from pgcrond.guard.memory import MemoryGuard, Row
from pgcrond.storage.db import Database
from pgcrond.storage.leases import LeaseStore
from tests.helpers.store import note_sends

TIMING = LeaseTiming.build(timedelta(seconds=30), timedelta(0))


def requests(tick: datetime, codes: list[str], *, forbid: bool = False) -> list[ClaimRequest]:
    return [
        ClaimRequest(
            Identity.schedule(code, run_key_for(tick)),
            tick,
            TIMING,
            overlap=FORBID if forbid else ALLOW,
            deadline=tick + timedelta(seconds=30),
        )
        for code in codes
    ]


async def test_the_lease_guard_claims_a_chunk_in_one_statement_and_answers_in_order(
    store: LeaseStore, pg_dsn: str, schema: str
) -> None:
    tick = datetime.now(UTC).replace(microsecond=0)
    guard = LeaseGuard(store)
    # Another replica holds job-1's tick already.
    taken = requests(tick, ["job-1"])[0]
    assert isinstance(await LeaseGuard(store).claim(taken), Held)
    sent: list[str] = []
    note_sends(store, sent, "fetchall", "fetchall_after")
    answers = await guard.claim_many(requests(tick, ["job-0", "job-1", "job-2"]))
    assert 1 == len(sent)
    assert [Held, Refused, Held] == [type(answer) for answer in answers]
    assert ["job-0", "job-1", "job-2"] == [answer.identity.code for answer in answers]
    refused = answers[1]
    assert isinstance(refused, Refused) and "held" == refused.reason
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        rows = conn.execute(f'SELECT count(*) FROM "{schema}".leases').fetchone()
    assert rows is not None and 3 == rows[0]


async def test_two_ticks_of_one_forbid_job_in_a_chunk_are_decided_one_after_the_other(
    store: LeaseStore,
) -> None:
    """A statement cannot see the rows it inserts: the second tick goes after the first's answer."""
    now = datetime.now(UTC).replace(microsecond=0)
    earlier, later = now - timedelta(seconds=1), now
    chunk = requests(earlier, ["f"], forbid=True) + requests(later, ["f"], forbid=True)
    sent: list[str] = []
    note_sends(store, sent, "fetchall", "fetchall_after")
    answers = await LeaseGuard(store).claim_many(chunk)
    assert isinstance(answers[0], Held)
    assert isinstance(answers[1], Refused) and "overlap" == answers[1].reason
    # The forbid lock rides with each claim statement: two round trips in all.
    assert ["fetchall_after", "fetchall_after"] == sent


async def test_the_in_memory_guard_claims_a_chunk_one_by_one_with_the_same_answers() -> None:
    now = datetime.now(UTC)
    guard = MemoryGuard(clock=lambda: now)
    chunk = requests(now, ["a", "b"])
    guard.rows[chunk[1].identity] = Row("SUCCESS", 1, 1, now)
    answers = await guard.claim_many(chunk)
    assert ["claim", "claim"] == guard.calls
    assert isinstance(answers[0], Held)
    assert isinstance(answers[1], Refused) and "done" == answers[1].reason


async def test_the_advisory_guard_claims_a_chunk_one_by_one(pg_dsn: str) -> None:
    db = Database(pg_dsn, min_size=0, max_size=2)
    await db.open()
    try:
        now = datetime.now(UTC)
        mine, theirs = AdvisoryGuard(db, "k", min_hold=timedelta(0)), AdvisoryGuard(db, "k")
        chunk = requests(now, ["a"])
        answers = await mine.claim_many(chunk)
        assert isinstance(answers[0], Held)
        # The lock is held here: another replica's claim of the same key loses.
        lost = await theirs.claim_many(chunk)
        assert isinstance(lost[0], Refused) and "held" == lost[0].reason
        await mine.forget(chunk[0].identity)
    finally:
        await db.close()
