"""Acceptance: a tick on a calendar's day through real ``pgcrond run`` replicas.

Every replica fires it like any tick; the claim records it SKIPPED with the
reason ``calendar:<name>``, once for the cluster, and nobody runs it. The
start-up accounting of a replica that comes back after a gap records the
gap's such ticks SKIPPED alike, never MISSED.
"""

from __future__ import annotations

import json
import signal
import time
from collections import Counter
from datetime import UTC, datetime, timedelta
from itertools import pairwise
from pathlib import Path

import pytest

from pgcrond.cli import main
from tests.helpers.daemon_harness import LEDGER, Cluster, cluster, wait_until
from tests.helpers.http import answer

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("system_processes")]

EVERY_S = 2


def holiday_config(schema: str) -> str:
    """Two jobs on one 2 s grid: ``closed`` skips a calendar that holds today, ``open`` runs."""
    today = datetime.now(UTC).date()
    # From yesterday to tomorrow: a run that crosses midnight (UTC) stays on the calendar.
    days = f"{today - timedelta(days=1)}..{today + timedelta(days=1)}"
    return (
        "database:\n"
        "  url: ${PGCROND_DATABASE_URL}\n"
        f"  schema: {schema}\n"
        "defaults:\n"
        "  misfire_grace: 3s\n"
        "  lease: 2s\n"
        "calendars:\n"
        f"  holiday: {{days: ['{days}']}}\n"
        "jobs:\n"
        f"  closed: {{every: {EVERY_S}s, skip_on: [holiday], entrypoint: {LEDGER}}}\n"
        f"  open: {{every: {EVERY_S}s, entrypoint: {LEDGER}}}\n"
    )


def stop(replicas: Cluster) -> None:
    for replica in replicas.replicas:
        if replica.process is not None and replica.process.poll() is None:
            replica.signal(signal.SIGTERM)
    for replica in replicas.replicas:
        assert 0 == replica.wait_exit(45)


def gaps(run_keys: list[str]) -> set[int]:
    ticks = sorted(datetime.fromisoformat(key) for key in run_keys)
    return {int((b - a).total_seconds()) for a, b in pairwise(ticks)}


def page_ticks(address: str, code: str) -> list[dict[str, object]]:
    """The ticks a replica's status page shows for a job (its JSON)."""
    url = f"http://{address}/status/jobs/{code}.json"
    ticks: list[dict[str, object]] = answer(url).raise_for_status().json()["ticks"]
    return ticks


def test_a_calendar_day_records_each_tick_skipped_once_across_three_replicas(
    pg_dsn: str,
    schema: str,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    with cluster(pg_dsn, schema, tmp_path) as running:
        path = running.write_config(holiday_config(schema))
        running.start(path, 3)
        wait_until(
            lambda: len(running.rows("SELECT 1 FROM {leases} WHERE code = 'closed'")) >= 5,
            30,
            "five ticks of the closed job to be recorded",
        )
        shown = page_ticks(running.replicas[0].http_address(), "closed")
        stop(running)
        # history and status, as an operator runs them.
        monkeypatch.setenv("PGCROND_DATABASE_URL", pg_dsn)
        capsys.readouterr()
        assert 0 == main(["history", "-c", str(path), "--job", "closed", "-o", "json"])
        history = json.loads(capsys.readouterr().out)
        assert 0 == main(["status", "-c", str(path), "-o", "json"])
        [status] = [e for e in json.loads(capsys.readouterr().out)["jobs"] if e["job"] == "closed"]
        closed = running.rows(
            "SELECT run_key, status, reason, attempt FROM {leases} WHERE code = 'closed'"
        )
        opened = running.rows("SELECT run_key, status FROM {leases} WHERE code = 'open'")
        ran = running.rows("SELECT DISTINCT job FROM {ledger}")
        skipped_lines = [
            event
            for replica in running.replicas
            for event in replica.events("tick_skipped")
            if event.get("job") == "closed"
        ]
    keys = [row["run_key"] for row in closed]
    assert 1 == max(Counter(keys).values()), "a tick has two rows"
    assert {("SKIPPED", "calendar:holiday", 0)} == {
        (row["status"], row["reason"], row["attempt"]) for row in closed
    }
    # Every tick of the grid has its row: none left out between the first and the last.
    assert {EVERY_S} == gaps(keys)
    assert "SUCCESS" in {row["status"] for row in opened}
    assert [{"job": "open"}] == ran, "the closed job ran"
    # The replica whose claim recorded it says so; the others lost the claim.
    recorded = Counter(event["run_key"] for event in skipped_lines if event["recorded"])
    assert set(keys) == set(recorded) and {1} == set(recorded.values())
    # Shown like any skipped tick: the page, history and status's last tick.
    assert shown and {("SKIPPED", "calendar:holiday")} == {
        (t["status"], t["reason"]) for t in shown
    }
    assert sorted(keys) == sorted(entry["run_key"] for entry in history)
    assert {"calendar:holiday"} == {entry["reason"] for entry in history}
    assert ("SKIPPED", "calendar:holiday") == (
        status["last_tick"]["status"],
        status["last_tick"]["reason"],
    )
    assert max(keys) == status["last_tick"]["run_key"]


def test_accounting_after_a_gap_never_calls_a_calendar_day_tick_missed(
    pg_dsn: str, schema: str, tmp_path: Path
) -> None:
    with cluster(pg_dsn, schema, tmp_path) as running:
        path = running.write_config(holiday_config(schema))
        running.start(path, 1)
        wait_until(
            lambda: len(running.rows("SELECT 1 FROM {leases} WHERE code = 'closed'")) >= 2,
            30,
            "two ticks of the closed job to be recorded",
        )
        stop(running)
        # Past misfire_grace for several ticks of each job: no replica runs.
        time.sleep(4 * EVERY_S + 2)
        [again] = running.start(path, 1, first=1)
        again.wait_event("catch_up_scan_done", timeout=30)
        stop(running)
        rows = running.rows("SELECT code, run_key, status, reason FROM {leases}")
    by_job = {code: [row for row in rows if row["code"] == code] for code in ("closed", "open")}
    # The scan looked: the job that runs has its gap recorded MISSED/no_replica.
    assert "no_replica" in {row["reason"] for row in by_job["open"] if row["status"] == "MISSED"}
    # The other's gap is recorded SKIPPED like the ticks its replicas fired:
    # every tick from the first to the last has its one row, none MISSED.
    closed = by_job["closed"]
    assert {("SKIPPED", "calendar:holiday")} == {(row["status"], row["reason"]) for row in closed}
    assert {EVERY_S} == gaps([row["run_key"] for row in closed])
