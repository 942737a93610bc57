"""Late ticks coalesced (``late_ticks``): of several late ticks of a job, only the newest runs.

Against a real PostgreSQL, the claim statement decides by the database's
clock: a first claim answered once the job's next tick has come records the
tick MISSED/coalesced, or is answered with the row another replica wrote.
With real ``pgcrond run`` replicas: a lone replica killed across ticks, or
stopped (SIGSTOP, a stalled loop), comes back and runs one late tick, not
each; with ``late_ticks: all`` every tick inside ``misfire_grace`` runs.
"""

from __future__ import annotations

import contextlib
import itertools
import signal
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import psycopg
import pytest

from pgcrond.core.keys import Identity
from pgcrond.core.schedule import run_key_for, tick_of
from pgcrond.core.timing import LeaseTiming
from pgcrond.storage.claims import Acquired, NotAcquired
from pgcrond.storage.leases import LeaseStore
from tests.helpers.daemon_harness import LEDGER, Cluster, Replica, cluster, wait_until
from tests.helpers.store import open_store, rows, tick_ago

SHORT = LeaseTiming.build(timedelta(seconds=30), timedelta(seconds=5))
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


# The rows of the ticks after an outage began, and each tick's runs as lateness.
Outcome = tuple[list[dict[str, Any]], dict[str, list[float]]]


@dataclass
class Outage:
    """One lone replica's outage: kill -9 then a restart, or SIGSTOP then SIGCONT."""

    running: Cluster
    late_ticks: str
    outage: str
    path: Path
    replica: Replica | None = None
    down_from: datetime | None = None
    back_at: datetime | None = None

    def begin(self) -> None:
        (self.replica,) = self.running.start(self.path)

    def wait_first_tick(self) -> None:
        wait_until(
            lambda: self.running.rows("SELECT 1 FROM {leases} WHERE status = 'SUCCESS'"),
            20,
            f"{self.running.schema}: a first tick to run",
        )

    def go_away(self) -> None:
        assert self.replica is not None
        # A tick claimed just before the outage may be taken over after it: left out.
        self.down_from = datetime.now(UTC) + timedelta(seconds=1)
        if self.outage == "kill":
            self.replica.signal(signal.SIGKILL)
            self.replica.wait_exit(10)
        else:
            self.replica.signal(signal.SIGSTOP)

    def come_back(self) -> None:
        assert self.replica is not None
        self.back_at = datetime.now(UTC)
        if self.outage == "kill":
            self.running.start(self.path, first=1)
        else:
            self.replica.signal(signal.SIGCONT)

    def two_ticks_after_the_return(self) -> bool:
        # Two ticks after the return have rows: the late ones were decided before.
        assert self.back_at is not None
        after_return = self.running.rows(
            "SELECT 1 FROM {leases} WHERE run_key > %s AND status <> 'RUNNING'",
            run_key_for(self.back_at),
        )
        return len(after_return) >= 2

    def outcome(self) -> Outcome:
        """The rows of the ticks after the outage began, oldest first, and each
        tick's runs as lateness in seconds (start minus tick, by the ledger)."""
        assert self.down_from is not None
        after = run_key_for(self.down_from)
        leases = self.running.rows(
            # The newest tick may still be running: the ticks decided so far.
            "SELECT run_key, status, reason, created_at, finished_at FROM {leases} "
            "WHERE run_key > %s AND status <> 'RUNNING' ORDER BY run_key",
            after,
        )
        decided = {row["run_key"] for row in leases}
        runs: dict[str, list[float]] = {}
        for row in self.running.rows(
            "SELECT run_key, at FROM {ledger} WHERE phase = 'start' AND run_key > %s", after
        ):
            tick = tick_of(row["run_key"])
            assert tick is not None
            if row["run_key"] not in decided:
                continue
            runs.setdefault(row["run_key"], []).append((row["at"] - tick).total_seconds())
        return leases, runs


# (late_ticks, outage): the scenarios the tests below judge.
SCENARIOS = [("coalesce", "kill"), ("coalesce", "stop"), ("all", "kill")]


