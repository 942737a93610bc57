"""`pgcrond backfill`: a job's past ticks run again, each once, skipping what succeeded.

The plan first, pure: each tick of a range walked by the job's own schedule
(calendar days marked), run or skipped by what its row says. Then the
store: the filing statement opens only what may run, and replicas take a
backfill's ticks at most ``max_parallel`` at a time, in tick order. Then the
real thing: three replicas, seven daily ticks of which three succeeded and
one failed before; ``--dry-run`` says what runs, the backfill runs the four
others once each while one replica is killed mid-run, with its progress on
stderr and its table at the end.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import urllib.request
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any
from zoneinfo import ZoneInfo

import pytest

from pgcrond.core import backfill
from pgcrond.core.schedule import run_key_for
from pgcrond.core.schedule.cron import CronSchedule
from pgcrond.storage.backfills import file_backfill, progress, tick_rows
from pgcrond.storage.history import job_status
from pgcrond.storage.leases import LeaseStore
from pgcrond.storage.requests import finish_request, take_requests
from tests.helpers.daemon_harness import (
    LEDGER,
    PGCROND,
    Cluster,
    cluster,
    config,
    quiet_cron,
    wait_until,
)

DAY = timedelta(days=1)
UTC_ZONE = ZoneInfo("UTC")


@dataclass(frozen=True)
class Row:
    status: str | None
    reason: str | None = None
    owner: str | None = "r:1"
    retry_pending: bool = False
    pending_by: str | None = None


def at(text: str) -> datetime:
    return datetime.fromisoformat(text).replace(tzinfo=UTC)


# -- the plan -----------------------------------------------------------------------------


def test_the_range_is_walked_by_the_schedule_both_ends_included() -> None:
    daily = CronSchedule.parse("0 3 * * *", UTC_ZONE)
    ticks = backfill.ticks_in(daily, at("2026-11-24T03:00:00"), at("2026-11-30T03:00:00"))
    assert [at(f"2026-11-{d}T03:00:00") for d in range(24, 31)] == [t for t, _ in ticks]
    assert [] == backfill.ticks_in(daily, at("2026-11-24T03:00:01"), at("2026-11-25T02:59:59"))


def test_a_range_of_too_many_ticks_is_refused() -> None:
    every_second = CronSchedule.parse("* * * * * *", UTC_ZONE)
    with pytest.raises(ValueError, match="more than 10000 ticks"):
        backfill.ticks_in(every_second, at("2026-11-24T00:00:00"), at("2026-11-25T00:00:00"))


def test_what_succeeded_runs_not_and_what_failed_or_was_missed_runs() -> None:
    ticks: list[tuple[datetime, str | None]] = [
        (at(f"2026-11-{d}T03:00:00"), None) for d in range(21, 30)
    ]
    ticks.append((at("2026-11-30T03:00:00"), "holidays"))
    keys = [run_key_for(t) for t, _ in ticks]
    rows = {
        keys[1]: Row("SUCCESS"),
        keys[2]: Row("FAIL", "error"),
        keys[3]: Row("FAIL", "error", retry_pending=True),
        keys[4]: Row("MISSED", "no_replica"),
        keys[5]: Row("RUNNING"),
        keys[6]: Row("SKIPPED", "paused"),
        keys[7]: Row(None, pending_by="shell:1"),
        keys[8]: Row("MISSED", "late", pending_by="shell:2"),
    }
    planned = backfill.plan(ticks, rows)  # type: ignore[arg-type]
    assert [
        (True, "no record: no replica ran it"),
        (False, "SUCCESS on r:1: it ran"),
        (True, "FAIL/error: it failed for good"),
        (False, "FAIL/error: a retry is pending, it runs by itself"),
        (True, "MISSED/no_replica: it never ran"),
        (False, "RUNNING on r:1: it runs now"),
        (False, "SKIPPED/paused: skipped on purpose, not run again"),
        (False, "requested already by shell:1, not run yet"),
        (False, "requested already by shell:2, not run yet"),
        (False, "calendar:holidays: the schedule skips this day"),
    ] == [(p.run, p.why) for p in planned]


# -- the store ----------------------------------------------------------------------------


async def test_filing_opens_what_may_run_and_replicas_take_at_most_max_parallel_in_order(
    store: LeaseStore,
) -> None:
    ticks = [at("2026-11-24T03:00:00") + n * DAY for n in range(5)]
    keys = [run_key_for(t) for t in ticks]
    filed = await file_backfill(
        store,
        "daily",
        ticks,
        span=(ticks[0], ticks[-1]),
        by="shell:1",
        max_parallel=2,
        lease=timedelta(seconds=20),
        params={"DAY": "x"},
    )
    assert tuple(keys) == filed.run_keys
    rows = await tick_rows(store, "daily", keys)
    # Each tick has a row FAIL/backfill due now, and a request pending.
    assert {("FAIL", "backfill", True, "shell:1")} == {
        (r.status, r.reason, r.retry_pending, r.pending_by) for r in rows.values()
    }
    # Filed ticks wait to run: no failure for `pgcrond status` and the page.
    (status,) = await job_status(store, ["daily"])
    assert (0, None) == (status["consecutive_failures"], status["last_status"])

    async def take(by: str) -> list[str]:
        found = await take_requests(
            store,
            ["daily"],
            by=by,
            within=timedelta(hours=24),
            retake_after=timedelta(minutes=1),
            limit=100,
        )
        assert all(r.trigger == "backfill" and r.params == {"DAY": "x"} for r in found)
        return [r.run_key for r in found]

    first = await take("r:1")
    assert keys[:2] == first
    assert [] == await take("r:2")  # two are taken and not done: the bound holds
    found = await take_requests(
        store, ["daily"], by="r:1", within=timedelta(hours=24), retake_after=timedelta(0), limit=9
    )
    # A dead taker's request is taken again, still within the bound and in order.
    assert keys[:2] == [r.run_key for r in found]
    assert await finish_request(store, found[0], by="r:1", outcome="success")
    assert [keys[2]] == await take("r:3")
    states = [(row["run_key"], row["outcome"]) for row in await progress(store, filed.id)]
    assert [(keys[0], "success")] + [(k, None) for k in keys[1:]] == states
    # Filed again, nothing is opened twice: each tick is pending or running.
    again = await file_backfill(
        store,
        "daily",
        ticks,
        span=(ticks[0], ticks[-1]),
        by="shell:2",
        max_parallel=1,
        lease=timedelta(seconds=20),
        params={},
    )
    assert () == again.run_keys


# -- the real thing -----------------------------------------------------------------------


def run(env: dict[str, str], *args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(PGCROND), *args], check=False, capture_output=True, text=True, env=env, timeout=timeout
    )


def ledger(running: Cluster, phase: str) -> list[dict[str, Any]]:
    return running.rows("SELECT run_key, attempt, pid, at FROM {ledger} WHERE phase = %s", phase)


def most_at_once(starts: list[dict[str, Any]], ends: list[dict[str, Any]]) -> int:
    """The most attempts running together, by the ledger (an attempt without an end ran on)."""
    events = sorted(
        [(row["at"], 1) for row in starts] + [(row["at"], -1) for row in ends],
        key=lambda e: (e[0], e[1]),
    )
    running = peak = 0
    for _, step in events:
        running += step
        peak = max(peak, running)
    return peak


@pytest.mark.slow
@pytest.mark.usefixtures("system_processes")
def test_a_backfill_of_seven_days_runs_the_four_not_succeeded_once_each_through_a_kill(
    pg_dsn: str, schema: str, tmp_path: Path
) -> None:
    cron = quiet_cron()  # daily, twelve hours from now: the schedule never fires it here
    jobs = (
        f"  daily:\n"
        f'    cron: "{cron}"\n'
        f"    entrypoint: {LEDGER}\n"
        f"    concurrency: allow\n"
        f'    env: {{LEDGER_SLEEP: "3"}}\n'
    )
    now = datetime.now(UTC)
    start, end = now - 7 * DAY, now
    ticks = [t for t, _ in backfill.ticks_in(CronSchedule.parse(cron, UTC_ZONE), start, end)]
    keys = [run_key_for(t) for t in ticks]
    assert 7 == len(keys)
    with cluster(pg_dsn, schema, tmp_path) as running:
        path = running.write_config(config(schema, jobs))
        replicas = running.start(path, 3)
        for replica in replicas:
            replica.wait_event("requests_listening", timeout=10)
        env = running.env()
        # Before: three days ran and succeeded, one failed for good.
        for key in (keys[0], keys[2], keys[4]):
            assert 0 == run(env, "trigger", "-c", str(path), "daily", "--run-key", key).returncode
        failed = run(
            env, "trigger", "-c", str(path), "daily", "--run-key", keys[5], "--env", "LEDGER_FAIL=1"
        )
        assert 1 == failed.returncode, failed.stdout
        before = {row["run_key"] for row in ledger(running, "start")}
        span = ["--from", start.isoformat(), "--to", end.isoformat()]
        dry = run(env, "backfill", "-c", str(path), "daily", *span, "--dry-run")
        sys.stdout.write(f"$ pgcrond backfill daily ... --dry-run\n{dry.stdout}")
        dry_json = run(env, "backfill", "-c", str(path), "daily", *span, "--dry-run", "--json")
        began = datetime.now(UTC)
        shell = subprocess.Popen(
            [str(PGCROND), "backfill", "-c", str(path), "daily", *span, "--max-parallel", "2"],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            env=env,
            text=True,
        )
        # Mid-way: once one backfill tick ended, kill -9 a replica running another.
        backfilled = set(keys) - {keys[0], keys[2], keys[4]}
        wait_until(
            lambda: running.rows(
                f'SELECT 1 FROM "{schema}".leases_requests '
                "WHERE backfill_id IS NOT NULL AND done_at IS NOT NULL"
            ),
            60,
            "a backfill tick's end",
        )

        def runner() -> Any:
            now_running = {
                (row["run_key"], row["attempt"])
                for row in running.rows(
                    "SELECT run_key, attempt FROM {leases} WHERE status = 'RUNNING'"
                )
            }
            for replica in replicas:
                for e in replica.events("run_started"):
                    if (e["run_key"], e["attempt"]) in now_running:
                        return replica, e["run_key"]
            return None

        victim, cut = wait_until(runner, 60, "a backfill tick running")
        victim.signal(signal.SIGKILL)
        victim.wait_exit(10)
        # The killed replica's ticks are not done until a survivor takes them
        # again (a minute on): meanwhile the page shows the backfill running.
        survivor = next(r for r in replicas if r is not victim)
        page = f"http://{survivor.http_address()}/status/running"
        with urllib.request.urlopen(page + ".json", timeout=10) as answer:
            shown = json.load(answer)
        with urllib.request.urlopen(page, timeout=10) as answer:
            html = answer.read().decode()
        out, err = shell.communicate(timeout=240)
        sys.stdout.write(f"$ pgcrond backfill daily ... --max-parallel 2\n{err}{out}")
        starts = [r for r in ledger(running, "start") if r["at"] >= began]
        ends = [r for r in ledger(running, "end") if r["at"] >= began]
        attempts = running.rows(
            f"SELECT leases.run_key, a.attempt, a.status, a.trigger FROM {{leases}} JOIN "
            f'"{schema}".leases_attempts a ON a.lease_id = leases.id ORDER BY a.fencing_token'
        )
        rows = running.rows("SELECT run_key, status FROM {leases}")
        history = run(env, "history", "-c", str(path), "--job", "daily")
    assert 0 == dry.returncode, dry.stderr
    plan = json.loads(dry_json.stdout)["ticks"]
    assert keys == [t["run_key"] for t in plan]
    assert ["skip", "run", "skip", "run", "skip", "run", "run"] == [t["action"] for t in plan]
    assert plan[5]["why"] == "FAIL/error: it failed for good"
    assert "daily" in dry.stdout and "would run 4, skips 3" in dry.stdout
    assert 0 == shell.returncode, (out, err)
    # The four ran to their end once each; nothing that had succeeded ran again.
    assert sorted(backfilled) == sorted(r["run_key"] for r in ends)
    assert {keys[0], keys[2], keys[4], keys[5]} == before
    assert set(backfilled) == {r["run_key"] for r in starts}
    assert {k: "SUCCESS" for k in keys} == {r["run_key"]: r["status"] for r in rows}
    # The killed replica's runs (it ran up to two) were taken over, under the same run key.
    lost = {(a["run_key"], a["attempt"]) for a in attempts if a["status"] == "lost"}
    assert cut in {key for key, _ in lost}
    for key in {key for key, _ in lost}:
        assert [("lost", "backfill"), ("success", "takeover")] == [
            (a["status"], a["trigger"]) for a in attempts if a["run_key"] == key
        ][-2:]
    newest = {a["run_key"]: a["trigger"] for a in attempts}
    assert {
        k: "backfill" if (k, 1) not in lost and (k, 2) not in lost else "takeover"
        for k in backfilled
    } == {k: t for k, t in newest.items() if k in backfilled}
    # At most two ran at once (the killed attempts, which never ended, left out).
    assert most_at_once([s for s in starts if (s["run_key"], s["attempt"]) not in lost], ends) <= 2
    # Progress on stderr (JSON off a terminal): done / running / left, to the end.
    progress_lines = [json.loads(line) for line in err.splitlines() if "backfill_progress" in line]
    assert progress_lines[-1] | {"done": 4, "running": 0, "left": 0} == progress_lines[-1]
    assert len(progress_lines) >= 3
    assert all(p["done"] + p["running"] + p["left"] == 4 for p in progress_lines)
    # The final table: each tick, what it came to, why it ran.
    table = out.splitlines()
    assert table[1].startswith("TICK") and "TRIGGER" in table[1]
    assert {line.split()[0]: line.split()[1] for line in table[2:]} == {
        k: ("success" if k in backfilled else "skipped") for k in keys
    }
    assert " backfill " in history.stdout and " takeover " in history.stdout
    (filling,) = shown["backfills"]
    assert ("daily", 2) == (filling["job"], filling["max_parallel"])
    assert 4 == filling["done"] + filling["running"] + filling["left"] and filling["done"] < 4
    assert {"backfill"} == {row["trigger"] for row in shown["running"] if row["job"] == "daily"}
    assert "Backfills running" in html
