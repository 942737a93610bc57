"""Late ticks coalesced (``late_ticks``): of several late ticks of a job, only the newest runs.

Against a real PostgreSQL, the claim statement decides by the database's
clock: a first claim answered once the job's next tick has come records the
tick MISSED/coalesced, or is answered with the row another replica wrote.
With real ``pgcrond run`` replicas: a lone replica killed across ticks, or
stopped (SIGSTOP, a stalled loop), comes back and runs one late tick, not
each; with ``late_ticks: all`` every tick inside ``misfire_grace`` runs.
"""

from __future__ import annotations

import signal
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from pgcrond.core.keys import Identity
from pgcrond.core.schedule import run_key_for, tick_of
from pgcrond.core.timing import LeaseTiming
from pgcrond.storage.claims import Acquired, NotAcquired
from pgcrond.storage.leases import LeaseStore
from tests.daemon_harness import Cluster, cluster, wait_until
from tests.store_helpers import open_store
from tests.test_ticks import rows, tick_ago

SHORT = LeaseTiming.build(timedelta(seconds=30), timedelta(seconds=5))
LEDGER = "tests.ledger_jobs:record"
EVERY = 3  # seconds between ticks: room for a restarted replica's claim of the newest


async def first_claim(
    store: LeaseStore, identity: Identity, tick: datetime, superseded_in: timedelta
) -> Acquired | NotAcquired:
    """A tick's first claim as the daemon sends it: a 5 min window, the next tick's time."""
    return await store.claim(
        identity,
        SHORT,
        fire_time=tick,
        late_after=tick + timedelta(minutes=5),
        superseded_at=tick + superseded_in,
    )


# -- the claim statement ------------------------------------------------------------


async def test_a_first_claim_after_the_next_tick_records_the_tick_missed_coalesced(
    pg_dsn: str, schema: str
) -> None:
    tick = tick_ago(6)
    identity = Identity.schedule("coalescing", run_key_for(tick))
    async with open_store(pg_dsn, schema, owner="late:1") as store:
        answer = await first_claim(store, identity, tick, timedelta(seconds=5))
    assert isinstance(answer, NotAcquired)
    assert ("coalesced", "MISSED") == (answer.reason, answer.status)
    assert answer.detail is not None and answer.detail.startswith("coalesced: late:1 claimed it")
    [row] = rows(pg_dsn, schema, "coalescing")
    assert ("MISSED", "coalesced", 0) == (row["status"], row["reason"], row["attempt"])
    assert "next tick (due " in str(row["error"])


async def test_a_claim_before_the_next_tick_runs_however_late(pg_dsn: str, schema: str) -> None:
    tick = tick_ago(6)
    identity = Identity.schedule("slow", run_key_for(tick))
    async with open_store(pg_dsn, schema) as store:
        answer = await first_claim(store, identity, tick, timedelta(minutes=1))
    assert isinstance(answer, Acquired)


async def test_a_coalesced_claim_of_a_tick_another_replica_ran_is_answered_with_its_row(
    pg_dsn: str, schema: str
) -> None:
    tick = tick_ago(6)
    identity = Identity.schedule("ran", run_key_for(tick))
    async with (
        open_store(pg_dsn, schema, owner="on-time:1") as on_time,
        open_store(pg_dsn, schema, owner="stalled:2") as stalled,
    ):
        won = await on_time.claim(identity, SHORT, fire_time=tick)
        assert isinstance(won, Acquired)
        assert await on_time.complete(won)
        late = await first_claim(stalled, identity, tick, timedelta(seconds=1))
    # Lost to the replica that ran it, not a miss of its own.
    assert isinstance(late, NotAcquired)
    assert ("done", "SUCCESS", "on-time:1") == (late.reason, late.status, late.owner)
    assert [("SUCCESS", None)] == [(r["status"], r["reason"]) for r in rows(pg_dsn, schema, "ran")]


async def test_a_retry_due_is_never_closed_by_a_coalescing_claim(pg_dsn: str, schema: str) -> None:
    tick = tick_ago(6)
    identity = Identity.schedule("retrying", run_key_for(tick))
    async with open_store(pg_dsn, schema) as store:
        won = await store.claim(identity, SHORT, fire_time=tick)
        assert isinstance(won, Acquired)
        assert await store.fail(won, "exit status 1", retry_after=timedelta(0))
        answer = await first_claim(store, identity, tick, timedelta(seconds=1))
        # The fire follows a started tick without the bound: the retry runs.
        retried = await store.claim(identity, SHORT, fire_time=tick)
    assert isinstance(answer, NotAcquired) and "retry_pending" == answer.reason
    assert isinstance(retried, Acquired) and 2 == retried.attempt


# -- real replicas ------------------------------------------------------------------


