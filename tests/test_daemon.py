"""Acceptance: real ``pgcrond run`` replicas sharing one PostgreSQL.

Jobs append to a ledger table (tests/ledger_jobs.py), the ground truth of what
ran where; the lease table says what the daemon recorded.
"""

from __future__ import annotations

import functools
import itertools
import signal
import time
from collections import Counter
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from pgcrond.storage.embedded import LocalServer
from tests.faults.checker import owner_pid
from tests.helpers.daemon_harness import (
    LEDGER,
    at,
    attempted_initial,
    cluster,
    config,
    first_start,
    one_shot,
    settled,
    wait_until,
)

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("system_processes")]


def test_three_replicas_run_every_tick_exactly_once(
    pg_dsn: str, schema: str, tmp_path: Path
) -> None:
    jobs = (
        f'  tick-a: {{cron: "* * * * * *", entrypoint: {LEDGER}}}\n'
        f'  tick-b: {{cron: "* * * * * *", entrypoint: {LEDGER}}}\n'
    )
    with cluster(pg_dsn, schema, tmp_path) as running:
        replicas = running.start(running.write_config(config(schema, jobs)), 3)
        window_start = datetime.now(UTC).replace(microsecond=0) + timedelta(seconds=1)
        # 15 ticks of two jobs, 90 claims of three replicas racing: the window
        # is the test's subject, wait it out, then stop the replicas.
        window_end = window_start + timedelta(seconds=15)
        time.sleep((window_end - datetime.now(UTC)).total_seconds() + 1.5)
        for replica in replicas:
            replica.signal(signal.SIGTERM)
        assert [0, 0, 0] == [replica.wait_exit(45) for replica in replicas]
        rows = running.rows("SELECT job, run_key, pid FROM {ledger} WHERE phase = 'start'")
    expected = set()
    moment = window_start
    while moment <= window_end:
        expected.add(moment.strftime("%Y-%m-%dT%H:%M:%SZ"))
        moment += timedelta(seconds=1)
    for job in ("tick-a", "tick-b"):
        runs = Counter(row["run_key"] for row in rows if row["job"] == job)
        in_window = {key: n for key, n in runs.items() if key in expected}
        assert expected == set(in_window), f"{job}: lost ticks"
        assert {1} == set(runs.values()), f"{job}: duplicate runs"
    # Work was spread: more than one replica won ticks.
    assert len({row["pid"] for row in rows}) > 1


def test_a_killed_winner_s_tick_is_finished_by_a_survivor(
    pg_dsn: str, schema: str, tmp_path: Path
) -> None:
    with cluster(pg_dsn, schema, tmp_path) as running:
        cfg = one_shot(schema, seconds=4, sleep=4, lease="2s", heartbeat="500ms")
        running.start(running.write_config(cfg), 3)
        first = first_start(running)
        victim = next(r for r in running.replicas if r.pid == first["pid"])
        victim.signal(signal.SIGKILL)
        killed_at = datetime.now(UTC)
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
    takeover = starts[1]
    assert 2 == len(starts)
    assert first["pid"] != takeover["pid"]
    assert takeover["pid"] == ended[0]["pid"]
    assert first["idempotency_key"] == takeover["idempotency_key"] == ended[0]["idempotency_key"]
    assert first["run_key"] == takeover["run_key"]
    assert 2 == takeover["attempt"]
    assert takeover["fencing_token"] > first["fencing_token"]
    # Within lease + heartbeat of the kill (plus the claim's own latency).
    assert takeover["at"] - killed_at < timedelta(seconds=2 + 0.5 + 1.0)
    assert 1 == len(leases)
    assert "SUCCESS" == leases[0]["status"]
    assert "takeover" not in (leases[0]["reason"] or "")


