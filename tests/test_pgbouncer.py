"""pgcrond behind a real PgBouncer, in transaction and in session pooling.

Each test starts its own PgBouncer (tests/helpers/pgbouncer.py) in front of the
suite's server and runs real ``pgcrond run`` replicas through it: ticks run
exactly once with both guards, a killed lease winner is taken over, a killed
advisory winner frees its lock, a lost advisory lock is noticed, and the
start-up probe names the pooling mode.
"""

from __future__ import annotations

import asyncio
import signal
import time
from collections import Counter
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import psycopg
import pytest

from pgcrond.core.keys import lock_id
from pgcrond.storage.db import Database
from pgcrond.storage.pooling import detect_pooling
from tests.helpers import pgbouncer as bouncer
from tests.helpers.daemon_harness import (
    LEDGER,
    attempted_initial,
    cluster,
    config,
    first_start,
    one_shot,
    settled,
    wait_until,
)
from tests.helpers.pgbouncer import server_port

pytestmark = pytest.mark.skipif(
    bouncer.binary() is None, reason="pgbouncer is not installed (apt-get install pgbouncer)"
)

MODES = ["transaction", "session"]

# The holder of an advisory lock, read on the server itself (not through the pooler).
HOLDER_SQL = """
SELECT pid FROM pg_locks
WHERE locktype = 'advisory' AND objsubid = 1 AND granted
  AND ((classid::bigint << 32) | objid::bigint) = %s
"""


@pytest.fixture(params=MODES)
def pooler(request: pytest.FixtureRequest, pg_dsn: str) -> Iterator[bouncer.PgBouncer]:
    with bouncer.pgbouncer(server_port(pg_dsn), request.param) as running:
        yield running


def holder_pid(dsn: str, lock: int) -> int | None:
    with psycopg.connect(dsn, autocommit=True) as conn:
        row = conn.execute(HOLDER_SQL, (lock,)).fetchone()
    return None if row is None else int(row[0])


def utc(moment: datetime) -> str:
    return moment.strftime("%Y-%m-%dT%H:%M:%SZ")


# -- the start-up probe --------------------------------------------------------


async def probe(dsn: str) -> str:
    db = Database(dsn, min_size=1, max_size=4)
    await db.open()
    try:
        found = await detect_pooling(db)
        # The pool is still usable after the probe.
        assert {"one": 1} == await db.fetchone("SELECT 1 AS one")
        return found.mode
    finally:
        await db.close()


async def test_the_probe_finds_no_pooler_on_a_direct_connection(pg_dsn: str) -> None:
    assert "direct" == await probe(pg_dsn)


@pytest.mark.parametrize(
    ("mode", "pool_size"), [("transaction", 1), ("transaction", 20), ("session", 20)]
)
@pytest.mark.usefixtures("system_processes")
async def test_the_probe_tells_session_from_transaction_pooling(
    pg_dsn: str, mode: bouncer.PoolMode, pool_size: int
) -> None:
    with bouncer.pgbouncer(server_port(pg_dsn), mode, pool_size=pool_size) as running:
        assert mode == await probe(running.dsn)


@pytest.mark.usefixtures("system_processes")
async def test_the_probe_gives_up_within_its_bound_instead_of_hanging(pg_dsn: str) -> None:
    # Session pooling with one server connection: the probe's second client
    # can never get one. It must say "unknown", not wait for PgBouncer's 120 s.
    with bouncer.pgbouncer(server_port(pg_dsn), "session", pool_size=1) as running:
        db = Database(running.dsn, min_size=1, max_size=4)
        await db.open()
        try:
            started = time.monotonic()
            found = await detect_pooling(db, within_s=1.0)
            took = time.monotonic() - started
        finally:
            await asyncio.wait_for(db.close(), 30)
    assert "unknown" == found.mode
    assert "1s" in (found.error or "")
    assert took < 10


# -- the daemon through PgBouncer ----------------------------------------------


@pytest.mark.slow
@pytest.mark.usefixtures("system_processes")
def test_three_replicas_run_every_tick_once_with_both_guards(
    pooler: bouncer.PgBouncer, schema: str, tmp_path: Path
) -> None:
    jobs = (
        f'  by-lease: {{cron: "* * * * * *", entrypoint: {LEDGER}}}\n'
        f'  by-lock: {{cron: "*/2 * * * * *", entrypoint: {LEDGER}, guard: advisory,'
        " min_hold: 1500ms}\n"
        f"  seed: {{once: true, entrypoint: {LEDGER}}}\n"
    )
    with cluster(pooler.dsn, schema, tmp_path) as running:
        path = running.write_config(config(schema, jobs))
        replicas = running.start(path, 3)
        window_start = datetime.now(UTC).replace(microsecond=0) + timedelta(seconds=1)
        window_end = window_start + timedelta(seconds=14)
        # The window is the test's subject: wait it out, then stop the replicas.
        time.sleep((window_end - datetime.now(UTC)).total_seconds() + 1.5)
        # The pooling probe runs beside start-up: a replica stopped before it
        # answered never says what it found (the late one was, once, in a full run).
        probes = [r.wait_event("database_pooling", timeout=10) for r in replicas]
        for replica in replicas:
            replica.signal(signal.SIGTERM)
        assert [0, 0, 0] == [replica.wait_exit(45) for replica in replicas]
        # A restarted replica finds the run-once job done.
        (late,) = running.start(path, 1, first=3)
        wait_until(lambda: attempted_initial(late), 20, "the restarted replica's run-once claim")
        probes.append(late.wait_event("database_pooling", timeout=10))
        late.signal(signal.SIGTERM)
        assert 0 == late.wait_exit(30)
        rows = running.rows("SELECT job, run_key, pid FROM {ledger} WHERE phase = 'start'")
    assert {pooler.mode} == {event["mode"] for event in probes}
    every_second = {utc(window_start + timedelta(seconds=n)) for n in range(15)}
    for job, expected in (
        ("by-lease", every_second),
        ("by-lock", {key for key in every_second if int(key[17:19]) % 2 == 0}),
    ):
        runs = Counter(row["run_key"] for row in rows if row["job"] == job)
        assert expected <= set(runs), f"{job}: lost ticks {sorted(expected - set(runs))}"
        assert {1} == set(runs.values()), f"{job}: duplicate runs"
    assert 1 == sum(1 for row in rows if row["job"] == "seed")
    assert len({row["pid"] for row in rows}) > 1