@pytest.fixture(scope="module")
def outages(
    pg_dsn: str, tmp_path_factory: pytest.TempPathFactory, system_processes: None
) -> Iterator[dict[tuple[str, str], Outcome]]:
    """Three lone replicas, each in a schema of its own, away for the same 4 ticks.

    The outages overlap in time instead of following one another: each is a
    wait of 4 ticks that costs no CPU, and each replica has only its own
    schema's rows to judge (three lone replicas, never a cluster of three).
    """
    with contextlib.ExitStack() as stack:
        scenarios = []
        for late_ticks, outage in SCENARIOS:
            schema = f"late_{late_ticks}_{outage}_{uuid.uuid4().hex[:8]}"
            stack.callback(drop_schema, pg_dsn, schema)
            workdir = tmp_path_factory.mktemp(f"late-{late_ticks}-{outage}")
            running = stack.enter_context(cluster(pg_dsn, schema, workdir))
            path = running.write_config(every_three_seconds(schema, late_ticks))
            scenarios.append(Outage(running, late_ticks, outage, path))
        for scenario in scenarios:
            scenario.begin()
        for scenario in scenarios:
            scenario.wait_first_tick()
        for scenario in scenarios:
            scenario.go_away()
        time.sleep(4 * EVERY + 0.5)  # the outage: 4 ticks are its subject
        for scenario in scenarios:
            scenario.come_back()
        for scenario in scenarios:
            wait_until(scenario.two_ticks_after_the_return, 30, "two ticks after the return")
        yield {(s.late_ticks, s.outage): s.outcome() for s in scenarios}


def drop_schema(dsn: str, schema: str) -> None:
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')


@pytest.mark.slow
@pytest.mark.usefixtures("system_processes")
@pytest.mark.parametrize("outage", ["kill", "stop"])
def test_a_lone_replica_back_from_an_outage_runs_one_late_tick_and_records_the_rest_coalesced(
    outages: dict[tuple[str, str], Outcome],
    outage: str,
) -> None:
    leases, runs = outages["coalesce", outage]
    coalesced = [row["run_key"] for row in leases if row["reason"] == "coalesced"]
    # The ticks that fell while the replica was away are recorded
    # MISSED/coalesced, all but the newest; from it on, every tick ran once,
    # save one claimed while the tick before it still ran (concurrency:
    # forbid): the late tick, claimed just before the next, may outlast it.
    assert len(coalesced) >= 3
    assert coalesced == [row["run_key"] for row in leases[: len(coalesced)]]
    assert all(row["status"] == "MISSED" for row in leases[: len(coalesced)])
    rest = leases[len(coalesced) :]
    assert rest and rest[0]["status"] == "SUCCESS"
    for before, row in itertools.pairwise(rest):
        if (row["status"], row["reason"]) == ("SKIPPED", "overlap"):
            assert before["finished_at"] > row["created_at"], (before, row)
        else:
            assert row["status"] == "SUCCESS", row
    ran = [row["run_key"] for row in rest if row["status"] == "SUCCESS"]
    assert all(len(runs.get(key, [])) == 1 for key in ran), runs
    assert set(runs) <= set(ran)
    # At most one tick ran late (the newest of the outage; it may have come
    # within a second of its tick when the replica came back just after it).
    assert sum(1 for [late] in runs.values() if late > 1.0) <= 1


@pytest.mark.slow
@pytest.mark.usefixtures("system_processes")
def test_with_late_ticks_all_every_tick_inside_the_grace_runs_after_an_outage(
    outages: dict[tuple[str, str], Outcome],
) -> None:
    leases, runs = outages["all", "kill"]
    assert len(leases) >= 6
    assert {"SUCCESS"} == {row["status"] for row in leases}
    assert all(len(runs.get(row["run_key"], [])) == 1 for row in leases)
    # The ticks of the outage ran, late, one after the other.
    assert sum(1 for [late] in runs.values() if late > 1.0) >= 3