def test_a_stopped_runner_is_taken_over_and_fenced_when_it_resumes(
    pg_dsn: str, schema: str, tmp_path: Path
) -> None:
    with cluster(pg_dsn, schema, tmp_path) as running:
        # Two replicas: the takeover's own length judges nothing (no third to steal it).
        cfg = one_shot(
            schema, seconds=4, sleep=3, lease="2s", heartbeat="500ms", sleeping_attempts=1
        )
        running.start(running.write_config(cfg), 2)
        first = first_start(running)
        stopped = next(r for r in running.replicas if r.pid == first["pid"])
        survivor = next(r for r in running.replicas if r.pid != first["pid"])
        stopped.signal(signal.SIGSTOP)
        wait_until(
            lambda: running.rows(
                "SELECT * FROM {ledger} WHERE phase = 'end' AND pid = %s", survivor.pid
            ),
            30,
            "the survivor to finish the tick",
        )
        stopped.signal(signal.SIGCONT)
        # On waking it finds its lease gone (expired by its own clock, or its
        # token rotated away) and records nothing.
        finished = stopped.wait_event("run_finished", timeout=20)
        leases = running.rows("SELECT * FROM {leases}")
    assert "lease_lost" == finished["outcome"]
    assert 1 == len(leases)
    assert "SUCCESS" == leases[0]["status"]
    assert survivor.pid == owner_pid(leases[0]["owner"])
    assert 2 == leases[0]["attempt"]


def test_a_stopped_runner_whose_lapsed_lease_nobody_took_finishes_and_records_its_run(
    pg_dsn: str, schema: str, tmp_path: Path
) -> None:
    """SIGSTOP past the lease with no other replica: on waking it asks, renews, finishes.

    Stopping the run unasked on waking would leave its effect (it may be
    written by then) without an outcome, and the tick would run again.
    """
    with cluster(pg_dsn, schema, tmp_path) as running:
        cfg = one_shot(schema, seconds=3, sleep=3, lease="2s", heartbeat="500ms")
        (replica,) = running.start(running.write_config(cfg), 1)
        first_start(running)
        replica.signal(signal.SIGSTOP)
        wait_until(
            lambda: running.rows(
                "SELECT 1 FROM {leases} WHERE status = 'RUNNING' AND expires_at < now()"
            ),
            20,
            "the stopped owner's lease to lapse at the database",
        )
        replica.signal(signal.SIGCONT)
        checked = replica.wait_event("lease_check_after_stall", timeout=20)
        finished = replica.wait_event("run_finished", timeout=20)
        wait_until(
            lambda: running.rows("SELECT 1 FROM {leases} WHERE status = 'SUCCESS'"),
            20,
            "the outcome to be recorded",
        )
        leases = running.rows("SELECT * FROM {leases}")
        phases = running.rows("SELECT phase, attempt FROM {ledger} ORDER BY id")
    assert checked["stalled_past_stop_s"] > 0
    assert "success" == finished["outcome"]
    assert [("start", 1), ("end", 1)] == [(row["phase"], row["attempt"]) for row in phases]
    assert [("SUCCESS", 1)] == [(row["status"], row["attempt"]) for row in leases]


def test_sigterm_lets_the_running_job_finish_and_exits_zero(
    pg_dsn: str, schema: str, tmp_path: Path
) -> None:
    with cluster(pg_dsn, schema, tmp_path) as running:
        cfg = one_shot(schema, seconds=3, sleep=2, lease="10s", heartbeat="1s")
        (replica,) = running.start(running.write_config(cfg), 1)
        first_start(running)
        replica.signal(signal.SIGTERM)
        assert 0 == replica.wait_exit(30)
        phases = [row["phase"] for row in running.rows("SELECT * FROM {ledger} ORDER BY id")]
        leases = running.rows("SELECT * FROM {leases}")
        (stopped,) = replica.events("daemon_stopped")
    assert ["start", "end"] == phases
    assert "SUCCESS" == leases[0]["status"]
    # The daemon ran on its stall probe's loop: the turns with the run in flight were timed.
    assert stopped["loop_stall_max_s"] > 0


def test_shutdown_past_its_grace_releases_the_tick_to_a_survivor(
    pg_dsn: str, schema: str, tmp_path: Path
) -> None:
    with cluster(pg_dsn, schema, tmp_path) as running:
        # The survivor's run ends at once: only its attempt and its pid are judged.
        cfg = one_shot(
            schema,
            seconds=4,
            sleep=6,
            lease="3s",
            heartbeat="1s",
            extra="shutdown_grace: 1s\n",
            sleeping_attempts=1,
        )
        running.start(running.write_config(cfg), 2)
        first = first_start(running)
        leaving = next(r for r in running.replicas if r.pid == first["pid"])
        leaving.signal(signal.SIGTERM)
        assert 0 == leaving.wait_exit(30)
        ended = wait_until(
            lambda: running.rows("SELECT * FROM {ledger} WHERE phase = 'end'"),
            30,
            "the survivor to run the released tick",
        )
        phases = running.rows("SELECT pid, phase, attempt FROM {ledger} ORDER BY id")
    assert ("cancelled", first["pid"]) in {(row["phase"], row["pid"]) for row in phases}
    assert ended[0]["pid"] != first["pid"]
    assert 2 == ended[0]["attempt"]


