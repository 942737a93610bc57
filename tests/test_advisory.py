"""The advisory-lock guard against a real PostgreSQL: exclusion, hold, loss, keys.

Key spread (no collision across 100k keys) is proven once, in
tests/test_keys.py::test_lock_ids_do_not_collide_across_100k_keys.
"""

from __future__ import annotations

import asyncio
import json
import multiprocessing
import time
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import psycopg
import pytest
from psycopg.conninfo import make_conninfo
from psycopg_pool import AsyncConnectionPool

from pgcrond.core.keys import lock_id
from pgcrond.errors import LeaseLost, ValidationError
from pgcrond.storage.advisory import (
    advisory_lock,
    advisory_lock_id,
    with_advisory_lock,
)
from pgcrond.storage.db import Database
from pgcrond.storage.embedded import LocalServer
from pgcrond.storage.sql import Queries
from pgcrond.storage.sync_advisory import SyncAdvisoryLock, advisory_lock_sync
from tests.helpers.store import quick_processes

ROOT = Path(__file__).parent.parent
VECTORS: dict[str, Any] = json.loads(
    (Path(__file__).parent / "reference" / "key-vectors.json").read_text("utf-8")
)
NO_HOLD = timedelta(0)
FAST_PROBE = timedelta(milliseconds=200)

# Reading pg_locks: a bigint advisory key is split into classid (high 32 bits)
# and objid (low 32 bits), objsubid 1. The same query is in docs/guards.md.
HOLDER_SQL = """
SELECT pid FROM pg_locks
WHERE locktype = 'advisory' AND objsubid = 1 AND granted
  AND ((classid::bigint << 32) | objid::bigint) = %s
"""


def unique_key() -> str:
    return f"test-{uuid.uuid4().hex}"


def holder_pid(dsn: str, lock: int) -> int | None:
    with psycopg.connect(dsn, autocommit=True) as conn:
        row = conn.execute(HOLDER_SQL, (lock,)).fetchone()
    return None if row is None else int(row[0])


