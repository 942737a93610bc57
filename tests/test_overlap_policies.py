"""Overlap policies with real replicas: what ran, by the job's own ledger.

Each job is a shell that appends a line to a file when it starts and when it
ends or is stopped (run key, attempt, time, its replica's pid). The ledger,
not the daemon's records, says how many runs of the job were going at once.
"""

from __future__ import annotations

import itertools
import signal
import time
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

import pytest

from tests.helpers.daemon_harness import Cluster, cluster, wait_until

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("system_processes")]


@dataclass
class Run:
    run_key: str
    attempt: str
    pid: int
    started: float
    # When its last line was written ("end" or "stop"), or None: never ended
    # (killed with its replica, or still going when the test stopped).
    ended: float | None = None
    how: str | None = None


def ledger_job(path: Path, *, schedule: str, sleep: float, fields: str) -> str:
    """A job that logs start, then end (or stop, on SIGTERM) to ``path``, after ``sleep`` s."""
    line = "$PGCRON_RUN_KEY $PGCRON_ATTEMPT $(date +%s.%N) $PPID"
    script = (
        f'echo "start {line}" >> {path}; '
        f"trap 'echo \"stop {line}\" >> {path}; exit 143' TERM; "
        f"sleep {sleep} & wait; "
        f'echo "end {line}" >> {path}'
    )
    return (
        "  j:\n"
        f'    cron: "{schedule}"\n'
        f"    shell: '{script.replace(chr(39), chr(39) * 2)}'\n"
        f"{fields}"
    )


def config(schema: str, jobs: str) -> str:
    return (
        "database:\n"
        "  url: ${PGCROND_DATABASE_URL}\n"
        f"  schema: {schema}\n"
        "defaults:\n"
        "  misfire_grace: 30s\n"
        "  late_ticks: all\n"
        "jobs:\n"
        f"{jobs}"
    )


def runs(path: Path) -> list[Run]:
    """The ledger's runs, in the order they started."""
    found: dict[tuple[str, str, int], Run] = {}
    text = path.read_text() if path.exists() else ""
    for line in text.splitlines():
        phase, run_key, attempt, at, pid = line.split()
        key = (run_key, attempt, int(pid))
        if phase == "start":
            found[key] = Run(run_key, attempt, int(pid), float(at))
        else:
            found[key].ended, found[key].how = float(at), phase
    return sorted(found.values(), key=lambda run: run.started)


def most_at_once(ledger: list[Run], killed: dict[int, float], stopped_at: float) -> int:
    """The most runs going at any one moment.

    A run with no last line ended when its replica was killed (the replica's
    death kills its job), or was still going at ``stopped_at``.
    """
    edges: list[tuple[float, int]] = []
    for run in ledger:
        end = run.ended if run.ended is not None else killed.get(run.pid, stopped_at)
        # An end at the same instant as a start is counted first: no overlap.
        edges += [(run.started, 1), (end, -1)]
    going = most = 0
    for _, step in sorted(edges):
        going += step
        most = max(most, going)
    return most


