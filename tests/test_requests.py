"""`pgcrond trigger CODE --detach`: a request that one daemon replica runs.

The store: one request per (job, run key) however many shells ask, replicas
woken together take disjoint requests, a listener wakes on the command's
NOTIFY within a bound and sends nothing while it waits. Real replicas: three
shells at once with three replicas run the job once, within about a second; a
request made while no daemon runs is run when one starts; idle replicas that
listen still send no statement; behind PgBouncer in transaction pooling the
replicas say they poll, and the request still runs.
"""

from __future__ import annotations

import asyncio
import signal
import subprocess
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

import psycopg
import pytest

from pgcrond.daemon.requests import POLL_EVERY_S
from pgcrond.daemon.stall import StallProbe
from pgcrond.errors import DatabaseUnavailable
from pgcrond.storage.db import Database
from pgcrond.storage.leases import LeaseStore
from pgcrond.storage.requests import (
    RequestListener,
    channel,
    finish_request,
    release_request,
    request_run,
    take_requests,
)
from tests.helpers import pgbouncer as bouncer
from tests.helpers.daemon_harness import (
    LEDGER,
    PGCROND,
    Cluster,
    clear_of_a_minute_edge,
    cluster,
    config,
    quiet_cron,
    wait_until,
)
from tests.helpers.idle import IdleMinute
from tests.helpers.pgbouncer import server_port

WITHIN = timedelta(hours=24)
RETAKE = timedelta(minutes=1)
# The brief: picked up within about a second; a bound that can fail.
PICKUP_BOUND_S = 3.0


async def take(store: LeaseStore, by: str, codes: list[str] | None = None) -> list[str]:
    found = await take_requests(
        store, codes or ["report"], by=by, within=WITHIN, retake_after=RETAKE, limit=100
    )
    return [request.run_key for request in found]


# -- the store ------------------------------------------------------------------------


async def test_shells_asking_for_one_run_key_make_one_request(store: LeaseStore) -> None:
    answers = await asyncio.gather(
        *(request_run(store, "report", "manual:x", by=f"shell:{n}") for n in range(5))
    )
    assert 1 == sum(answer.opened for answer in answers)
    # A shell that lost the race may not see the winner's row (its snapshot
    # predates that commit); it says so, and opens nothing either way.
    assert ["manual:x"] == await take(store, "replica:a")
    # Taken: nobody else takes it, and asking again does not open it again.
    assert [] == await take(store, "replica:b")
    again = await request_run(store, "report", "manual:x", by="shell:9")
    assert not again.opened and again.earlier_taken_by == "replica:a"


async def test_a_done_request_opens_again_and_a_released_one_is_taken_at_once(
    store: LeaseStore,
) -> None:
    await request_run(store, "report", "manual:y", by="shell:1")
    (request,) = await take_requests(
        store, ["report"], by="replica:a", within=WITHIN, retake_after=RETAKE, limit=10
    )
    assert await release_request(store, request, by="replica:a")
    (request,) = await take_requests(
        store, ["report"], by="replica:b", within=WITHIN, retake_after=RETAKE, limit=10
    )
    assert not await finish_request(store, request, by="replica:a", outcome="success")
    assert await finish_request(store, request, by="replica:b", outcome="success")
    assert [] == await take(store, "replica:c")
    again = await request_run(store, "report", "manual:y", by="shell:2")
    assert again.opened and again.earlier_outcome == "success"
    assert ["manual:y"] == await take(store, "replica:c")


async def test_replicas_taking_together_take_disjoint_requests(store: LeaseStore) -> None:
    for n in range(30):
        await request_run(store, "report", f"manual:{n}", by="shell")
    results = await asyncio.gather(*(take(store, f"replica:{n}") for n in range(3)))
    taken = [key for result in results for key in result]
    assert sorted(taken) == sorted(f"manual:{n}" for n in range(30))
    # Only the jobs a replica knows: a request for another job is left alone.
    await request_run(store, "other", "manual:0", by="shell")
    assert [] == await take(store, "replica:0", ["report"])
    assert ["manual:0"] == await take(store, "replica:0", ["other"])


async def test_a_request_taken_long_ago_and_not_done_is_taken_again(store: LeaseStore) -> None:
    await request_run(store, "report", "manual:z", by="shell")
    assert ["manual:z"] == await take(store, "replica:dead")
    found = await take_requests(
        store,
        ["report"],
        by="replica:b",
        within=WITHIN,
        retake_after=timedelta(milliseconds=1),
        limit=10,
    )
    assert ["manual:z"] == [request.run_key for request in found]


