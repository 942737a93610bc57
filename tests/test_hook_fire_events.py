"""Hooks for what the fire finds besides a run: a tick not started by its deadline, misses
found after the fact, a success's output tail.

Real daemons against a real database (behind the suite's TCP proxy where the
database must go away) and a real local HTTP receiver (tests/helpers/hook_receiver.py).
"""

from __future__ import annotations

import json
import signal
import time
from collections import Counter
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from pgcrond.config.loader import load_config
from pgcrond.core.keys import Identity
from pgcrond.daemon.observers import Watched
from pgcrond.events import FireEvents
from tests.faults.proxy import proxied
from tests.helpers.daemon_harness import Cluster, at, cluster, config, wait_until
from tests.helpers.hook_receiver import Receiver, receiving


def hooks(receiver: Receiver, *names: str) -> str:
    return "".join(f"    {name}: {{webhook: {receiver.base}/hook}}\n" for name in names)


def of(events: list[dict[str, Any]], kind: str) -> list[dict[str, Any]]:
    return [e for e in events if e["event"] == kind]


def stop_gracefully(running: Cluster) -> None:
    """SIGTERM: each replica sends what it still has to (the hooks' drain) before it exits."""
    for replica in running.replicas:
        replica.signal(signal.SIGTERM)
    for replica in running.replicas:
        assert 0 == replica.wait_exit(30)
    running.replicas.clear()