def every_three_seconds(schema: str, late_ticks: str) -> str:
    return (
        "database:\n"
        "  url: ${PGCROND_DATABASE_URL}\n"
        f"  schema: {schema}\n"
        "jobs:\n"
        "  tick:\n"
        f'    cron: "*/{EVERY} * * * * *"\n'
        f"    entrypoint: {LEDGER}\n"
        "    misfire_grace: 2m\n"
        "    lease: 10s\n"
        f"    late_ticks: {late_ticks}\n"
        # With forbid (the default), a late tick claimed while the one before it
        # still runs is SKIPPED/overlap like any other: each runs only with allow.
        f"    concurrency: {'allow' if late_ticks == 'all' else 'forbid'}\n"
    )


def gap_after_an_outage(
    running: Cluster, late_ticks: str, outage: str
) -> tuple[list[dict[str, Any]], dict[str, list[float]]]:
    """One replica, away for 4 ticks (kill -9 then a restart, or SIGSTOP then SIGCONT).

    Returns the rows of the ticks after the outage began, oldest first, and
    each tick's runs as lateness in seconds (start minus tick, by the ledger).
    """
    path = running.write_config(every_three_seconds(running.schema, late_ticks))
    (replica,) = running.start(path)
    wait_until(
        lambda: running.rows("SELECT 1 FROM {leases} WHERE status = 'SUCCESS'"),
        20,
        "a first tick to run",
    )
    # A tick claimed just before the outage may be taken over after it: left out.
    down_from = datetime.now(UTC) + timedelta(seconds=1)
    if outage == "kill":
        replica.signal(signal.SIGKILL)
        replica.wait_exit(10)
    else:
        replica.signal(signal.SIGSTOP)
    time.sleep(4 * EVERY + 0.5)
    back_at = datetime.now(UTC)
    if outage == "kill":
        running.start(path, first=1)
    else:
        replica.signal(signal.SIGCONT)
    # Two ticks after the return have rows: the late ones were decided before.
    wait_until(
        lambda: (
            len(
                running.rows(
                    "SELECT 1 FROM {leases} WHERE run_key > %s AND status <> 'RUNNING'",
                    run_key_for(back_at),
                )
            )
            >= 2
        ),
        30,
        "two ticks after the return",
    )
    after = run_key_for(down_from)
    leases = running.rows(
        # The newest tick may still be running: the ticks decided so far.
        "SELECT run_key, status, reason FROM {leases} WHERE run_key > %s AND status <> 'RUNNING' "
        "ORDER BY run_key",
        after,
    )
    decided = {row["run_key"] for row in leases}
    runs: dict[str, list[float]] = {}
    for row in running.rows(
        "SELECT run_key, at FROM {ledger} WHERE phase = 'start' AND run_key > %s", after
    ):
        tick = tick_of(row["run_key"])
        assert tick is not None
        if row["run_key"] not in decided:
            continue
        runs.setdefault(row["run_key"], []).append((row["at"] - tick).total_seconds())
    return leases, runs


@pytest.mark.slow
@pytest.mark.usefixtures("system_processes")
@pytest.mark.parametrize("outage", ["kill", "stop"])
def test_a_lone_replica_back_from_an_outage_runs_one_late_tick_and_records_the_rest_coalesced(
    pg_dsn: str, schema: str, tmp_path: Path, outage: str
) -> None:
    with cluster(pg_dsn, schema, tmp_path) as running:
        leases, runs = gap_after_an_outage(running, "coalesce", outage)
    coalesced = [row["run_key"] for row in leases if row["reason"] == "coalesced"]
    # The ticks that fell while the replica was away are recorded
    # MISSED/coalesced, all but the newest; from it on, every tick ran once.
    assert len(coalesced) >= 3
    assert coalesced == [row["run_key"] for row in leases[: len(coalesced)]]
    assert all(row["status"] == "MISSED" for row in leases[: len(coalesced)])
    rest = leases[len(coalesced) :]
    assert rest and all(row["status"] == "SUCCESS" for row in rest)
    assert all(len(runs.get(row["run_key"], [])) == 1 for row in rest)
    assert not set(coalesced) & set(runs)
    # At most one tick ran late (the newest of the outage; it may have come
    # within a second of its tick when the replica came back just after it).
    assert sum(1 for [late] in runs.values() if late > 1.0) <= 1


@pytest.mark.slow
@pytest.mark.usefixtures("system_processes")
def test_with_late_ticks_all_every_tick_inside_the_grace_runs_after_an_outage(
    pg_dsn: str, schema: str, tmp_path: Path
) -> None:
    with cluster(pg_dsn, schema, tmp_path) as running:
        leases, runs = gap_after_an_outage(running, "all", "kill")
    assert len(leases) >= 6
    assert {"SUCCESS"} == {row["status"] for row in leases}
    assert all(len(runs.get(row["run_key"], [])) == 1 for row in leases)
    # The ticks of the outage ran, late, one after the other.
    assert sum(1 for [late] in runs.values() if late > 1.0) >= 3