def test_sighup_with_a_broken_config_keeps_the_old_jobs(
    pg_dsn: str, schema: str, tmp_path: Path
) -> None:
    with cluster(pg_dsn, schema, tmp_path) as running:
        path = running.write_config(
            config(schema, f'  every: {{cron: "* * * * * *", entrypoint: {LEDGER}}}\n')
        )
        (replica,) = running.start(path, 1)
        path.write_text('jobs:\n  every: {cron: "not a cron", command: []}\n')
        replica.signal(signal.SIGHUP)
        rejected = replica.wait_event("config_reload_rejected")
        rejected_at = datetime.now(UTC)
        later = wait_until(
            lambda: running.rows(
                "SELECT * FROM {ledger} WHERE at > %s", rejected_at + timedelta(seconds=1)
            ),
            10,
            "a run after the rejected reload",
        )
    assert any("cron" in error for error in rejected["errors"])
    assert "every" == later[0]["job"]


def test_sighup_with_a_good_config_adds_and_removes_jobs(
    pg_dsn: str, schema: str, tmp_path: Path
) -> None:
    with cluster(pg_dsn, schema, tmp_path) as running:
        path = running.write_config(
            config(schema, f'  old: {{cron: "* * * * * *", entrypoint: {LEDGER}}}\n')
        )
        (replica,) = running.start(path, 1)
        path.write_text(config(schema, f'  new: {{cron: "* * * * * *", entrypoint: {LEDGER}}}\n'))
        replica.signal(signal.SIGHUP)
        reloaded = replica.wait_event("config_reloaded")
        after = datetime.now(UTC) + timedelta(seconds=1)
        wait_until(
            lambda: running.rows("SELECT * FROM {ledger} WHERE job = 'new'"),
            10,
            "the new job to run",
        )
        old_after = running.rows("SELECT * FROM {ledger} WHERE job = 'old' AND at > %s", after)
    assert ["new"] == reloaded["added"]
    assert ["old"] == reloaded["removed"]
    assert [] == old_after


def test_a_database_restart_mid_run_loses_no_outcome(
    own_server: LocalServer, schema: str, tmp_path: Path
) -> None:
    with cluster(own_server.dsn, schema, tmp_path) as running:
        cfg = one_shot(schema, seconds=3, sleep=4, lease="20s", heartbeat="1s")
        (replica,) = running.start(running.write_config(cfg), 1)
        first_start(running)
        own_server.stop()
        replica.wait_event("heartbeat_failed", timeout=10)
        own_server.start()
        leases = wait_until(
            lambda: running.rows("SELECT * FROM {leases} WHERE status <> 'RUNNING'"),
            40,
            "the outcome to be recorded",
        )
        phases = [row["phase"] for row in running.rows("SELECT * FROM {ledger} ORDER BY id")]
    assert "SUCCESS" == leases[0]["status"]
    assert 1 == leases[0]["attempt"]
    assert ["start", "end"] == phases


def test_a_run_once_job_runs_once_across_replicas_and_restarts(
    pg_dsn: str, schema: str, tmp_path: Path
) -> None:
    with cluster(pg_dsn, schema, tmp_path) as running:
        path = running.write_config(
            config(schema, f"  seed: {{once: true, entrypoint: {LEDGER}}}\n")
        )
        for generation in range(3):
            replicas = running.start(path, 3, first=3 * generation)
            # Every replica attempts the INITIAL identity at start and either
            # runs it, finds it done, or finds it held (and follows it).
            for replica in replicas:
                wait_until(
                    functools.partial(attempted_initial, replica),
                    20,
                    f"{replica.name} to attempt the run-once job",
                )
            for replica in replicas:
                replica.signal(signal.SIGTERM)
            assert [0, 0, 0] == [replica.wait_exit(30) for replica in replicas]
        starts = running.rows("SELECT * FROM {ledger} WHERE phase = 'start'")
        leases = running.rows("SELECT * FROM {leases}")
    assert 1 == len(starts)
    assert "INITIAL" == leases[0]["type"]
    assert "SUCCESS" == leases[0]["status"]