async def test_the_listener_wakes_on_the_request_within_a_bound(
    store: LeaseStore, pg_dsn: str
) -> None:
    listener = RequestListener(pg_dsn, channel(store), application_name="test-listen")
    await listener.open()
    try:
        woken = asyncio.create_task(listener.wait())
        await asyncio.sleep(0.2)
        assert not woken.done()  # nothing requested: it waits
        sent = time.monotonic()
        await request_run(store, "report", "manual:w", by="shell")
        assert {channel(store)} == await asyncio.wait_for(woken, 2.0)
        assert time.monotonic() - sent < 1.0
    finally:
        await listener.close()


def test_a_listener_with_nothing_to_hear_leaves_the_loop_asleep(pg_dsn: str) -> None:
    turns = 0

    def counted() -> bool:
        nonlocal turns
        turns += 1  # at most twice a loop turn (StallProbe: as it begins and ends)
        return False

    async def wait_a_second() -> set[str]:
        listener = RequestListener(pg_dsn, "pgcrond_idle_test", application_name="test-idle")
        await listener.open()
        try:
            before = turns
            began = time.monotonic()
            heard = await listener.wait(1.0)
            assert time.monotonic() - began >= 1.0
            # Woken by the deadline only: psycopg's own wait for notifications
            # woke the loop every 100 ms, twenty turns in this second.
            assert turns - before <= 20, f"{(turns - before) // 2} loop turns while waiting"
            return heard
        finally:
            await listener.close()

    with asyncio.Runner(loop_factory=StallProbe(counted, lambda _: None).new_loop) as runner:
        assert set() == runner.run(wait_a_second())


async def test_a_lost_listener_connection_raises_instead_of_hanging(
    store: LeaseStore, pg_dsn: str
) -> None:
    listener = RequestListener(pg_dsn, channel(store), application_name="test-listen-lost")
    await listener.open()
    try:
        woken = asyncio.create_task(listener.wait())
        await asyncio.sleep(0.2)
        await store.db.execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
            "WHERE application_name = 'test-listen-lost'"
        )
        with pytest.raises(DatabaseUnavailable):
            await asyncio.wait_for(woken, 5.0)
    finally:
        await listener.close()


def test_a_long_table_name_gets_a_channel_that_fits_an_identifier(pg_dsn: str) -> None:
    db = Database(pg_dsn)
    short = LeaseStore(db, schema="pgcrond", table="leases")
    long = LeaseStore(db, schema="s" * 60, table="t" * 60)
    assert "pgcrond.leases_requests" == channel(short)
    assert len(channel(long)) <= 63 and channel(long).startswith("pgcrond_requests_")


# -- the command ------------------------------------------------------------------------


def detach(running: Cluster, path: Path, code: str, *extra: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [str(PGCROND), "trigger", "-c", str(path), code, "--detach", *extra],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=running.env(),
        text=True,
    )


def finished(shell: subprocess.Popen[str], timeout: float = 30) -> tuple[int, str, str]:
    out, err = shell.communicate(timeout=timeout)
    return shell.returncode, out, err


# Asked for, never fired by its schedule during a run of the suite (< 12 h).
REPORT = f'  report: {{cron: "{quiet_cron()}", entrypoint: {LEDGER}}}\n'


@pytest.mark.slow
@pytest.mark.usefixtures("system_processes")
def test_detach_from_three_shells_with_three_replicas_runs_once_within_a_second(
    pg_dsn: str, schema: str, tmp_path: Path
) -> None:
    with cluster(pg_dsn, schema, tmp_path) as running:
        path = running.write_config(config(schema, REPORT))
        replicas = running.start(path, 3)
        for replica in replicas:
            replica.wait_event("requests_listening", timeout=10)
        clear_of_a_minute_edge()
        shells = [detach(running, path, "report") for _ in range(3)]
        results = [finished(shell) for shell in shells]
        returned = datetime.now(UTC)  # the last shell returned by now
        assert [0, 0, 0] == [code for code, _, _ in results], results
        keys = {out.split()[1].rstrip(":") for _, out, _ in results}
        assert 1 == len(keys), results  # the shells agree on one run key
        (run_key,) = keys
        assert run_key.startswith("manual:")
        assert all("pgcrond history --job report" in out for _, out, _ in results)

        def succeeded() -> bool:
            rows = running.rows("SELECT status FROM {leases} WHERE run_key = %s", run_key)
            return bool(rows) and rows[0]["status"] == "SUCCESS"

        wait_until(succeeded, 10, "the request's SUCCESS row")
        time.sleep(1.5)  # room for a duplicate to show up
        starts = running.rows("SELECT run_key, pid, at FROM {ledger} WHERE phase = 'start'")
        leases = running.rows("SELECT status, run_key FROM {leases}")
        taken = [e for r in replicas for e in r.events("request_taken")]
        done = [e for r in replicas for e in r.events("request_done")]
    assert [run_key] == [row["run_key"] for row in starts]
    assert [("SUCCESS", run_key)] == [(row["status"], row["run_key"]) for row in leases]
    # A shell that asks after the run finished opens the request again; the
    # replica that takes it finds the run key done: one run, however it went.
    assert len(taken) == len(done) >= 1, (taken, done)
    assert ["success"] == [e["outcome"] for e in done if e["outcome"] != "lose"], done
    # Picked up within about a second of the command: from the request to the
    # take (the database's clock), and from the last shell's return to the run.
    assert max(e["waited_s"] for e in taken) < PICKUP_BOUND_S, taken
    lag = (starts[0]["at"] - returned).total_seconds()
    assert lag < PICKUP_BOUND_S, f"the run started {lag:.3f}s after the command returned"


