"""Acceptance: the schedule forms through real ``pgcrond run`` replicas, as `next` shows them.

The daemon asks a schedule one question, its next tick after an instant; an
interval with a phase and a cron whose repeated hour runs twice answer it
like any cron, so every replica fires the same ticks under the same run keys
and the lease runs each once. The run keys are the ones `pgcrond next`
printed before the replicas started.
"""

from __future__ import annotations

import signal
import struct
import time
import zoneinfo
from collections import Counter
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from itertools import pairwise
from pathlib import Path

import pytest

from pgcrond.cli import main
from pgcrond.core.schedule import run_key_for
from tests.helpers.daemon_harness import LEDGER, Cluster, cluster, wait_until

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("system_processes")]


def jobs_config(schema: str, jobs: str) -> str:
    return (
        "database:\n"
        "  url: ${PGCROND_DATABASE_URL}\n"
        f"  schema: {schema}\n"
        "defaults:\n"
        "  misfire_grace: 30s\n"
        "  lease: 20s\n"
        "jobs:\n"
        f"{jobs}"
    )


def next_keys(
    path: Path, start: datetime, count: int, capsys: pytest.CaptureFixture[str]
) -> list[str]:
    """The run keys `pgcrond next` prints for the config's one job."""
    capsys.readouterr()
    assert 0 == main(["next", "-c", str(path), "-n", str(count), "--from", run_key_for(start)])
    lines = capsys.readouterr().out.splitlines()[1:]
    return [line.split()[0] for line in lines]


def stop(running: Cluster) -> None:
    for replica in running.replicas:
        replica.signal(signal.SIGTERM)
    assert [0] * len(running.replicas) == [r.wait_exit(45) for r in running.replicas]


def test_an_interval_with_a_phase_runs_each_tick_once_across_three_replicas(
    pg_dsn: str, schema: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    jobs = f"  sync:\n    every: 3s\n    phase: 1s\n    entrypoint: {LEDGER}\n"
    with cluster(pg_dsn, schema, tmp_path) as running:
        path = running.write_config(jobs_config(schema, jobs))
        running.start(path, 3)
        # From a second after all three are ready: every tick after it is theirs.
        keys = next_keys(path, datetime.now(UTC) + timedelta(seconds=1), 5, capsys)
        last = datetime.fromisoformat(keys[-1])
        time.sleep(max(0.0, (last - datetime.now(UTC)).total_seconds()) + 1.5)
        wait_until(
            lambda: running.rows(
                "SELECT 1 FROM {ledger} WHERE phase = 'end' AND run_key = %s", keys[-1]
            ),
            20,
            "the last tick `next` printed to run",
        )
        stop(running)
        rows = running.rows("SELECT run_key, pid FROM {ledger} WHERE phase = 'start'")
    runs = Counter(row["run_key"] for row in rows)
    assert keys == sorted(set(keys) & set(runs)), "a tick `next` printed did not run"
    assert {1} == set(runs.values()), f"a tick ran twice: {runs}"
    # Every run is on the grid: 1970-01-01T00:00:01Z + k × 3 s.
    assert {1} == {int(datetime.fromisoformat(key).timestamp()) % 3 for key in runs}
    assert [3] * 4 == [
        int((datetime.fromisoformat(b) - datetime.fromisoformat(a)).total_seconds())
        for a, b in pairwise(keys)
    ]


def tzif(transitions: list[tuple[int, int]], types: list[tuple[int, str]]) -> bytes:
    """A TZif v2 file (RFC 8536): ``transitions`` of (unix second, type), ``types`` of
    (UTC offset in seconds, abbreviation); no rule past the last transition."""
    chars, infos = b"", []
    for offset, abbreviation in types:
        infos.append(struct.pack(">lBB", offset, 0, len(chars)))
        chars += abbreviation.encode() + b"\0"
    counts = struct.pack(">6l", 0, 0, 0, len(transitions), len(types), len(chars))
    header = b"TZif2" + bytes(15) + counts

    def block(size: str) -> bytes:
        times = b"".join(struct.pack(size, moment) for moment, _ in transitions)
        return times + bytes(kind for _, kind in transitions) + b"".join(infos) + chars

    return header + block(">l") + header + block(">q") + b"\n\n"


@pytest.fixture
def falling_back(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[str, int]]:
    """A zone whose clocks fall back 20 s, 30 s from now: (its name, the change's unix second).

    The replicas read it through PYTHONTZPATH, this process through its TZPATH.
    """
    change = int(time.time()) + 30
    name = f"Pgcrond/FallBack{change}"
    (tmp_path / "tz" / "Pgcrond").mkdir(parents=True)
    (tmp_path / "tz" / name).write_bytes(tzif([(0, 0), (change, 1)], [(20, "FBS"), (0, "FBT")]))
    monkeypatch.setenv("PYTHONTZPATH", str(tmp_path / "tz"))
    before = zoneinfo.TZPATH
    zoneinfo.reset_tzpath([str(tmp_path / "tz")])
    try:
        yield name, change
    finally:
        zoneinfo.reset_tzpath(before)


def test_a_repeated_time_runs_twice_under_two_run_keys_with_dst_both(
    pg_dsn: str,
    schema: str,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    falling_back: tuple[str, int],
) -> None:
    zone, change = falling_back
    # The wall time 10 s after the change: it first happens 10 s before the
    # change (at +00:00:20) and again 10 s after it (at +00:00).
    wall = datetime.fromtimestamp(change + 10, UTC)
    expected = [run_key_for(datetime.fromtimestamp(change + d, UTC)) for d in (-10, 10)]
    jobs = (
        "  meter:\n"
        f"    cron: '{wall.second} {wall.minute} {wall.hour} * * *'\n"
        f"    timezone: {zone}\n"
        "    dst: {repeated: both}\n"
        f"    entrypoint: {LEDGER}\n"
    )
    with cluster(pg_dsn, schema, tmp_path) as running:
        path = running.write_config(jobs_config(schema, jobs))
        start = datetime.fromtimestamp(change - 25, UTC)
        assert expected == next_keys(path, start, 2, capsys)
        running.start(path, 3)
        wait_until(
            lambda: len(running.rows("SELECT 1 FROM {ledger} WHERE phase = 'end'")) >= 2,
            45,
            "both occurrences to run",
        )
        stop(running)
        rows = running.rows("SELECT run_key, idempotency_key FROM {ledger} WHERE phase = 'start'")
    assert expected == sorted(row["run_key"] for row in rows)
    assert 2 == len({row["idempotency_key"] for row in rows})