def instant_of(text: str) -> datetime:
    return datetime.strptime(text, "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=UTC)


def sleep_until(moment: datetime) -> None:
    """The test's own wait for a wall-clock moment the schedule names (a fault's start)."""
    time.sleep(max(0.0, (moment - datetime.now(UTC)).total_seconds()))


@pytest.mark.slow
@pytest.mark.usefixtures("system_processes")
def test_a_success_tells_its_output_tail_bounded_and_redacted(
    pg_dsn: str, schema: str, tmp_path: Path
) -> None:
    """on_success carries the attempt's output tail as its record keeps it: the password
    in a URL masked, the middle of 40 kB dropped, the last line kept."""
    script = (
        "echo connecting to postgresql://app:s3cret-pw@db/x; "
        "head -c 40000 /dev/zero | tr '\\\\0' x; echo; echo last line"
    )
    with receiving() as receiver:
        jobs = f'  chatty:\n    at: "{at(2)}"\n    shell: "{script}"\n' + hooks(
            receiver, "on_success"
        )
        with cluster(pg_dsn, schema, tmp_path) as running:
            running.start(running.write_config(config(schema, jobs)), 1)
            wait_until(receiver.events, 30, "the on_success hook")
            running.stop_all()
    (told,) = receiver.events()
    stdout = told["output"]["stdout"]
    assert ("run_succeeded", "success", 0) == (told["event"], told["outcome"], told["exit_code"])
    assert "s3cret-pw" not in json.dumps(told)
    assert "postgresql://app:***@db/x" in stdout["text"]
    assert stdout["text"].rstrip().endswith("last line")
    assert stdout["dropped_bytes"] > 0 and len(stdout["text"]) < 40000
    assert {"text": "", "dropped_bytes": 0} == told["output"]["stderr"]


@pytest.mark.slow
@pytest.mark.usefixtures("system_processes")
def test_ticks_missed_while_no_replica_ran_are_told_once_by_the_replicas_that_start(
    pg_dsn: str, schema: str, tmp_path: Path
) -> None:
    """A per-second job's ticks pass with every replica stopped; of the two that start,
    the one whose start-up scan records them MISSED tells each once."""
    with receiving() as receiver:
        jobs = (
            "  every_second:\n"
            '    cron: "* * * * * *"\n'
            "    command: ['true']\n"
            "    lease: 500ms\n"
            "    misfire_grace: 1s\n" + hooks(receiver, "on_missed")
        )
        with cluster(pg_dsn, schema, tmp_path) as running:
            path = running.write_config(config(schema, jobs))
            running.start(path, 1)
            wait_until(
                lambda: running.rows("SELECT 1 FROM {leases} WHERE status = 'SUCCESS'"),
                20,
                "a tick run",
            )
            stop_gracefully(running)
            stopped = time.monotonic()
            # Ticks must pass with no replica at all: the outage under test.
            wait_until(lambda: time.monotonic() > stopped + 4, 10, "four ticks with no replica")
            running.start(path, 2, first=1)

            def missed_rows() -> list[str]:
                found = running.rows(
                    "SELECT run_key FROM {leases} WHERE status = 'MISSED' AND reason = 'no_replica'"
                )
                return [row["run_key"] for row in found]

            wait_until(
                lambda: (
                    missed_rows()
                    and len(of(receiver.events(), "tick_missed")) >= len(missed_rows())
                ),
                30,
                "every tick recorded missed told",
            )
            stop_gracefully(running)
            missed = missed_rows()
    told = of(receiver.events(), "tick_missed")
    assert len(missed) >= 3
    assert all(1 == n for n in Counter(e["run_key"] for e in told).values())
    assert sorted(missed) == sorted(e["run_key"] for e in told)
    assert {"no_replica"} == {e["error"] for e in told}
    assert all(e["detail"] for e in told)


@pytest.mark.slow
@pytest.mark.usefixtures("system_processes")
def test_a_tick_the_database_outage_kept_from_starting_is_told_overdue_then_missed(
    pg_dsn: str, schema: str, tmp_path: Path
) -> None:
    """The database is gone from 1 s before the tick to past misfire_grace: at the
    start_deadline the tick is told not started, and once the database is back its
    MISSED row (database_unavailable) is told once; it never runs."""
    with receiving() as receiver, proxied(pg_dsn) as (proxy, dsn):
        instant = at(6)
        jobs = (
            "  watched:\n"
            f'    at: "{instant}"\n'
            "    command: ['true']\n"
            "    lease: 1s\n"
            "    start_deadline: 1s\n"
            "    misfire_grace: 3s\n"
            + hooks(receiver, "on_start", "on_failure", "on_missed")
            # Claims after the outage: what tells the replica the database is back.
            + "  beat:\n"
            '    cron: "* * * * * *"\n'
            "    command: ['true']\n"
        )
        with cluster(dsn, schema, tmp_path) as running:
            (replica,) = running.start(running.write_config(config(schema, jobs)), 1)
            tick = instant_of(instant)
            sleep_until(tick - timedelta(seconds=1))
            # Every byte dropped: a claim sent meanwhile never reaches the database (and its
            # connection is closed at the heal), so none can land once the database is back.
            healed = proxy.blackhole(5.5)
            wait_until(lambda: of(receiver.events(), "start_overdue"), 10, "the start deadline")
            overdue_told_at = datetime.now(UTC)
            assert healed.wait(10)
            wait_until(lambda: of(receiver.events(), "tick_missed"), 30, "the miss, once stored")
            rows = running.rows("SELECT status, reason FROM {leases} WHERE code = 'watched'")
            logged = replica.events("start_overdue")
            running.stop_all()
    (overdue,) = of(receiver.events(), "start_overdue")
    (missed,) = of(receiver.events(), "tick_missed")
    assert (instant, "not_started", False) == (
        overdue["run_key"], overdue["outcome"], overdue["started"]
    )  # fmt: skip
    # Told at the deadline, during the outage: before misfire_grace gave the tick up.
    assert 1.0 <= overdue["lateness_s"] < 3.0
    assert overdue_told_at < tick + timedelta(seconds=3)
    assert (instant, "database_unavailable") == (missed["run_key"], missed["error"])
    assert [] == of(receiver.events(), "run_started")
    assert [{"status": "MISSED", "reason": "database_unavailable"}] == rows
    assert [False] == [e["started"] for e in logged]


@pytest.mark.slow
@pytest.mark.usefixtures("system_processes")
def test_an_advisory_tick_given_up_late_is_told_missed_by_the_replica_that_gave_it_up(
    pg_dsn: str, schema: str, tmp_path: Path
) -> None:
    """Advisory mode keeps no table: a replica stalled past misfire_grace over the tick
    tells on_missed itself, cause late."""
    with receiving() as receiver:
        instant = at(5)
        jobs = (
            "  locked:\n"
            f'    at: "{instant}"\n'
            "    guard: advisory\n"
            "    command: ['true']\n"
            "    misfire_grace: 2s\n" + hooks(receiver, "on_missed", "on_start")
        )
        with cluster(pg_dsn, schema, tmp_path) as running:
            (replica,) = running.start(running.write_config(config(schema, jobs)), 1)
            tick = instant_of(instant)
            sleep_until(tick - timedelta(seconds=1))
            replica.signal(signal.SIGSTOP)
            time.sleep(4)  # the stall itself: past the tick's misfire_grace
            replica.signal(signal.SIGCONT)
            wait_until(receiver.events, 20, "the on_missed hook")
            running.stop_all()
    (missed,) = receiver.events()
    assert ("tick_missed", instant, "late") == (missed["event"], missed["run_key"], missed["error"])


def test_the_observers_hear_every_event_of_an_observed_job_and_none_of_another(
    tmp_path: Path,
) -> None:
    """Watched is made from FireEvents' own events: a new event reaches the observers of
    a job with a hook, and never those of a job without one."""
    path = tmp_path / "jobs.yaml"
    path.write_text(
        "database: {url: 'postgresql://x@127.0.0.1/x'}\n"
        "jobs:\n"
        "  plain: {cron: '* * * * *', command: ['true']}\n"
        "  told: {cron: '* * * * *', command: ['true'], on_missed: {command: ['true']}}\n"
    )
    jobs = load_config([path]).jobs
    heard: list[tuple[str, str]] = []

    def recorded(name: str) -> Callable[..., None]:
        return lambda _self, *args, **_: heard.append((name, args[0].code))

    # A subscriber that overrides every event there is (its class's own methods).
    events = [name for name in vars(FireEvents) if not name.startswith("_")]
    recorder = type("Recorder", (FireEvents,), {name: recorded(name) for name in events})
    watched = Watched([recorder()])
    identity = Identity.schedule("told", "2026-01-01T00:00:00Z")
    tick = datetime(2026, 1, 1, tzinfo=UTC)
    for job in (jobs["plain"], jobs["told"]):
        watched.first_start(job, identity, tick, lambda: True)
        watched.claim_sent(job, identity)
        watched.missed_found(job, identity, tick, "no_replica", "why")
        watched.fire_done(job, identity, "misfire")
    watched.database("claim", True)
    assert [
        ("first_start", "told"),
        ("claim_sent", "told"),
        ("missed_found", "told"),
        ("fire_done", "told"),
    ] == heard


@pytest.mark.slow
@pytest.mark.usefixtures("system_processes")
def test_each_event_says_why_its_attempt_runs(pg_dsn: str, schema: str, tmp_path: Path) -> None:
    """Attempt 1 of a tick fails and its retry succeeds: the starts say schedule then
    retry, the success says retry; the command hook gets it as PGCRON_TRIGGER."""
    told = tmp_path / "told"
    with receiving() as receiver:
        jobs = (
            "  twice:\n"
            f'    at: "{at(2)}"\n'
            "    shell: '[ \"$PGCRON_ATTEMPT\" != 1 ]'\n"
            "    retries: 1\n"
            "    retry_delay: 200ms\n" + hooks(receiver, "on_start") + "    on_success:\n"
            f"      webhook: {receiver.base}/hook\n"
            f"      command: [sh, -c, 'printf %s \"$PGCRON_TRIGGER\" > {told}']\n"
        )
        with cluster(pg_dsn, schema, tmp_path) as running:
            running.start(running.write_config(config(schema, jobs)), 1)
            wait_until(lambda: of(receiver.events(), "run_succeeded"), 30, "the retry's success")
            wait_until(told.exists, 10, "the command hook")
            running.stop_all()
    started = of(receiver.events(), "run_started")
    assert [(1, "schedule"), (2, "retry")] == [(e["attempt"], e["trigger"]) for e in started]
    (succeeded,) = of(receiver.events(), "run_succeeded")
    assert (2, "retry") == (succeeded["attempt"], succeeded["trigger"])
    assert "retry" == told.read_text()