def held_elsewhere(dsn: str, lock: int) -> bool:
    """Whether another session holds ``lock``: try it from a fresh one, give it back."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        got = conn.execute("SELECT pg_try_advisory_lock(%s)", (lock,)).fetchone()
        assert got is not None
        if got[0]:
            conn.execute("SELECT pg_advisory_unlock(%s)", (lock,))
        return not got[0]


def _contend(
    dsn: str,
    key: str,
    barrier: Any,
    inside: Any,
    peak: Any,
    counter_lock: Any,
    seconds: float,
    results: multiprocessing.Queue[tuple[int, int]],
) -> None:
    wins = attempts = 0
    with SyncAdvisoryLock(dsn, max_size=1) as guard:
        barrier.wait()
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            attempts += 1
            with guard.lock(key, min_hold=NO_HOLD) as lease:
                if lease.acquired:
                    wins += 1
                    with counter_lock:
                        inside.value += 1
                        peak.value = max(peak.value, inside.value)
                    time.sleep(0.03)
                    with counter_lock:
                        inside.value -= 1
            if not lease.acquired:
                # Leave the two cores to the holder now and then.
                time.sleep(0.005)
    results.put((wins, attempts))


def test_thirty_processes_contending_for_one_key_never_hold_it_at_once(pg_dsn: str) -> None:
    ctx = quick_processes(_contend)
    processes = 30
    barrier = ctx.Barrier(processes)
    inside = ctx.Value("i", 0, lock=False)
    peak = ctx.Value("i", 0, lock=False)
    counter_lock = ctx.Lock()
    results: multiprocessing.Queue[tuple[int, int]] = ctx.Queue()
    key = unique_key()
    workers = [
        ctx.Process(
            target=_contend,
            args=(pg_dsn, key, barrier, inside, peak, counter_lock, 2.0, results),
        )
        for _ in range(processes)
    ]
    for worker in workers:
        worker.start()
    outcomes = [results.get(timeout=120) for _ in workers]
    for worker in workers:
        worker.join(30)
    assert [0] * processes == [worker.exitcode for worker in workers]
    wins = [won for won, _ in outcomes]
    attempts = sum(tried for _, tried in outcomes)
    assert 1 == peak.value
    assert 0 == inside.value
    # The test could fail: the lock was contended the whole time, by many.
    assert sum(wins) >= 10
    assert attempts > 3 * sum(wins)
    assert sum(1 for won in wins if won) >= 2


async def test_a_long_run_holds_the_lock_throughout_and_releases_it_at_the_end(
    pg_dsn: str,
) -> None:
    key = unique_key()
    async with advisory_lock(pg_dsn, key, min_hold=NO_HOLD, probe_interval=FAST_PROBE) as lease:
        assert lease.acquired
        for _ in range(3):
            await asyncio.sleep(0.4)
            assert await asyncio.to_thread(held_elsewhere, pg_dsn, lease.lock_id)
        async with advisory_lock(pg_dsn, key) as rival:
            assert not rival.acquired
    assert not lease.lost
    assert not lease.cancellation.is_set()
    assert not held_elsewhere(pg_dsn, lease.lock_id)


async def test_a_short_run_keeps_the_lock_until_min_hold_after_the_tick(pg_dsn: str) -> None:
    key = unique_key()
    started = time.monotonic()

    async def late_replica() -> bool:
        await asyncio.sleep(0.5)
        async with advisory_lock(pg_dsn, key) as rival:
            return rival.acquired

    rival = asyncio.create_task(late_replica())
    async with advisory_lock(pg_dsn, key, min_hold=timedelta(seconds=1)) as lease:
        assert lease.acquired
    released_after = time.monotonic() - started
    assert not await rival
    assert 1.0 <= released_after < 1.5
    assert not lease.lost
    assert not held_elsewhere(pg_dsn, lease.lock_id)


async def test_min_hold_counts_from_the_tick_not_from_the_fire(pg_dsn: str) -> None:
    tick = datetime.now(UTC) - timedelta(seconds=4)
    started = time.monotonic()
    async with advisory_lock(pg_dsn, unique_key(), min_hold=timedelta(seconds=5), tick=tick):
        pass
    assert 0.8 <= time.monotonic() - started < 1.5


async def test_a_failing_job_still_releases_its_lock_and_raises(pg_dsn: str) -> None:
    key = unique_key()
    with pytest.raises(RuntimeError, match="disk full"):
        async with advisory_lock(pg_dsn, key, min_hold=NO_HOLD) as lease:
            raise RuntimeError("disk full")
    assert not lease.lost
    assert not held_elsewhere(pg_dsn, lease.lock_id)


async def test_a_terminated_backend_is_signalled_as_lost_within_seconds(pg_dsn: str) -> None:
    key = unique_key()
    async with advisory_lock(pg_dsn, key, probe_interval=FAST_PROBE) as lease:
        assert lease.acquired
        pid = holder_pid(pg_dsn, lease.lock_id)
        assert pid is not None
        with psycopg.connect(pg_dsn, autocommit=True) as admin:
            admin.execute("SELECT pg_terminate_backend(%s)", (pid,))
        cut = time.monotonic()
        reason = await asyncio.wait_for(lease.cancellation.wait(), 5)
        noticed_after = time.monotonic() - cut
        # Another replica can take it now: that is why the job must stop.
        async with advisory_lock(pg_dsn, key, min_hold=NO_HOLD) as rival:
            assert rival.acquired
    assert "lock_lost" == reason
    assert noticed_after < 3
    assert lease.lost


async def test_a_server_restart_while_held_is_signalled_as_lost(own_server: LocalServer) -> None:
    key = unique_key()
    async with advisory_lock(
        own_server.dsn, key, min_hold=timedelta(seconds=30), probe_interval=FAST_PROBE
    ) as lease:
        assert lease.acquired
        own_server.kill()
        cut = time.monotonic()
        own_server.start()
        reason = await asyncio.wait_for(lease.cancellation.wait(), 5)
        noticed_after = time.monotonic() - cut
        assert not held_elsewhere(own_server.dsn, lease.lock_id)
    assert "lock_lost" == reason
    assert noticed_after < 3
    assert lease.lost


async def test_loss_found_only_at_release_still_reports_the_run_as_lost(pg_dsn: str) -> None:
    """No probe ran during this run: ending the transaction is the last proof, and it fails."""
    async with advisory_lock(
        pg_dsn, unique_key(), min_hold=NO_HOLD, probe_interval=timedelta(hours=1)
    ) as lease:
        pid = holder_pid(pg_dsn, lease.lock_id)
        with psycopg.connect(pg_dsn, autocommit=True) as admin:
            admin.execute("SELECT pg_terminate_backend(%s)", (pid,))
    assert lease.lost
    assert "lock_lost" == lease.cancellation.reason


@pytest.fixture
def short_idle_dsn(pg_dsn: str) -> Iterator[str]:
    """A role whose sessions die after 500 ms idle in a transaction."""
    role = f"idle_{uuid.uuid4().hex[:12]}"
    with psycopg.connect(pg_dsn, autocommit=True) as admin:
        admin.execute(f'CREATE ROLE "{role}" LOGIN')
        admin.execute(f"ALTER ROLE \"{role}\" SET idle_in_transaction_session_timeout = '500ms'")
    yield make_conninfo(pg_dsn, user=role)
    with psycopg.connect(pg_dsn, autocommit=True) as admin:
        admin.execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE usename = %s", (role,)
        )
        admin.execute(f'DROP ROLE "{role}"')


async def test_a_held_lock_outlives_a_short_idle_in_transaction_timeout(
    short_idle_dsn: str, pg_dsn: str
) -> None:
    # The setting bites a plain transaction on this role...
    async with await psycopg.AsyncConnection.connect(short_idle_dsn) as plain:
        await plain.execute("SELECT 1")
        await asyncio.sleep(1.0)
        with pytest.raises(psycopg.errors.IdleInTransactionSessionTimeout):
            await plain.execute("SELECT 1")
    # ...but not the guard's, held idle for 2 s (no probe in between).
    async with advisory_lock(
        short_idle_dsn, unique_key(), min_hold=NO_HOLD, probe_interval=timedelta(hours=1)
    ) as lease:
        assert lease.acquired
        await asyncio.sleep(2.0)
        assert await asyncio.to_thread(held_elsewhere, pg_dsn, lease.lock_id)
    assert not lease.lost


async def test_a_loser_ends_its_transaction_and_frees_its_connection(pg_dsn: str) -> None:
    key = unique_key()
    db = Database(pg_dsn, min_size=1, max_size=1)
    await db.open()
    try:
        async with advisory_lock(pg_dsn, key, min_hold=NO_HOLD) as winner:
            async with advisory_lock(db, key) as loser:
                assert not loser.acquired
                # The only pooled connection is back, and idle, inside the block.
                async with db.connection() as conn:
                    assert psycopg.pq.TransactionStatus.IDLE == conn.info.transaction_status
            async with await psycopg.AsyncConnection.connect(pg_dsn) as own:
                async with advisory_lock(own, key) as loser:
                    assert not loser.acquired
                    assert psycopg.pq.TransactionStatus.IDLE == own.info.transaction_status
                assert not own.autocommit
            assert winner.acquired
    finally:
        await db.close()


async def test_a_psycopg_pool_and_a_caller_connection_work_as_sources(pg_dsn: str) -> None:
    key = unique_key()
    async with AsyncConnectionPool(pg_dsn, min_size=1, max_size=1, open=False) as pool:
        async with advisory_lock(pool, key, min_hold=NO_HOLD) as lease:
            assert lease.acquired
            assert held_elsewhere(pg_dsn, lease.lock_id)
        async with pool.connection() as conn:
            assert psycopg.pq.TransactionStatus.IDLE == conn.info.transaction_status
            assert not conn.autocommit
    async with await psycopg.AsyncConnection.connect(pg_dsn) as conn:
        await conn.execute("SELECT 1")
        with pytest.raises(ValidationError) as info:
            async with advisory_lock(conn, key):
                pass
        assert "connection" == info.value.field


async def test_the_decorator_runs_the_winner_and_skips_the_loser(pg_dsn: str) -> None:
    key = unique_key()
    calls: list[int] = []

    @with_advisory_lock(pg_dsn, key, min_hold=NO_HOLD)
    async def process_orders(batch: int) -> int:
        calls.append(batch)
        return batch * 2

    assert 6 == await process_orders(3)
    async with advisory_lock(pg_dsn, key, min_hold=NO_HOLD):
        assert await process_orders(4) is None
    assert [3] == calls


async def test_the_decorator_raises_lease_lost_instead_of_returning(pg_dsn: str) -> None:
    key = unique_key()

    @with_advisory_lock(pg_dsn, key, min_hold=NO_HOLD, probe_interval=FAST_PROBE)
    async def doomed() -> str:
        with psycopg.connect(pg_dsn, autocommit=True) as admin:
            admin.execute("SELECT pg_terminate_backend(%s)", (holder_pid(pg_dsn, lock_id(key)),))
        await asyncio.sleep(1.0)
        return "finished"

    with pytest.raises(LeaseLost, match="doomed"):
        await doomed()


def test_the_sync_facades_guard_a_run_from_plain_threads(pg_dsn: str) -> None:
    key = unique_key()
    with advisory_lock_sync(pg_dsn, key, min_hold=NO_HOLD) as lease:
        assert lease.acquired
        with SyncAdvisoryLock(pg_dsn) as guard, guard.lock(key) as rival:
            assert not rival.acquired
    assert not held_elsewhere(pg_dsn, lease.lock_id)


PINNED = {
    "process-orders": -5772164878430104660,
    "nightly-import": -7418012796119123598,
    "日本": 3054870808829878065,
    "emoji-😀": -8566891597396058557,
}


@pytest.mark.parametrize(("key", "expected"), PINNED.items(), ids=repr)
def test_string_keys_map_to_pinned_lock_ids(key: str, expected: int) -> None:
    assert expected == advisory_lock_id(key)


@pytest.mark.parametrize(
    "vector",
    [v for v in VECTORS["nestjs_pg_cron_lock_hashKey"] if v["key"]],
    ids=lambda v: repr(v["key"]),
)
def test_the_nestjs_hash_reproduces_that_packages_ids(vector: dict[str, Any]) -> None:
    assert vector["lock_id"] == advisory_lock_id(vector["key"], "nestjs-pg-cron-lock")


async def test_the_lock_taken_is_the_id_of_the_key(pg_dsn: str) -> None:
    nestjs = VECTORS["nestjs_pg_cron_lock_hashKey"][1]
    async with advisory_lock(
        pg_dsn, nestjs["key"], key_hash="nestjs-pg-cron-lock", min_hold=NO_HOLD
    ) as lease:
        assert nestjs["lock_id"] == lease.lock_id
        assert holder_pid(pg_dsn, nestjs["lock_id"]) is not None
    async with advisory_lock(pg_dsn, -42, min_hold=NO_HOLD) as lease:
        assert -42 == lease.lock_id
        assert holder_pid(pg_dsn, -42) is not None


ONE_LINER = (
    "('x' || substr(encode(sha256(convert_to('pgcrond:' || key, 'UTF8')), 'hex'), 1, 16))"
    "::bit(64)::bigint"
)


def test_the_documented_sql_computes_the_same_id_inside_postgresql(pg_dsn: str) -> None:
    query = Queries("pgcrond", "leases").get("advisory_lock_id")
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        for key in [*PINNED, "a:b", "x" * 500]:
            row = conn.execute(query, {"key": key}).fetchone()
            assert row is not None
            assert lock_id(key) == row[0]
    docs = (ROOT / "docs" / "guards.md").read_text("utf-8")
    assert ONE_LINER in docs
    assert "((l.classid::bigint << 32) | l.objid::bigint)" in docs


@pytest.mark.parametrize("key_hash", ["pgcrond", "nestjs-pg-cron-lock"])
@pytest.mark.parametrize(
    ("key", "message"),
    [
        ("", "must not be empty"),
        ("   ", "must not be empty"),
        (2**63, "fit a bigint"),
        (-(2**63) - 1, "fit a bigint"),
        (True, "got bool"),
        (1.5, "got float"),
        (None, "got NoneType"),
        (b"orders", "got bytes"),
    ],
)
async def test_bad_keys_are_refused_naming_lock_key(
    key: object, message: str, key_hash: Any
) -> None:
    with pytest.raises(ValidationError, match=message) as info:
        advisory_lock_id(key, key_hash)
    assert "lock_key" == info.value.field
    # Refused before any connection is attempted.
    with pytest.raises(ValidationError, match=message):
        async with advisory_lock("postgresql://nowhere.invalid/x", key, key_hash=key_hash):  # type: ignore[arg-type]
            pass
    with pytest.raises(ValidationError, match=message):
        with_advisory_lock("postgresql://nowhere.invalid/x", key, key_hash=key_hash)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("options", "field"),
    [
        ({"min_hold": timedelta(seconds=-1)}, "min_hold"),
        ({"probe_interval": timedelta(0)}, "probe_interval"),
        ({"tick": datetime(2026, 1, 1)}, "tick"),
    ],
)
async def test_bad_timing_is_refused_naming_the_field(options: dict[str, Any], field: str) -> None:
    with pytest.raises(ValidationError) as info:
        async with advisory_lock("postgresql://nowhere.invalid/x", "k", **options):
            pass
    assert field == info.value.field