@pytest.mark.slow
@pytest.mark.usefixtures("system_processes")
def test_a_killed_lease_winner_is_taken_over(
    pooler: bouncer.PgBouncer, schema: str, tmp_path: Path
) -> None:
    with cluster(pooler.dsn, schema, tmp_path) as running:
        cfg = one_shot(schema, seconds=7, sleep=4, lease="2s", heartbeat="500ms")
        running.start(running.write_config(cfg), 3)
        first = first_start(running)
        victim = next(r for r in running.replicas if r.pid == first["pid"])
        victim.signal(signal.SIGKILL)
        ended = wait_until(
            lambda: running.rows("SELECT * FROM {ledger} WHERE phase = 'end'"),
            30,
            "a survivor to finish the tick",
        )
        starts = running.rows("SELECT * FROM {ledger} WHERE phase = 'start' ORDER BY id")
        # The effect lands before the outcome does: wait for the survivor's finalize.
        leases = wait_until(
            lambda: settled(running.rows("SELECT * FROM {leases}")), 10, "the survivor's outcome"
        )
    assert 2 == len(starts)
    assert first["pid"] != starts[1]["pid"] == ended[0]["pid"]
    assert first["idempotency_key"] == starts[1]["idempotency_key"]
    assert 2 == starts[1]["attempt"]
    assert starts[1]["fencing_token"] > first["fencing_token"]
    assert [("SUCCESS", 2)] == [(row["status"], row["attempt"]) for row in leases]


def advisory_cluster_config(schema: str, cron: str, sleep: float) -> str:
    return config(
        schema,
        "  locked:\n"
        f'    cron: "{cron}"\n'
        f"    entrypoint: {LEDGER}\n"
        "    guard: advisory\n"
        "    min_hold: 1s\n"
        f'    env: {{LEDGER_SLEEP: "{sleep}"}}\n',
    )


@pytest.mark.slow
@pytest.mark.usefixtures("system_processes")
def test_a_killed_advisory_winner_frees_the_lock_and_the_next_tick_runs(
    pooler: bouncer.PgBouncer, pg_dsn: str, schema: str, tmp_path: Path
) -> None:
    with cluster(pooler.dsn, schema, tmp_path) as running:
        running.start(running.write_config(advisory_cluster_config(schema, "*/4 * * * * *", 3)), 3)
        first = first_start(running)
        wait_until(lambda: holder_pid(pg_dsn, lock_id("locked")), 5, "the lock to be held")
        victim = next(r for r in running.replicas if r.pid == first["pid"])
        victim.signal(signal.SIGKILL)
        # PgBouncer drops the dead client's server connection, and the lock with it.
        wait_until(lambda: holder_pid(pg_dsn, lock_id("locked")) is None, 5, "the lock to go")
        later = wait_until(
            lambda: running.rows(
                "SELECT * FROM {ledger} WHERE phase = 'end' AND run_key > %s", first["run_key"]
            ),
            15,
            "a later tick to run on a survivor",
        )
        killed_tick = running.rows(
            "SELECT phase FROM {ledger} WHERE run_key = %s ORDER BY id", first["run_key"]
        )
    # Advisory mode has no takeover: the killed tick is not run again.
    assert [{"phase": "start"}] == killed_tick
    assert later[0]["pid"] != first["pid"]


@pytest.mark.slow
@pytest.mark.usefixtures("system_processes")
def test_a_lost_advisory_lock_stops_the_run(
    pooler: bouncer.PgBouncer, pg_dsn: str, schema: str, tmp_path: Path
) -> None:
    with cluster(pooler.dsn, schema, tmp_path) as running:
        cfg = advisory_cluster_config(schema, "*/30 * * * * *", 30).replace(
            'cron: "*/30 * * * * *"', 'at: "' + utc(datetime.now(UTC) + timedelta(seconds=7)) + '"'
        )
        running.start(running.write_config(cfg), 2)
        first = first_start(running)
        winner = next(r for r in running.replicas if r.pid == first["pid"])
        backend = wait_until(lambda: holder_pid(pg_dsn, lock_id("locked")), 5, "the lock")
        with psycopg.connect(pg_dsn, autocommit=True) as admin:
            admin.execute("SELECT pg_terminate_backend(%s)", (backend,))
        cut = time.monotonic()
        finished = winner.wait_event("run_finished", timeout=10)
        noticed_after = time.monotonic() - cut
        phases = running.rows("SELECT phase, pid FROM {ledger} ORDER BY id")
    assert "lease_lost" == finished["outcome"]
    assert noticed_after < 5
    assert [("start", first["pid"]), ("cancelled", first["pid"])] == [
        (row["phase"], row["pid"]) for row in phases
    ]