@pytest.mark.slow
@pytest.mark.usefixtures("system_processes")
def test_a_request_made_while_no_daemon_runs_is_run_when_one_starts(
    pg_dsn: str, schema: str, tmp_path: Path
) -> None:
    with cluster(pg_dsn, schema, tmp_path) as running:
        path = running.write_config(config(schema, REPORT))
        code, out, err = finished(detach(running, path, "report", "--run-key", "manual:offline"))
        assert 0 == code, err
        assert "requested" in out
        time.sleep(1)
        assert [] == running.rows("SELECT * FROM {ledger}")
        (replica,) = running.start(path, 1)
        taken = replica.wait_event("request_taken", timeout=10)
        replica.wait_event("request_done", timeout=10)
        starts = running.rows("SELECT run_key FROM {ledger} WHERE phase = 'start'")
        # Asked again: the command says the run key is done, and nothing runs twice.
        code, out, _ = finished(detach(running, path, "report", "--run-key", "manual:offline"))
        assert 0 == code and "already ended SUCCESS" in out, out
        replica.wait_event("request_done", where=lambda e: e["outcome"] == "lose", timeout=10)
        again = running.rows("SELECT run_key FROM {ledger} WHERE phase = 'start'")
        replica.signal(signal.SIGTERM)
        assert 0 == replica.wait_exit(30)
    assert "manual:offline" == taken["run_key"]
    assert [{"run_key": "manual:offline"}] == starts == again


@pytest.mark.slow
def test_detach_refuses_an_unknown_job_and_a_bad_run_key(
    pg_dsn: str, schema: str, tmp_path: Path
) -> None:
    with cluster(pg_dsn, schema, tmp_path) as running:
        path = running.write_config(config(schema, REPORT))
        code, out, err = finished(detach(running, path, "nope"))
        assert 2 == code and "no job 'nope' in the config (jobs: report)" in err, (out, err)
        code, _, err = finished(detach(running, path, "report", "--run-key", "   "))
        assert 2 == code and "run_key" in err, err
        with psycopg.connect(pg_dsn) as conn:
            rows = conn.execute(f'SELECT count(*) FROM "{schema}".leases_requests').fetchone()
    assert rows is not None and 0 == rows[0]


@pytest.mark.slow
def test_listening_replicas_send_no_statement_while_idle(idle_minute: IdleMinute) -> None:
    # A minute of three idle listeners: nothing but the registry's timed touch
    # (judged in tests/test_config_changes.py) reached the server.
    assert [] == [line for line in idle_minute.idle if "registry" not in line], idle_minute.idle[:5]
    # Still listening: a request made then was taken at once, and the log shows it.
    assert ["success"] == [e["outcome"] for e in idle_minute.request_done]
    after = idle_minute.after_request
    # (the server logs a statement's first line: its comment)
    assert any("--detach`: record a request" in line for line in after), after[:5]
    assert any("takes the pending requests" in line for line in after), after[:5]


@pytest.mark.slow
@pytest.mark.skipif(bouncer.binary() is None, reason="pgbouncer is not installed")
@pytest.mark.usefixtures("system_processes")
def test_behind_transaction_pooling_requests_are_polled_not_lost(
    pg_dsn: str, schema: str, tmp_path: Path
) -> None:
    with (
        bouncer.pgbouncer(server_port(pg_dsn), "transaction") as pooler,
        cluster(pooler.dsn, schema, tmp_path) as running,
    ):
        path = running.write_config(config(schema, REPORT))
        (replica,) = running.start(path, 1)
        polled = replica.wait_event("requests_polled", timeout=15)
        assert not replica.events("requests_listening")
        sent = time.monotonic()
        code, _, err = finished(detach(running, path, "report"))
        assert 0 == code, err
        done = replica.wait_event("request_done", timeout=POLL_EVERY_S + 10)
        waited = time.monotonic() - sent
    assert polled["every_s"] == POLL_EVERY_S
    assert "success" == done["outcome"]
    assert waited < POLL_EVERY_S + PICKUP_BOUND_S, waited