def tick_of(run_key: str) -> float:
    return datetime.strptime(run_key, "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=UTC).timestamp()


def leases(running: Cluster, status: str) -> list[dict[str, object]]:
    return running.rows(
        "SELECT run_key, status, reason, error FROM {leases} WHERE status = %s ORDER BY run_key",
        status,
    )


def test_replace_stops_the_running_tick_for_each_new_one_and_never_runs_two(
    pg_dsn: str, schema: str, tmp_path: Path
) -> None:
    """A 10 s job every 3 s: each tick stops the one before, which is recorded replaced."""
    ledger = tmp_path / "ledger.txt"
    job = ledger_job(
        ledger,
        schedule="*/3 * * * * *",
        sleep=10,
        fields="    concurrency: replace\n    lease: 3s\n    heartbeat: 500ms\n",
    )
    with cluster(pg_dsn, schema, tmp_path) as running:
        running.start(running.write_config(config(schema, job)), 2)
        replaced = wait_until(
            lambda: [r for r in leases(running, "SKIPPED") if r["reason"] == "replaced"][2:],
            40,
            "three ticks replaced",
        )
        running.stop_all()
        stopped_at = time.time()
        skipped = leases(running, "SKIPPED")
    assert replaced
    ledger_runs = runs(ledger)
    assert 1 == most_at_once(ledger_runs, {}, stopped_at)
    by_key = {run.run_key: run for run in ledger_runs}
    replaced_keys = [str(r["run_key"]) for r in skipped if r["reason"] == "replaced"]
    # A replaced tick that had started was stopped (SIGTERM, "stop"), never
    # ran to its end; each was replaced by a named newer tick.
    started_and_replaced = [key for key in replaced_keys if key in by_key]
    assert len(started_and_replaced) >= 2
    assert {"stop"} == {by_key[key].how for key in started_and_replaced}
    for row in skipped:
        assert "replaced" == row["reason"]
        assert "replaced" in str(row["error"])
    # No run of a 10 s job ever reached its end: the next tick came first.
    assert "end" not in {run.how for run in ledger_runs}


def test_buffer_one_runs_one_waiting_tick_when_the_running_one_ends_and_skips_the_rest(
    pg_dsn: str, schema: str, tmp_path: Path
) -> None:
    ledger = tmp_path / "ledger.txt"
    job = ledger_job(
        ledger,
        schedule="* * * * * *",
        sleep=3,
        fields="    concurrency: buffer_one\n    lease: 5s\n",
    )
    with cluster(pg_dsn, schema, tmp_path) as running:
        running.start(running.write_config(config(schema, job)), 2)
        wait_until(lambda: [r for r in runs(ledger) if r.ended][2:], 40, "three runs to end")
        running.stop_all()
        stopped_at = time.time()
        skipped = leases(running, "SKIPPED")
    ledger_runs = runs(ledger)
    assert 1 == most_at_once(ledger_runs, {}, stopped_at)
    assert len(skipped) >= 3
    assert {"overlap"} == {row["reason"] for row in skipped}
    skipped_keys = {str(row["run_key"]) for row in skipped}
    assert not skipped_keys & {run.run_key for run in ledger_runs}
    finished = [run for run in ledger_runs if run.ended is not None]
    for earlier, later in itertools.pairwise(finished):
        assert earlier.ended is not None
        # The later tick came while the earlier ran: it waited, under its own
        # run key, and started once the earlier one ended (claimed again
        # each second).
        assert tick_of(later.run_key) < earlier.ended
        assert 0 <= later.started - earlier.ended < 3.0, (earlier, later)
    # A waiting tick's start is its first attempt, not a retry.
    assert {"1"} == {run.attempt for run in ledger_runs}


def test_max_concurrent_holds_across_three_replicas_and_a_kill_of_a_runner(
    pg_dsn: str, schema: str, tmp_path: Path
) -> None:
    """max_concurrent: 2: never three going at once, and the bound is reached."""
    ledger = tmp_path / "ledger.txt"
    job = ledger_job(
        ledger,
        schedule="* * * * * *",
        sleep=5,
        fields="    max_concurrent: 2\n    lease: 2s\n    heartbeat: 500ms\n",
    )
    with cluster(pg_dsn, schema, tmp_path) as running:
        replicas = running.start(running.write_config(config(schema, job)), 3)
        by_pid = {replica.pid: replica for replica in replicas}

        def runner() -> int | None:
            going = [r for r in runs(ledger) if r.ended is None and r.pid in by_pid]
            return going[0].pid if going else None

        victim = wait_until(runner, 30, "a run going on a replica")
        before = len(runs(ledger))
        by_pid[victim].signal(signal.SIGKILL)
        by_pid[victim].wait_exit(10)
        killed = {victim: time.time()}
        # The dead runner's slot frees when its lease lapses: runs start after it.
        wait_until(lambda: len(runs(ledger)) >= before + 3, 40, "three more runs to start")
        wait_until(lambda: [r for r in runs(ledger) if r.ended][3:], 40, "four runs to end")
        running.stop_all()
        stopped_at = time.time()
        skipped = leases(running, "SKIPPED")
    ledger_runs = runs(ledger)
    assert 2 == most_at_once(ledger_runs, killed, stopped_at)
    # The killed replica's run never ended by itself: its replica's death stopped it.
    assert [run for run in ledger_runs if run.pid == victim and run.ended is None]
    assert [run for run in ledger_runs if run.started > killed[victim]]
    assert len(skipped) >= 2
    assert {"overlap"} == {row["reason"] for row in skipped}
