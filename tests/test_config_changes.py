"""Config changes without surprises, with real replicas: drift in a rolling change,
a refused duplicate name, and a rename that keeps history, pause and run-once state.
"""

from __future__ import annotations

import json
import signal
from collections import Counter
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from tests.helpers.daemon_harness import (
    LEDGER,
    Cluster,
    Replica,
    cli,
    cluster,
    config,
    wait_until,
)
from tests.helpers.idle import IdleMinute

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("system_processes")]


def restart(running: Cluster, old: Replica, path: Path, number: int) -> Replica:
    old.signal(signal.SIGTERM)
    assert 0 == old.wait_exit(30)
    [new] = running.start(path, 1, first=number)
    return new


def test_a_rolling_schedule_change_shows_drift_while_it_lasts_and_loses_no_other_tick(
    pg_dsn: str, schema: str, tmp_path: Path
) -> None:
    steady = f'  steady: {{cron: "* * * * * *", entrypoint: {LEDGER}}}\n'
    before = config(schema, steady + '  moving: {cron: "*/2 * * * * *", command: [/bin/true]}\n')
    after = config(schema, steady + '  moving: {cron: "*/3 * * * * *", command: [/bin/true]}\n')
    with cluster(pg_dsn, schema, tmp_path) as running:
        old_path = running.write_config(before)
        new_path = tmp_path / "new.yaml"
        new_path.write_text(after)
        replicas = running.start(old_path, 3)
        window_start = datetime.now(UTC).replace(microsecond=0) + timedelta(seconds=1)
        code, out, err = cli(running, "status", "-c", str(old_path))
        assert 0 == code, err
        assert "no drift: every live replica runs config" in out
        during = []
        for n, old in enumerate(replicas):
            replicas[n] = restart(running, old, new_path, 3 + n)
            code, out, err = cli(running, "status", "-c", str(new_path))
            assert 0 == code, err
            during.append(out.partition("\n\n")[2])
        window_end = datetime.now(UTC).replace(microsecond=0) - timedelta(seconds=1)
        for replica in replicas:
            replica.signal(signal.SIGTERM)
        assert [0, 0, 0] == [replica.wait_exit(30) for replica in replicas]
        rows = running.rows("SELECT run_key FROM {ledger} WHERE phase = 'start'")
    # While old and new replicas run side by side: drift, the job that differs.
    for text in during[:2]:
        assert "DRIFT since" in text, text
        assert "2 configs" in text
        assert "  job moving: " in text
        assert "job steady" not in text
    assert "no drift: every live replica runs config" in during[2], during[2]
    # The other job: every tick of the rolling window ran exactly once.
    runs = Counter(row["run_key"] for row in rows)
    expected = {
        (window_start + timedelta(seconds=s)).strftime("%Y-%m-%dT%H:%M:%SZ")
        for s in range(int((window_end - window_start).total_seconds()) + 1)
    }
    assert expected <= set(runs), f"lost ticks: {sorted(expected - set(runs))}"
    assert {1} == set(runs.values()), "duplicate runs"


def test_a_second_replica_with_the_name_of_a_live_one_refuses_to_start(
    pg_dsn: str, schema: str, tmp_path: Path
) -> None:
    with cluster(pg_dsn, schema, tmp_path) as running:
        path = running.write_config(
            config(schema, '  a: {cron: "0 0 1 1 *", command: [/bin/true]}\n')
        )

        def named(n: int) -> Replica:
            replica = Replica(
                f"twin-{n}",
                path,
                tmp_path / f"twin-{n}.log",
                running.env(),
                extra_args=["--replica", "twin"],
            )
            running.replicas.append(replica)
            return replica.start()

        first = named(1)
        first.wait_event("daemon_ready", timeout=30)
        second = named(2)
        assert 0 != second.wait_exit(30)
        [failed] = second.events("daemon_failed")
        # A clean stop leaves the registry: the name is free at once.
        first.signal(signal.SIGTERM)
        assert 0 == first.wait_exit(30)
        third = named(3)
        third.wait_event("daemon_ready", timeout=30)
    assert "replica name 'twin' is held by another live replica" in failed["error"]
    assert "give each replica its own name (--replica or PGCROND_REPLICA)" in failed["error"]
    assert not second.events("daemon_ready")