def test_concurrency_forbid_skips_ticks_while_the_previous_one_runs(
    pg_dsn: str, schema: str, tmp_path: Path
) -> None:
    jobs = (
        "  slow:\n"
        '    cron: "* * * * * *"\n'
        f"    entrypoint: {LEDGER}\n"
        "    concurrency: forbid\n"
        '    env: {LEDGER_SLEEP: "2.5"}\n'
    )
    with cluster(pg_dsn, schema, tmp_path) as running:
        running.start(running.write_config(config(schema, jobs)), 2)
        wait_until(
            lambda: len(running.rows("SELECT * FROM {ledger} WHERE phase = 'end'")) >= 2,
            20,
            "two runs to finish",
        )
        running.stop_all()
        runs = running.rows(
            "SELECT s.run_key, s.at AS started, e.at AS ended FROM {ledger} s "
            "JOIN {ledger} e ON e.run_key = s.run_key AND e.phase = 'end' "
            "WHERE s.phase = 'start' ORDER BY s.at"
        )
        skipped = running.rows("SELECT * FROM {leases} WHERE status = 'SKIPPED'")
    for earlier, later in itertools.pairwise(runs):
        assert earlier["ended"] <= later["started"], "runs overlapped"
    assert len(skipped) >= 2
    assert {"overlap"} == {row["reason"] for row in skipped}


def test_retries_are_claimed_through_the_lease_by_exactly_one_replica(
    pg_dsn: str, schema: str, tmp_path: Path
) -> None:
    jobs = (
        "  flaky:\n"
        f'    at: "{at(3)}"\n'
        f"    entrypoint: {LEDGER}\n"
        "    retries: 2\n"
        "    retry_delay: 500ms\n"
        '    env: {LEDGER_FAIL: "yes"}\n'
    )
    with cluster(pg_dsn, schema, tmp_path) as running:
        running.start(running.write_config(config(schema, jobs)), 3)
        leases = wait_until(
            lambda: running.rows("SELECT * FROM {leases} WHERE status = 'FAIL' AND attempt = 3"),
            30,
            "the third and last attempt to fail",
        )
        # Give any replica that would wrongly retry a fourth time its chance.
        time.sleep(2)
        attempts = running.rows("SELECT attempt FROM {ledger} WHERE phase = 'fail' ORDER BY id")
        final = running.rows("SELECT * FROM {leases}")
    assert [1, 2, 3] == [row["attempt"] for row in attempts]
    assert leases[0]["retry_at"] is None
    assert "FAIL" == final[0]["status"]
    assert 3 == final[0]["attempt"]


def test_fires_during_an_outage_run_late_within_grace_or_are_reported_missed(
    own_server: LocalServer, schema: str, tmp_path: Path
) -> None:
    # concurrency: allow, so that ticks fired during the outage are not skipped
    # as overlapping the first of them to run once the database is back.
    jobs = (
        f'  every: {{cron: "* * * * * *", entrypoint: {LEDGER}, misfire_grace: 3s, lease: 2s,'
        " concurrency: allow}\n"
    )
    with cluster(own_server.dsn, schema, tmp_path) as running:
        (replica,) = running.start(running.write_config(config(schema, jobs)), 1)
        wait_until(lambda: running.rows("SELECT * FROM {ledger}"), 10, "a first run")
        own_server.stop()
        down_at = datetime.now(UTC)
        missed = replica.wait_event(
            "tick_missed", timeout=20, where=lambda e: e["cause"] == "database_unavailable"
        )
        # From the moment the server is started, not from when start() has
        # seen it ready: the daemon may well claim in between.
        up_at = datetime.now(UTC)
        own_server.start()
        late = wait_until(
            lambda: running.rows(
                "SELECT * FROM {ledger} WHERE run_key < %s AND at > %s",
                up_at.strftime("%Y-%m-%dT%H:%M:%SZ"),
                up_at,
            ),
            20,
            "a tick fired during the outage to run once the database is back",
        )
        replica.signal(signal.SIGTERM)
        assert 0 == replica.wait_exit(30)
        runs = Counter(
            row["run_key"] for row in running.rows("SELECT * FROM {ledger} WHERE phase = 'start'")
        )
    assert missed["run_key"] >= down_at.strftime("%Y-%m-%dT%H:%M:%SZ")
    assert missed["run_key"] not in runs
    assert late[0]["run_key"] >= down_at.strftime("%Y-%m-%dT%H:%M:%SZ")
    assert {1} == set(runs.values())


