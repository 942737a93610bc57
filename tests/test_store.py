"""The lease store against a real PostgreSQL: one winner, fencing, reclaim rules."""

from __future__ import annotations

import asyncio
import contextlib
import multiprocessing
import uuid
from collections import Counter
from datetime import timedelta
from pathlib import Path

import psycopg
import pytest

from pgcrond.core.keys import Identity
from pgcrond.core.overlap import FORBID
from pgcrond.core.timing import LeaseTiming
from pgcrond.errors import DatabaseUnavailable, LeaseLost, ValidationError
from pgcrond.storage.claim_answers import PendingClaim
from pgcrond.storage.claims import Acquired, NotAcquired
from pgcrond.storage.embedded import LocalServer
from pgcrond.storage.keepalive import holding
from pgcrond.storage.sql import migrations
from pgcrond.storage.sync_store import SyncLeaseStore
from tests.helpers.store import count_round_trips, open_store, quick_processes

SHORT = LeaseTiming.build(timedelta(seconds=30), timedelta(seconds=5))


def expire(dsn: str, schema: str, lease: Acquired) -> None:
    """Make a lease look expired, as if its owner had stopped heartbeating long ago."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(
            f"UPDATE \"{schema}\".leases SET expires_at = now() - interval '1 second' "
            "WHERE id = %s",
            (lease.id,),
        )


def row(dsn: str, schema: str, identity: Identity) -> dict[str, object]:
    with psycopg.connect(dsn, autocommit=True, row_factory=psycopg.rows.dict_row) as conn:
        found = conn.execute(
            f'SELECT * FROM "{schema}".leases WHERE lock_key = %s', (identity.idempotency_key,)
        ).fetchone()
    assert found is not None
    return found


async def test_fifty_connections_racing_one_identity_have_exactly_one_winner(
    pg_dsn: str, schema: str
) -> None:
    async with contextlib.AsyncExitStack() as stack:
        await stack.enter_async_context(open_store(pg_dsn, schema))
        contenders = [
            await stack.enter_async_context(
                open_store(pg_dsn, schema, owner=f"racer:{n}", migrate=False, max_size=1)
            )
            for n in range(50)
        ]
        # Warm every connection first, so the race is between claims, not connects.
        await asyncio.gather(*(store.db.fetchone("SELECT 1") for store in contenders))
        for round_number in range(20):
            identity = Identity.schedule("race", f"2026-01-01T00:{round_number:02d}:00Z")
            results = await asyncio.gather(*(store.claim(identity, SHORT) for store in contenders))
            winners = [r for r in results if isinstance(r, Acquired)]
            losers = [r for r in results if isinstance(r, NotAcquired)]
            assert 1 == len(winners), f"round {round_number}"
            assert 49 == len(losers)
            assert {"held"} == {loser.reason for loser in losers}


def _race_in_process(
    dsn: str, schema: str, run_keys: list[str], queue: multiprocessing.Queue[tuple[str, str]]
) -> None:
    with SyncLeaseStore(dsn, schema=schema) as store:
        for run_key in run_keys:
            result = store.claim(Identity.schedule("proc-race", run_key), SHORT)
            if isinstance(result, Acquired):
                queue.put((run_key, store.store.owner))


def test_processes_racing_many_identities_win_each_exactly_once(pg_dsn: str, schema: str) -> None:
    with SyncLeaseStore(pg_dsn, schema=schema) as store:
        store.migrate()
    run_keys = [f"2026-01-01T01:{n:02d}:00Z" for n in range(30)]
    ctx = quick_processes(_race_in_process)
    queue: multiprocessing.Queue[tuple[str, str]] = ctx.Queue()
    workers = [
        ctx.Process(target=_race_in_process, args=(pg_dsn, schema, run_keys, queue))
        for _ in range(6)
    ]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join(120)
        assert 0 == worker.exitcode
    wins = [queue.get(timeout=5) for _ in range(len(run_keys))]
    assert sorted(run_keys) == sorted(run_key for run_key, _ in wins)
    assert queue.empty()


async def test_expired_running_is_reclaimed_and_the_old_owner_is_fenced(
    pg_dsn: str, schema: str
) -> None:
    identity = Identity.schedule("sync", "2026-01-01T00:00:00Z")
    async with (
        open_store(pg_dsn, schema, owner="a:1") as a,
        open_store(pg_dsn, schema, owner="b:2") as b,
    ):
        first = await a.claim(identity, SHORT)
        assert isinstance(first, Acquired)
        refused = await b.claim(identity, SHORT)
        assert isinstance(refused, NotAcquired)
        assert "held" == refused.reason
        assert "a:1" == refused.owner
        assert refused.wait is not None
        assert timedelta(seconds=25) < refused.wait <= timedelta(seconds=30)

        expire(pg_dsn, schema, first)
        second = await b.claim(identity, SHORT)
        assert isinstance(second, Acquired)
        assert "takeover" == second.claimed_from
        assert 2 == second.attempt
        assert second.fencing_token > first.fencing_token
        assert first.idempotency_key == second.idempotency_key
        assert first.owner_token != second.owner_token

        assert not await a.heartbeat(first)
        assert not await a.complete(first)
        assert not await a.fail(first, "late")
        assert not await a.release(first)
        assert await b.heartbeat(second)
        assert await b.complete(second)
    assert "SUCCESS" == row(pg_dsn, schema, identity)["status"]
    assert "b:2" == row(pg_dsn, schema, identity)["owner"]


async def test_a_reclaimer_judges_expiry_by_the_holders_own_lease(pg_dsn: str, schema: str) -> None:
    identity = Identity.schedule("long", "2026-01-01T00:00:00Z")
    long_lease = LeaseTiming.build(timedelta(hours=1), timedelta(minutes=1))
    tiny_lease = LeaseTiming.build(timedelta(milliseconds=10), timedelta(0))
    async with open_store(pg_dsn, schema) as store:
        assert isinstance(await store.claim(identity, long_lease), Acquired)
        await asyncio.sleep(0.05)
        refused = await store.claim(identity, tiny_lease)
        assert isinstance(refused, NotAcquired)
        assert "held" == refused.reason


async def test_fail_is_reclaimable_and_a_final_fail_is_not(pg_dsn: str, schema: str) -> None:
    retryable = Identity.schedule("job", "2026-01-01T00:00:00Z")
    final = Identity.schedule("job", "2026-01-01T00:01:00Z")
    later = Identity.schedule("job", "2026-01-01T00:02:00Z")
    async with open_store(pg_dsn, schema) as store:
        lease = await store.claim(retryable, SHORT)
        assert isinstance(lease, Acquired)
        assert await store.fail(lease, "boom")
        again = await store.claim(retryable, SHORT)
        assert isinstance(again, Acquired)
        assert "retry" == again.claimed_from
        assert 2 == again.attempt
        assert again.fencing_token > lease.fencing_token

        lease = await store.claim(final, SHORT)
        assert isinstance(lease, Acquired)
        assert await store.fail(lease, "boom", retry_after=None)
        refused = await store.claim(final, SHORT)
        assert isinstance(refused, NotAcquired)
        assert "failed" == refused.reason

        lease = await store.claim(later, SHORT)
        assert isinstance(lease, Acquired)
        assert await store.fail(lease, "boom", retry_after=timedelta(minutes=5))
        refused = await store.claim(later, SHORT)
        assert isinstance(refused, NotAcquired)
        assert "retry_pending" == refused.reason
        assert refused.wait is not None
        assert timedelta(minutes=4) < refused.wait <= timedelta(minutes=5)


@pytest.mark.parametrize(
    "identity",
    [Identity.schedule("daily", "2026-01-01T00:00:00Z"), Identity.initial("seed")],
    ids=["SCHEDULE", "INITIAL"],
)
async def test_success_is_never_acquired_again(
    pg_dsn: str, schema: str, identity: Identity
) -> None:
    async with open_store(pg_dsn, schema) as store:
        lease = await store.claim(identity, SHORT)
        assert isinstance(lease, Acquired)
        assert await store.complete(lease)
        # Even once the lease it was granted has long expired.
        expire(pg_dsn, schema, lease)
        for _ in range(3):
            refused = await store.claim(identity, SHORT)
            assert isinstance(refused, NotAcquired)
            assert "done" == refused.reason
            assert "SUCCESS" == refused.status


async def test_initial_success_survives_new_store_instances(pg_dsn: str, schema: str) -> None:
    identity = Identity.initial("seed-default-settings")
    async with open_store(pg_dsn, schema) as store:
        lease = await store.claim(identity, SHORT)
        assert isinstance(lease, Acquired)
        assert await store.complete(lease)
    async with open_store(pg_dsn, schema, owner="restarted:2") as store:
        refused = await store.claim(identity, SHORT)
        assert isinstance(refused, NotAcquired)
        assert "done" == refused.reason
    assert row(pg_dsn, schema, identity)["run_key"] is None


async def test_fencing_tokens_increase_with_every_grant(pg_dsn: str, schema: str) -> None:
    identity = Identity.schedule("fenced", "2026-01-01T00:00:00Z")
    tokens = []
    async with open_store(pg_dsn, schema) as store:
        for _ in range(5):
            lease = await store.claim(identity, SHORT)
            assert isinstance(lease, Acquired)
            tokens.append(lease.fencing_token)
            assert await store.release(lease)
    assert tokens == sorted(set(tokens))
    assert 5 == row(pg_dsn, schema, identity)["attempt"]


async def test_heartbeat_extends_the_lease_by_the_granted_lease(pg_dsn: str, schema: str) -> None:
    identity = Identity.schedule("hb", "2026-01-01T00:00:00Z")
    async with open_store(pg_dsn, schema) as store:
        lease = await store.claim(identity, SHORT)
        assert isinstance(lease, Acquired)
        before = row(pg_dsn, schema, identity)["expires_at"]
        await asyncio.sleep(0.05)
        assert await store.heartbeat(lease)
        after = row(pg_dsn, schema, identity)
        assert after["expires_at"] > before  # type: ignore[operator]
        assert 30_000 == after["lease_ms"]


async def test_forbid_overlap_records_a_skip_while_another_tick_runs(
    pg_dsn: str, schema: str
) -> None:
    first = Identity.schedule("slow", "2026-01-01T00:00:00Z")
    second = Identity.schedule("slow", "2026-01-01T00:01:00Z")
    async with open_store(pg_dsn, schema) as store:
        running = await store.claim(first, SHORT, overlap=FORBID)
        assert isinstance(running, Acquired)
        skipped = await store.claim(second, SHORT, overlap=FORBID)
        assert isinstance(skipped, NotAcquired)
        assert "overlap" == skipped.reason
        other_replica = await store.claim(second, SHORT, overlap=FORBID)
        assert isinstance(other_replica, NotAcquired)
        assert "done" == other_replica.reason
        assert "SKIPPED" == other_replica.status
        # Without forbid, ticks overlap freely.
        third = Identity.schedule("slow", "2026-01-01T00:02:00Z")
        assert isinstance(await store.claim(third, SHORT), Acquired)


async def test_run_exclusive_records_success_and_failure(pg_dsn: str, schema: str) -> None:
    ok = Identity.schedule("rx", "2026-01-01T00:00:00Z")
    bad = Identity.schedule("rx", "2026-01-01T00:01:00Z")
    async with open_store(pg_dsn, schema) as store:

        async def job(lease: Acquired) -> int:
            assert lease.identity == ok
            return 42

        assert 42 == await store.run_exclusive(ok, job, timing=SHORT)
        assert "SUCCESS" == row(pg_dsn, schema, ok)["status"]
        refused = await store.run_exclusive(ok, job, timing=SHORT)
        assert isinstance(refused, NotAcquired)

        async def broken(lease: Acquired) -> int:
            raise RuntimeError("disk full")

        with pytest.raises(RuntimeError, match="disk full"):
            await store.run_exclusive(bad, broken, timing=SHORT)
        failed = row(pg_dsn, schema, bad)
        assert "FAIL" == failed["status"]
        assert "RuntimeError: disk full" == failed["error"]


async def test_run_exclusive_tells_the_job_when_the_lease_is_lost(pg_dsn: str, schema: str) -> None:
    identity = Identity.schedule("lost", "2026-01-01T00:00:00Z")
    timing = LeaseTiming.build(timedelta(seconds=10), timedelta(milliseconds=100))
    async with (
        open_store(pg_dsn, schema, owner="a:1") as a,
        open_store(pg_dsn, schema, owner="b:2") as b,
    ):

        async def job(lease: Acquired) -> str:
            expire(pg_dsn, schema, lease)
            assert isinstance(await b.claim(identity, timing), Acquired)
            reason = await asyncio.wait_for(lease.cancellation.wait(), 5)
            return reason

        with pytest.raises(LeaseLost, match="lease_lost"):
            await a.run_exclusive(identity, job, timing=timing)
    taken = row(pg_dsn, schema, identity)
    assert "RUNNING" == taken["status"]
    assert "b:2" == taken["owner"]


async def test_without_heartbeats_the_run_is_told_when_its_lease_ends(
    pg_dsn: str, schema: str
) -> None:
    identity = Identity.schedule("nohb", "2026-01-01T00:00:00Z")
    timing = LeaseTiming.build(timedelta(milliseconds=300), timedelta(0))
    async with open_store(pg_dsn, schema) as store:

        async def job(lease: Acquired) -> str:
            return await asyncio.wait_for(lease.cancellation.wait(), 5)

        with pytest.raises(LeaseLost, match="lease_expired"):
            await store.run_exclusive(identity, job, timing=timing)


async def test_an_outage_cancels_the_run_only_once_the_lease_could_have_expired(
    own_server: LocalServer, schema: str
) -> None:
    identity = Identity.schedule("outage", "2026-01-01T00:00:00Z")
    timing = LeaseTiming.build(timedelta(seconds=1), timedelta(milliseconds=100))
    async with open_store(own_server.dsn, schema) as store:
        lease = await store.claim(identity, timing)
        assert isinstance(lease, Acquired)
        async with holding(lease, store.heartbeat):
            await asyncio.sleep(0.3)
            assert not lease.cancellation.is_set()
            own_server.kill()
            stopped = asyncio.get_running_loop().time()
            reason = await asyncio.wait_for(lease.cancellation.wait(), 5)
            waited = asyncio.get_running_loop().time() - stopped
        assert "lease_expired" == reason
        # Stopped a stop grace (lease/4 here) before the lease could expire,
        # so the run is over before anyone may take the tick over.
        assert 0.4 <= waited <= 0.9
        with pytest.raises(DatabaseUnavailable):
            await store.claim(Identity.schedule("outage", "x"), timing)
        own_server.start()
        # The lease it could not renew is not taken for granted; after restart
        # the expired row is reclaimable by anyone.
        await asyncio.sleep(0.1)
        retaken = await store.claim(identity, timing)
        assert isinstance(retaken, Acquired)
        assert "takeover" == retaken.claimed_from


def _migrate_in_process(dsn: str, schema: str) -> None:
    with SyncLeaseStore(dsn, schema=schema) as store:
        store.migrate()


def test_five_processes_migrating_at_once_all_succeed(pg_dsn: str, schema: str) -> None:
    ctx = multiprocessing.get_context("spawn")
    workers = [ctx.Process(target=_migrate_in_process, args=(pg_dsn, schema)) for _ in range(5)]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join(120)
    assert [0] * 5 == [worker.exitcode for worker in workers]
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        versions = conn.execute(
            f'SELECT version FROM "{schema}".leases_migrations ORDER BY version'
        ).fetchall()
    assert [(version,) for version, _ in migrations()] == versions


def test_sync_facade_runs_a_job_exclusively(pg_dsn: str, schema: str) -> None:
    identity = Identity.initial("sync-facade")
    with SyncLeaseStore(pg_dsn, schema=schema) as store:
        store.migrate()
        assert "ran" == store.run_exclusive(identity, lambda lease: "ran", timing=SHORT)
        refused = store.run_exclusive(identity, lambda lease: "again", timing=SHORT)
        assert isinstance(refused, NotAcquired)
        assert "done" == refused.reason


@pytest.mark.parametrize(
    ("lease", "heartbeat", "field", "message"),
    [
        (timedelta(milliseconds=2), None, "lease", "longer than 2ms"),
        (timedelta(milliseconds=2**53), None, "lease", "at most"),
        (timedelta(seconds=10), timedelta(seconds=5), "heartbeat", "below lease/2"),
        (timedelta(seconds=10), timedelta(seconds=-1), "heartbeat", "must not be negative"),
    ],
)
def test_timing_rules_reject_with_the_field_named(
    lease: timedelta, heartbeat: timedelta | None, field: str, message: str
) -> None:
    with pytest.raises(ValidationError, match=message) as info:
        LeaseTiming.build(lease, heartbeat)
    assert field == info.value.field


def test_timing_defaults_follow_the_reference_design() -> None:
    assert LeaseTiming(timedelta(minutes=15), timedelta(seconds=60)) == LeaseTiming.build()
    assert timedelta(seconds=10) == LeaseTiming.build(timedelta(seconds=30)).heartbeat
    assert timedelta(0) == LeaseTiming.build(timedelta(seconds=1), timedelta(0)).heartbeat


def test_bad_table_names_are_rejected(pg_dsn: str) -> None:
    with pytest.raises(ValidationError, match="table"):
        SyncLeaseStore(pg_dsn, table='x"; DROP TABLE y; --')


async def test_a_chunk_of_claims_shares_one_statement_and_keeps_their_own_outcomes(
    pg_dsn: str, schema: str, tmp_path: Path
) -> None:
    done = Identity.schedule("done", "2026-01-01T00:00:00Z")
    held = Identity.schedule("held", "2026-01-01T00:00:00Z")
    async with open_store(pg_dsn, schema, owner="other:1") as other:
        lease = await other.claim(done, SHORT)
        assert isinstance(lease, Acquired)
        assert await other.complete(lease)
        assert isinstance(await other.claim(held, SHORT), Acquired)
    fresh = [Identity.schedule(f"job-{n}", "2026-01-01T00:00:00Z") for n in range(20)]
    trace = tmp_path / "wire.trace"
    async with open_store(pg_dsn, schema, max_size=1) as store:
        with trace.open("w") as wire:
            async with store.db.connection() as conn:
                conn.pgconn.trace(wire.fileno())
            results = await store.claim_many(
                [PendingClaim(i, SHORT, uuid.uuid4(), None) for i in [done, held, *fresh]]
            )
            async with store.db.connection() as conn:
                conn.pgconn.untrace()
    calls = count_round_trips(trace.read_text())
    assert 1 == calls
    assert isinstance(results[0], NotAcquired)
    assert "done" == results[0].reason
    assert isinstance(results[1], NotAcquired)
    assert "held" == results[1].reason
    assert "other:1" == results[1].owner
    assert all(isinstance(result, Acquired) for result in results[2:])
    assert len({r.fencing_token for r in results[2:] if isinstance(r, Acquired)}) == 20


async def test_replicas_batching_overlapping_claims_never_deadlock_and_win_once(
    pg_dsn: str, schema: str
) -> None:
    identities = [Identity.schedule(f"job-{n:02d}", "2026-01-01T00:00:00Z") for n in range(40)]
    async with contextlib.AsyncExitStack() as stack:
        await stack.enter_async_context(open_store(pg_dsn, schema))
        replicas = [
            await stack.enter_async_context(
                open_store(pg_dsn, schema, owner=f"replica:{n}", migrate=False, max_size=1)
            )
            for n in range(3)
        ]
        for round_number in range(10):
            batch = [Identity.schedule(i.code, f"round-{round_number}") for i in identities]
            # Each replica submits the same identities in a different order.
            orders = [batch, batch[::-1], batch[1::2] + batch[::2]]
            results = await asyncio.gather(
                *(
                    asyncio.gather(*(replica.claim(i, SHORT) for i in order))
                    for replica, order in zip(replicas, orders, strict=True)
                )
            )
            winners = Counter(
                r.identity
                for replica_results in results
                for r in replica_results
                if isinstance(r, Acquired)
            )
            assert set(batch) == set(winners)
            assert {1} == set(winners.values())


async def test_forbid_overlap_also_refuses_a_retry_or_takeover_while_another_tick_runs(
    pg_dsn: str, schema: str
) -> None:
    first = Identity.schedule("slow", "2026-01-01T00:00:00Z")
    second = Identity.schedule("slow", "2026-01-01T00:01:00Z")
    third = Identity.schedule("slow", "2026-01-01T00:02:00Z")
    async with open_store(pg_dsn, schema) as store:
        failed = await store.claim(first, SHORT, overlap=FORBID)
        assert isinstance(failed, Acquired)
        assert await store.fail(failed, "boom")  # reclaimable at once
        running = await store.claim(second, SHORT, overlap=FORBID)
        assert isinstance(running, Acquired)
        retry = await store.claim(first, SHORT, overlap=FORBID)
        assert isinstance(retry, NotAcquired)
        assert "overlap" == retry.reason
        stale = await store.claim(third, SHORT)
        assert isinstance(stale, Acquired)
        expire(pg_dsn, schema, stale)
        takeover = await store.claim(third, SHORT, overlap=FORBID)
        assert isinstance(takeover, NotAcquired)
        assert "overlap" == takeover.reason
        # Once the running tick is done, the retry goes ahead.
        assert await store.complete(running)
        assert isinstance(await store.claim(first, SHORT, overlap=FORBID), Acquired)


async def test_a_repeated_finalize_or_claim_whose_answer_was_lost_still_counts(
    pg_dsn: str, schema: str
) -> None:
    identity = Identity.schedule("repeat", "2026-01-01T00:00:00Z")
    token = uuid.uuid4()
    async with open_store(pg_dsn, schema) as store:
        lease = await store.claim(identity, SHORT, owner_token=token)
        assert isinstance(lease, Acquired)
        # The same claim sent again (its first answer lost): still this owner's.
        again = await store.claim(identity, SHORT, owner_token=token)
        assert isinstance(again, Acquired)
        assert lease.fencing_token == again.fencing_token
        assert await store.complete(lease)
        assert await store.complete(lease)  # the reply of the first one was lost
        assert not await store.fail(lease, "late")  # a different outcome is refused
    assert "SUCCESS" == row(pg_dsn, schema, identity)["status"]


async def test_a_heartbeat_error_that_is_not_an_outage_still_stops_the_run_before_expiry(
    pg_dsn: str, schema: str
) -> None:
    identity = Identity.schedule("readonly", "2026-01-01T00:00:00Z")
    timing = LeaseTiming.build(timedelta(seconds=1), timedelta(milliseconds=100))
    async with open_store(pg_dsn, schema) as store:
        lease = await store.claim(identity, timing)
        assert isinstance(lease, Acquired)
        with psycopg.connect(pg_dsn, autocommit=True) as conn:
            # Every heartbeat now fails with an error that is no outage.
            conn.execute(
                f'CREATE FUNCTION "{schema}".refuse() RETURNS trigger LANGUAGE plpgsql AS '
                "$$BEGIN RAISE EXCEPTION 'read-only for a while'; END$$"
            )
            conn.execute(
                f'CREATE TRIGGER refuse BEFORE UPDATE ON "{schema}".leases '
                f'FOR EACH ROW EXECUTE FUNCTION "{schema}".refuse()'
            )
        failures: list[Exception] = []
        started = asyncio.get_running_loop().time()
        async with holding(lease, store.heartbeat, failures.append):
            reason = await asyncio.wait_for(lease.cancellation.wait(), 5)
        waited = asyncio.get_running_loop().time() - started
    assert "lease_expired" == reason
    assert waited < 1.0
    assert failures
    assert "read-only for a while" in str(failures[0])


def test_a_role_that_may_only_read_and_write_starts_on_a_migrated_table(
    pg_dsn: str, schema: str
) -> None:
    role = f"dml_{uuid.uuid4().hex[:8]}"
    with SyncLeaseStore(pg_dsn, schema=schema) as store:
        store.migrate()
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        conn.execute(f'CREATE ROLE "{role}" LOGIN')
        conn.execute(f'GRANT USAGE ON SCHEMA "{schema}" TO "{role}"')
        conn.execute(f'GRANT SELECT, INSERT, UPDATE ON ALL TABLES IN SCHEMA "{schema}" TO "{role}"')
        conn.execute(f'GRANT USAGE ON ALL SEQUENCES IN SCHEMA "{schema}" TO "{role}"')
    as_role = pg_dsn.replace("postgres@", f"{role}@")
    try:
        with SyncLeaseStore(as_role, schema=schema) as store:
            assert [] == store.migrate()  # no DDL: it is up to date
            lease = store.claim(Identity.initial("dml"), SHORT)
            assert isinstance(lease, Acquired)
            assert store.complete(lease)
    finally:
        with psycopg.connect(pg_dsn, autocommit=True) as conn:
            conn.execute(f'DROP OWNED BY "{role}"')
            conn.execute(f'DROP ROLE "{role}"')