def test_a_renamed_job_keeps_its_history_pause_and_run_once_state(
    pg_dsn: str, schema: str, tmp_path: Path
) -> None:
    before = config(
        schema,
        f'  old-report: {{cron: "* * * * * *", entrypoint: {LEDGER}}}\n'
        f"  old-seed: {{once: true, entrypoint: {LEDGER}}}\n",
    )
    after = config(
        schema,
        f'  report: {{cron: "* * * * * *", entrypoint: {LEDGER}, renamed_from: [old-report]}}\n'
        f"  seed: {{once: true, entrypoint: {LEDGER}, renamed_from: [old-seed]}}\n",
    )
    with cluster(pg_dsn, schema, tmp_path) as running:
        old_path = running.write_config(before)
        [first] = running.start(old_path, 1)
        wait_until(
            lambda: len(running.rows("SELECT 1 FROM {ledger} WHERE job = 'old-report'")) >= 3,
            20,
            "three runs of old-report",
        )
        new_path = tmp_path / "new.yaml"
        new_path.write_text(after)
        # Against the live replica: with renamed_from a rename, without it a warning.
        no_rename = tmp_path / "no-rename.yaml"
        no_rename.write_text(before.replace("old-", ""))
        planned = cli(running, "plan", "-c", str(new_path))
        unplanned = cli(running, "plan", "-c", str(no_rename))
        first.signal(signal.SIGTERM)
        assert 0 == first.wait_exit(30)
        code, _, err = cli(running, "pause", "old-report", "-c", str(old_path), "--reason", "mv")
        assert 0 == code, err
        old_runs = {
            row["run_key"]
            for row in running.rows(
                "SELECT run_key FROM {leases} WHERE code = 'old-report' AND status = 'SUCCESS'"
            )
        }
        # Two replicas start together: one moves the rows, the other finds them moved.
        replicas = running.start(new_path, 2, first=1)
        for replica in replicas:
            replica.wait_event("initial_attempted", timeout=20)
        renamed = [event for r in replicas for event in r.events("job_renamed")]
        code, out, err = cli(running, "history", "-c", str(new_path), "--job", "report", "--json")
        assert 0 == code, err
        history = json.loads(out)
        code, out, err = cli(running, "status", "-c", str(new_path), "--json")
        assert 0 == code, err
        status = {entry["job"]: entry for entry in json.loads(out)["jobs"]}
        seeds = running.rows("SELECT 1 FROM {ledger} WHERE phase = 'start' AND job LIKE '%%seed'")
        for replica in replicas:
            replica.signal(signal.SIGTERM)
    assert 2 == planned[0], planned
    assert "~ report (renamed)" in planned[1] and "~ seed (renamed)" in planned[1]
    assert 2 == unplanned[0], unplanned
    assert (
        "warning: job seed: a run-once job with the action of removed job old-seed: "
        "without renamed_from: [old-seed] it runs again at the next start"
    ) in unplanned[1]
    assert 2 == len(renamed)
    assert {"report": (len(old_runs), 0, 1), "seed": (0, 1, 0)} == {
        event["job"]: (event["ticks"], event["initial"], event["paused"]) for event in renamed
    }
    assert old_runs <= {row["run_key"] for row in history}
    assert "mv" == status["report"]["paused"]["reason"]
    # The run-once job ran under its old code, and not again under its new one.
    assert 1 == len(seeds)


def test_a_renamed_run_once_job_runs_once_whichever_config_a_replica_starts_with(
    pg_dsn: str, schema: str, tmp_path: Path
) -> None:
    """``seed`` ran before its rename, ``init`` had not: a replica of a config with the
    old codes, started after a replica of the new one renamed them, runs neither."""
    old = config(schema, f"  seed: {{once: true, entrypoint: {LEDGER}}}\n")
    new = config(
        schema,
        f"  seed-v2: {{once: true, entrypoint: {LEDGER}, renamed_from: [seed]}}\n"
        f"  init-v2: {{once: true, entrypoint: {LEDGER}, renamed_from: [init]}}\n",
    )
    rollback = config(
        schema,
        f"  seed: {{once: true, entrypoint: {LEDGER}}}\n"
        f"  init: {{once: true, entrypoint: {LEDGER}}}\n",
    )
    with cluster(pg_dsn, schema, tmp_path) as running:
        paths = [tmp_path / f"{name}.yaml" for name in ("old", "new", "rollback")]
        for path, text in zip(paths, (old, new, rollback), strict=True):
            path.write_text(text)
        for number, (path, jobs) in enumerate(zip(paths, (1, 2, 2), strict=True)):
            [replica] = running.start(path, 1, first=number)

            def attempted(replica: Replica = replica, jobs: int = jobs) -> bool:
                return len(replica.events("initial_attempted")) == jobs

            wait_until(attempted, 20, "each run-once job attempted")
            replica.signal(signal.SIGTERM)
            assert 0 == replica.wait_exit(30)
        runs = Counter(
            row["job"] for row in running.rows("SELECT job FROM {ledger} WHERE phase = 'start'")
        )
        rows = {
            row["code"]: (row["status"], row["reason"])
            for row in running.rows("SELECT code, status, reason FROM {leases}")
        }
    assert {"seed": 1, "init-v2": 1} == dict(runs)
    assert {
        "seed": ("SKIPPED", "renamed"),
        "seed-v2": ("SUCCESS", None),
        "init": ("SKIPPED", "renamed"),
        "init-v2": ("SUCCESS", None),
    } == rows


def test_an_idle_replica_sends_one_statement_a_minute_the_registry_touch(
    idle_minute: IdleMinute,
) -> None:
    # Each replica's whole first idle minute, up to its touch and a few seconds past.
    touches = [line for line in idle_minute.idle if "registry" in line]
    assert idle_minute.replicas == len(touches), touches
    assert all("The registry's one idle statement" in line for line in touches), touches
    assert touches == idle_minute.idle, idle_minute.idle[:5]


def test_a_rename_applied_by_a_reload_keeps_the_run_once_state(
    pg_dsn: str, schema: str, tmp_path: Path
) -> None:
    with cluster(pg_dsn, schema, tmp_path) as running:
        path = running.write_config(
            config(schema, f"  old-seed: {{once: true, entrypoint: {LEDGER}}}\n")
        )
        [replica] = running.start(path, 1)
        replica.wait_event("initial_attempted", timeout=20)
        running.write_config(
            config(
                schema, f"  seed: {{once: true, entrypoint: {LEDGER}, renamed_from: [old-seed]}}\n"
            )
        )
        replica.signal(signal.SIGHUP)
        replica.wait_event("config_reloaded", timeout=20)
        attempted = wait_until(
            lambda: [e for e in replica.events("initial_attempted") if e["job"] == "seed"],
            20,
            "the renamed run-once job to be attempted",
        )
        [renamed] = replica.events("job_renamed")
        starts = running.rows("SELECT job FROM {ledger} WHERE phase = 'start'")
    assert ("seed", 1) == (renamed["job"], renamed["initial"])
    assert "success" != attempted[0]["outcome"]
    assert [{"job": "old-seed"}] == starts