def test_a_second_sigint_stops_at_once_exits_130_and_gives_the_tick_back(
    pg_dsn: str, schema: str, tmp_path: Path
) -> None:
    with cluster(pg_dsn, schema, tmp_path) as running:
        cfg = one_shot(schema, seconds=3, sleep=60, lease="10s", heartbeat="2s")
        (replica,) = running.start(running.write_config(cfg), 1)
        first_start(running)
        replica.signal(signal.SIGINT)
        replica.wait_event("shutdown_requested")
        # Draining: with a 30 s grace the run would go on; a second SIGINT ends it now.
        replica.signal(signal.SIGINT)
        forced_at = time.monotonic()
        # 128 + SIGINT: a forced stop is not a clean one.
        assert 130 == replica.wait_exit(20)
        stopped_within = time.monotonic() - forced_at
        phases = [row["phase"] for row in running.rows("SELECT * FROM {ledger} ORDER BY id")]
        leases = running.rows("SELECT * FROM {leases}")
    assert stopped_within < 15
    assert ["start", "cancelled"] == phases
    assert ("FAIL", "released") == (leases[0]["status"], leases[0]["reason"])


def test_a_failing_run_once_job_without_retries_runs_once_per_start(
    pg_dsn: str, schema: str, tmp_path: Path
) -> None:
    jobs = (
        "  seed:\n"
        "    once: true\n"
        f"    entrypoint: {LEDGER}\n"
        # Longer than the replicas' start-up spread: a replica whose first
        # claim comes after the retry time is a next start, and rightly runs it.
        "    retry_delay: 2s\n"
        '    env: {LEDGER_FAIL: "yes"}\n'
    )
    with cluster(pg_dsn, schema, tmp_path) as running:
        replicas = running.start(running.write_config(config(schema, jobs)), 3)
        wait_until(
            lambda: running.rows("SELECT * FROM {leases} WHERE status = 'FAIL'"),
            20,
            "the run-once job to fail",
        )
        # The failure is due for a retry 2 s later: a follower that wrongly
        # retried would have done it within these 2.5 s.
        time.sleep(2.5)
        for replica in replicas:
            replica.signal(signal.SIGTERM)
        assert [0, 0, 0] == [replica.wait_exit(30) for replica in replicas]
        first_start_runs = running.rows("SELECT * FROM {ledger} WHERE phase = 'fail'")
        # The next start of any replica tries it again.
        running.start(running.config_path, 1, first=3)
        wait_until(
            lambda: len(running.rows("SELECT * FROM {ledger} WHERE phase = 'fail'")) == 2,
            20,
            "the next start to try the run-once job again",
        )
    assert 1 == len(first_start_runs)


def test_a_retry_whose_scheduler_died_is_taken_by_a_replica_that_starts(
    pg_dsn: str, schema: str, tmp_path: Path
) -> None:
    """A pending retry does not depend on the replica that scheduled it."""
    jobs = (
        "  flaky:\n"
        f'    at: "{at(3)}"\n'
        f"    entrypoint: {LEDGER}\n"
        "    retries: 1\n"
        "    retry_delay: 4s\n"
        '    env: {LEDGER_FAIL: "yes"}\n'
    )
    with cluster(pg_dsn, schema, tmp_path) as running:
        path = running.write_config(config(schema, jobs))
        (first,) = running.start(path, 1)
        wait_until(
            lambda: running.rows("SELECT * FROM {leases} WHERE status = 'FAIL' AND attempt = 1"),
            20,
            "the first attempt's failure to be recorded with a retry time",
        )
        first.signal(signal.SIGKILL)
        # Started after the tick: its scheduler never fires it; only the open row says it exists.
        (second,) = running.start(path, 1, first=1)
        second.wait_event("tick_resumed", timeout=20)
        retried = wait_until(
            lambda: running.rows("SELECT * FROM {ledger} WHERE phase = 'fail' AND attempt = 2"),
            30,
            "the retry to be run by the replica that started",
        )
    assert second.pid == retried[0]["pid"]
