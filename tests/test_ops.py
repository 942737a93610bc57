"""The operator commands against a real PostgreSQL, run through ``pgcrond.cli.main``."""

from __future__ import annotations

import io
import json
import re
import uuid
from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import psycopg
import pytest
from psycopg.rows import dict_row

from pgcrond.cli import main
from pgcrond.core.keys import Identity
from pgcrond.core.timing import LeaseTiming
from pgcrond.ops import session as ops
from pgcrond.storage.claims import Acquired, NotAcquired
from pgcrond.storage.history import prune
from pgcrond.storage.sql import migrations
from pgcrond.storage.sync_store import SyncLeaseStore
from tests.helpers.store import open_store

T0 = datetime(2026, 1, 10, 3, 0, tzinfo=UTC)
SHORT = LeaseTiming.build(timedelta(seconds=30), timedelta(seconds=5))


def write_config(tmp_path: Path, schema: str) -> str:
    path = tmp_path / "pgcrond.yaml"
    path.write_text(
        f"""\
database: {{schema: {schema}}}
jobs:
  nightly: {{cron: "0 3 * * *", command: ["/bin/true"]}}
  hourly: {{cron: "0 * * * *", shell: "echo hourly"}}
  seed: {{once: true, shell: "echo hi"}}
  idle: {{cron: "*/5 * * * *", command: ["/bin/true"], guard: advisory}}
"""
    )
    return str(path)


@pytest.fixture
def config(tmp_path: Path, schema: str) -> str:
    return write_config(tmp_path, schema)


@pytest.fixture
async def migrated(pg_dsn: str, schema: str) -> None:
    async with open_store(pg_dsn, schema):
        pass


def put(
    dsn: str,
    schema: str,
    code: str,
    run_key: str | None,
    status: str,
    *,
    acquired: datetime | None = None,
    took: timedelta | None = timedelta(seconds=12),
    expires: datetime | None = None,
    owner: str = "web-1:100",
    attempt: int = 1,
    reason: str | None = None,
    error: str | None = None,
    retry_at: datetime | None = None,
) -> None:
    """Insert one row with exact timestamps, as the daemon would have left it."""
    identity = Identity.initial(code) if run_key is None else Identity.schedule(code, run_key)
    acquired = acquired or T0
    finished = None if status == "RUNNING" or took is None else acquired + took
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(
            f'INSERT INTO "{schema}".leases (lock_key, type, code, run_key, status, owner_token, '
            "owner, attempt, fencing_token, lease_ms, created_at, acquired_at, heartbeat_at, "
            "expires_at, finished_at, retry_at, reason, error) VALUES (%s, %s, %s, %s, %s, "
            f"gen_random_uuid(), %s, %s, nextval('\"{schema}\".leases_fencing_seq'), 30000, "
            "%s, %s, %s, %s, %s, %s, %s, %s)",
            (
                identity.idempotency_key, identity.type, code, run_key, status, owner, attempt,
                acquired, acquired, acquired, expires or acquired + timedelta(seconds=30),
                finished, retry_at, reason, error,
            ),
        )  # fmt: skip


def rows(dsn: str, schema: str) -> dict[int, dict[str, Any]]:
    with psycopg.connect(dsn, autocommit=True, row_factory=dict_row) as conn:
        found = conn.execute(f'SELECT * FROM "{schema}".leases ORDER BY id').fetchall()
    return {row["id"]: row for row in found}


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    captured = capsys.readouterr()
    return code, captured.out, captured.err


class FakeTerminal:
    """A stdin that says it is a terminal and answers the prompt."""

    def __init__(self, answer: str, before_answer: Callable[[], None] = lambda: None) -> None:
        self._answer = answer
        self._before_answer = before_answer

    def isatty(self) -> bool:
        return True

    def readline(self) -> str:
        self._before_answer()
        return self._answer + "\n"


# -- migrate, errors ---------------------------------------------------------------------


def test_migrate_applies_once_then_says_up_to_date(
    capsys: pytest.CaptureFixture[str], pg_dsn: str, schema: str, config: str
) -> None:
    applied = "".join(f"applied migration {v} ({schema}.leases)\n" for v, _ in migrations())
    assert (0, applied, "") == run(capsys, "migrate", "-c", config, "--database-url", pg_dsn)
    assert (0, f"up to date ({schema}.leases)\n", "") == run(
        capsys, "migrate", "-c", config, "--database-url", pg_dsn
    )


@pytest.fixture
def fresh_database(pg_dsn: str) -> Iterator[str]:
    """A database of its own, so the default schema ``pgcrond`` can be used without -c."""
    name = f"d_{uuid.uuid4().hex[:12]}"
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    yield pg_dsn.rsplit("/", 1)[0] + "/" + name
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        conn.execute(f'DROP DATABASE "{name}" WITH (FORCE)')


def test_commands_without_a_config_use_the_url_from_the_environment_and_the_default_table(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, fresh_database: str
) -> None:
    monkeypatch.setenv("PGCROND_DATABASE_URL", fresh_database)
    applied = "".join(f"applied migration {v} (pgcrond.leases)\n" for v, _ in migrations())
    assert (0, applied, "") == run(capsys, "migrate")
    put(fresh_database, "pgcrond", "nightly", "2026-01-10T03:00:00Z", "SUCCESS")
    code, out, _ = run(capsys, "history", "--json")
    assert (0, ["nightly"]) == (code, [entry["job"] for entry in json.loads(out)])
    code, out, _ = run(capsys, "prune")
    assert 0 == code
    assert out.endswith("deleted 1 finished rows older than 30d from pgcrond.leases\n")


def test_without_any_database_url_the_error_says_where_to_give_one(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("PGCROND_DATABASE_URL", raising=False)
    code, out, err = run(capsys, "history")
    assert (2, "") == (code, out)
    assert [
        "pgcrond: error: no database: pass --database-url URL, set PGCROND_DATABASE_URL, "
        "or pass -c CONFIG to use its database.url"
    ] == err.splitlines()


# A real libpq connection attempt (refused): the integration tier's.
@pytest.mark.usefixtures("pg_dsn")
def test_an_unreachable_database_is_one_line_without_the_password(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(ops, "CONNECT_TIMEOUT_S", 0.5)
    code, _, err = run(capsys, "history", "--database-url", "postgresql://bob:s3cret@127.0.0.1:1/x")
    assert 2 == code
    assert 1 == len(err.splitlines())
    assert "s3cret" not in err
    assert err.startswith("pgcrond: error: cannot reach the database at postgresql://bob:***@")
    assert "Connection refused" in err


def test_a_missing_table_says_to_run_migrate(
    capsys: pytest.CaptureFixture[str], pg_dsn: str, config: str, schema: str
) -> None:
    code, _, err = run(capsys, "history", "-c", config, "--database-url", pg_dsn)
    assert 2 == code
    assert (
        f"pgcrond: error: the lease table {schema}.leases does not exist in this database: "
        "run `pgcrond migrate` first (with the same -c or --database-url)\n"
    ) == err


# -- status -------------------------------------------------------------------------------


def test_status_shows_next_fire_last_run_running_now_and_failures_per_job(
    capsys: pytest.CaptureFixture[str], pg_dsn: str, schema: str, config: str, migrated: None
) -> None:
    now = datetime.now(UTC)
    day = timedelta(days=1)
    put(pg_dsn, schema, "nightly", "2026-01-07T03:00:00Z", "SUCCESS", acquired=T0 - 3 * day)
    put(pg_dsn, schema, "nightly", "2026-01-08T03:00:00Z", "FAIL", acquired=T0 - 2 * day,
        reason="error", error="exit status 1")  # fmt: skip
    put(pg_dsn, schema, "nightly", "2026-01-09T03:00:00Z", "SKIPPED", acquired=T0 - day,
        took=timedelta(0), reason="overlap")  # fmt: skip
    put(pg_dsn, schema, "nightly", "2026-01-10T03:00:00Z", "FAIL", acquired=T0,
        took=timedelta(seconds=90), reason="timeout", error="timed out after 1m30s",
        owner="web-2:200", attempt=2)  # fmt: skip
    put(pg_dsn, schema, "nightly", "2026-01-11T03:00:00Z", "RUNNING", acquired=now,
        expires=now + timedelta(seconds=30), owner="web-3:300")  # fmt: skip
    put(pg_dsn, schema, "hourly", "2026-01-10T02:00:00Z", "FAIL", acquired=T0 - timedelta(hours=1))
    put(pg_dsn, schema, "hourly", "2026-01-10T03:00:00Z", "SUCCESS", took=timedelta(seconds=2))
    put(pg_dsn, schema, "hourly", "2026-01-10T04:00:00Z", "RUNNING",
        acquired=T0 + timedelta(hours=1), owner="web-9:900")  # fmt: skip
    put(pg_dsn, schema, "seed", None, "SUCCESS", acquired=T0 - 5 * day, took=timedelta(seconds=1))
    put(pg_dsn, schema, "retired", "2026-01-10T03:00:00Z", "FAIL")

    code, out, err = run(capsys, "status", "-c", config, "--database-url", pg_dsn, "--json")
    assert (0, "") == (code, err)
    entries = {entry["job"]: entry for entry in json.loads(out)["jobs"]}
    assert ["nightly", "hourly", "seed", "idle"] == list(entries)

    nightly = entries["nightly"]
    # The tick record: newest tick, newest SUCCESS and FAIL, misses, pause.
    assert {
        "last_tick": {"run_key": "2026-01-11T03:00:00Z", "status": "RUNNING", "reason": None},
        "last_success": {"run_key": "2026-01-07T03:00:00Z", "at": "2026-01-07T03:00:12.000Z"},
        "last_failure": {"run_key": "2026-01-10T03:00:00Z", "at": "2026-01-10T03:01:30.000Z"},
        "misses_24h": 0,
        "paused": None,
    } == {
        key: nightly.pop(key)
        for key in ("last_tick", "last_success", "last_failure", "misses_24h", "paused")
    }
    next_fire = datetime.fromisoformat(nightly.pop("next_fire"))
    assert (3, 0) == (next_fire.hour, next_fire.minute)
    assert now < next_fire <= now + day
    running = nightly.pop("running")
    assert datetime.fromisoformat(running.pop("since")) == now.replace(
        microsecond=now.microsecond // 1000 * 1000
    )
    running.pop("expires_at")
    assert {"run_key": "2026-01-11T03:00:00Z", "owner": "web-3:300", "attempt": 1,
            "stale": False} == running  # fmt: skip
    assert {
        "job": "nightly",
        "schedule": "cron '0 3 * * *': at 03:00 every day (UTC)",
        "guard": "lease",
        "runs_at_start": False,
        "last_run": {
            "run_key": "2026-01-10T03:00:00Z",
            "status": "FAIL",
            "reason": "timeout",
            "attempt": 2,
            "owner": "web-2:200",
            "acquired_at": "2026-01-10T03:00:00.000Z",
            "finished_at": "2026-01-10T03:01:30.000Z",
            "duration_s": 90.0,
            "retry_at": None,
            "error": "timed out after 1m30s",
        },
        "consecutive_failures": 2,
    } == nightly

    hourly = entries["hourly"]
    assert ("SUCCESS", 2.0, 0) == (
        hourly["last_run"]["status"],
        hourly["last_run"]["duration_s"],
        hourly["consecutive_failures"],
    )
    assert {
        "run_key": "2026-01-10T04:00:00Z",
        "owner": "web-9:900",
        "attempt": 1,
        "since": "2026-01-10T04:00:00.000Z",
        "expires_at": "2026-01-10T04:00:30.000Z",
        "stale": True,
    } == hourly["running"]

    seed = entries["seed"]
    assert (None, False, "SUCCESS", None) == (
        seed["next_fire"], seed["runs_at_start"], seed["last_run"]["status"],
        seed["last_run"]["run_key"],
    )  # fmt: skip
    assert {"job": "idle", "guard": "advisory", "last_run": None, "running": None,
            "consecutive_failures": 0, "runs_at_start": False} == {
        key: entries["idle"][key]
        for key in ("job", "guard", "last_run", "running", "consecutive_failures",
                    "runs_at_start")
    }  # fmt: skip

    code, out, _ = run(capsys, "status", "-c", config, "--database-url", pg_dsn)
    assert 0 == code
    jobs, _, replicas = out.partition("\n\n")
    # No replica runs: the registry is empty, and status says so below the jobs.
    assert replicas.startswith("no live replica in the registry")
    assert max(len(line) for line in jobs.splitlines()) <= 100
    header, *table = [re.split(r"\s{2,}", line) for line in jobs.splitlines()]
    assert ["JOB", "SCHEDULE", "GUARD", "NEXT FIRE", "LAST RUN", "RUNNING", "FAILS"] == header
    narrow = {row[0]: row for row in table}
    assert ["0 3 * * *", "lease"] == narrow["nightly"][1:3]
    assert re.fullmatch(r"in [0-9dhms]+", narrow["nightly"][3])
    assert re.fullmatch(r"FAIL/timeout [0-9dhms]+ ago", narrow["nightly"][4])
    assert ["web-3:300", "2"] == narrow["nightly"][5:]
    assert ["web-9:900 (STALE)", "0"] == narrow["hourly"][5:]
    assert ["once", "lease", "never"] == narrow["seed"][1:4]

    code, out, _ = run(capsys, "status", "-c", config, "--database-url", pg_dsn, "-o", "wide")
    assert 0 == code
    jobs, _, replicas = out.partition("\n\n")
    header, *table = [re.split(r"\s{2,}", line) for line in jobs.splitlines()]
    assert [
        "JOB", "SCHEDULE", "GUARD", "NEXT FIRE", "LAST RUN", "RUNNING NOW", "FAILS",
        "LAST TICK", "LAST SUCCESS", "LAST FAILURE", "MISSED 24H", "PAUSED",
    ] == header  # fmt: skip
    cells = {row[0]: row for row in table}
    assert ["nightly", "hourly", "seed", "idle"] == list(cells)
    assert cells["nightly"][1:3] == ["cron '0 3 * * *': at 03:00 every day (UTC)", "lease"]
    assert re.fullmatch(r"20\d\d-\d\d-\d\dT03:00:00Z \(in [0-9hms]+\)", cells["nightly"][3])
    assert cells["nightly"][4:7] == [
        "FAIL/timeout 2026-01-10T03:01:30Z on web-2:200 (1m30s)",
        cells["nightly"][5],
        "2",
    ]
    assert cells["nightly"][5].startswith("web-3:300 since ")
    assert ", lease until " in cells["nightly"][5]
    assert cells["hourly"][4:7] == [
        "SUCCESS 2026-01-10T03:00:02Z on web-1:100 (2.0s)",
        "STALE web-9:900 since 2026-01-10T04:00:00Z, lease expired 2026-01-10T04:00:30Z",
        "0",
    ]
    assert cells["seed"][3:7] == ["never", "SUCCESS 2026-01-05T03:00:01Z on web-1:100 (1.0s)", "-",
                                 "0"]  # fmt: skip
    assert cells["idle"][2:7] == ["advisory", cells["idle"][3], "-", "-", "0"]
    assert cells["nightly"][7:] == [
        "2026-01-11T03:00:00Z RUNNING",
        "2026-01-07T03:00:12Z",
        "2026-01-10T03:01:30Z",
        "0",
        "-",
    ]


def test_a_run_once_job_that_never_succeeded_runs_at_start(
    capsys: pytest.CaptureFixture[str], pg_dsn: str, schema: str, config: str, migrated: None
) -> None:
    put(pg_dsn, schema, "seed", None, "FAIL", reason="released", retry_at=T0)
    code, out, _ = run(capsys, "status", "-c", config, "--database-url", pg_dsn, "--json")
    seed = next(entry for entry in json.loads(out)["jobs"] if entry["job"] == "seed")
    assert (0, True, 1) == (code, seed["runs_at_start"], seed["consecutive_failures"])
    code, out, _ = run(capsys, "status", "-c", config, "--database-url", pg_dsn)
    seed_line = next(line for line in out.splitlines() if line.startswith("seed"))
    assert "at start" == re.split(r"\s{2,}", seed_line)[3]


# -- history ------------------------------------------------------------------------------


TRACEBACK = "Traceback (most recent call last):\n  File x\nValueError: " + "x" * 80


@pytest.fixture
def history_rows(pg_dsn: str, schema: str, migrated: None) -> None:
    hour = timedelta(hours=1)
    put(pg_dsn, schema, "nightly", "2026-01-08T03:00:00Z", "SUCCESS", acquired=T0 - 48 * hour)
    put(pg_dsn, schema, "nightly", "2026-01-09T03:00:00Z", "FAIL", acquired=T0 - 24 * hour,
        reason="error", error=TRACEBACK, took=timedelta(milliseconds=850))  # fmt: skip
    put(pg_dsn, schema, "hourly", "2026-01-10T02:00:00Z", "SUCCESS", acquired=T0 - hour,
        took=timedelta(minutes=4, seconds=5))  # fmt: skip
    put(pg_dsn, schema, "seed", None, "SUCCESS", acquired=T0 - hour, took=timedelta(seconds=1))
    put(pg_dsn, schema, "nightly", "2026-01-10T03:00:00Z", "RUNNING", acquired=T0, attempt=2,
        reason="takeover", owner="web-2:200")  # fmt: skip


def test_history_lists_runs_newest_first_with_durations_and_first_error_lines(
    capsys: pytest.CaptureFixture[str], pg_dsn: str, config: str, history_rows: None
) -> None:
    code, out, _ = run(capsys, "history", "-c", config, "--database-url", pg_dsn)
    assert 0 == code
    assert [
        "JOB      RUN KEY               STATUS   REASON    ATTEMPT  TRIGGER  "
        "OWNER      ACQUIRED              TOOK   ERROR",
        "nightly  2026-01-10T03:00:00Z  RUNNING  takeover  2        -        "
        "web-2:200  2026-01-10T03:00:00Z  -      -",
        "seed     (initial)             SUCCESS  -         1        -        "
        "web-1:100  2026-01-10T02:00:00Z  1.0s   -",
        "hourly   2026-01-10T02:00:00Z  SUCCESS  -         1        -        "
        "web-1:100  2026-01-10T02:00:00Z  4m5s   -",
        "nightly  2026-01-09T03:00:00Z  FAIL     error     1        -        "
        "web-1:100  2026-01-09T03:00:00Z  850ms  Traceback (most recent call last):",
        "nightly  2026-01-08T03:00:00Z  SUCCESS  -         1        -        "
        "web-1:100  2026-01-08T03:00:00Z  12.0s  -",
    ] == out.splitlines()


def test_history_filters_by_job_status_since_and_limit_and_json_keeps_the_full_error(
    capsys: pytest.CaptureFixture[str], pg_dsn: str, config: str, history_rows: None
) -> None:
    base = ["history", "-c", config, "--database-url", pg_dsn, "--json"]

    def keys(*extra: str) -> list[tuple[str, str | None]]:
        code, out, err = run(capsys, *base, *extra)
        assert (0, "") == (code, err)
        return [(entry["job"], entry["run_key"]) for entry in json.loads(out)]

    assert [("nightly", "2026-01-10T03:00:00Z"), ("nightly", "2026-01-09T03:00:00Z"),
            ("nightly", "2026-01-08T03:00:00Z")] == keys("--job", "nightly")  # fmt: skip
    assert [("seed", None), ("hourly", "2026-01-10T02:00:00Z")] == keys(
        "--since", "2026-01-10T02:00Z", "--status", "SUCCESS"
    )
    assert [("nightly", "2026-01-10T03:00:00Z")] == keys("--limit", "1")
    assert [] == keys("--since", "24h")  # all of the fixture's runs are in January 2026

    _, out, _ = run(capsys, *base, "--status", "FAIL")
    [failed] = json.loads(out)
    assert {
        "job": "nightly",
        "type": "SCHEDULE",
        "run_key": "2026-01-09T03:00:00Z",
        "status": "FAIL",
        "reason": "error",
        "attempt": 1,
        "owner": "web-1:100",
        "acquired_at": "2026-01-09T03:00:00.000Z",
        "finished_at": "2026-01-09T03:00:00.850Z",
        "expires_at": "2026-01-09T03:00:30.000Z",
        "retry_at": None,
        "duration_s": 0.85,
        "error": TRACEBACK,
        # Written straight into the table, so without attempt records.
        "attempts": [],
        "params": {},
    } == {key: value for key, value in failed.items() if key not in ("id", "fencing_token")}


def test_history_rejects_a_since_that_is_neither_instant_nor_duration(
    capsys: pytest.CaptureFixture[str], pg_dsn: str, config: str, history_rows: None
) -> None:
    code, _, err = run(capsys, "history", "-c", config, "--database-url", pg_dsn,
                       "--since", "yesterday")  # fmt: skip
    assert 2 == code
    assert err.startswith("pgcrond: error: --since 'yesterday': not an ISO-8601 instant")
    assert 1 == len(err.splitlines())


# -- unlock -------------------------------------------------------------------------------


STUCK = Identity.schedule("nightly", "2026-01-10T03:00:00Z")


@pytest.fixture
async def stuck(pg_dsn: str, schema: str) -> Acquired:
    """A live lease on nightly's 03:00 tick, next to rows that unlock must not touch."""
    async with open_store(pg_dsn, schema, owner="web-1:100") as store:
        lease = await store.claim(STUCK, SHORT)
        assert isinstance(lease, Acquired)
        done = await store.claim(Identity.schedule("nightly", "2026-01-09T03:00:00Z"), SHORT)
        assert isinstance(done, Acquired)
        await store.complete(done)
        other = await store.claim(Identity.schedule("hourly", "2026-01-10T03:00:00Z"), SHORT)
        assert isinstance(other, Acquired)
        seed = await store.claim(Identity.initial("seed"), SHORT)
        assert isinstance(seed, Acquired)
        await store.complete(seed)
    return lease


def unlock_argv(config: str, pg_dsn: str, *extra: str) -> list[str]:
    return ["unlock", "nightly", "--run-key", STUCK.run_key or "", "-c", config,
            "--database-url", pg_dsn, *extra]  # fmt: skip


def test_unlock_without_a_terminal_or_yes_refuses_after_showing_the_row(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch,
    pg_dsn: str, schema: str, config: str, stuck: Acquired,
) -> None:  # fmt: skip
    before = rows(pg_dsn, schema)
    monkeypatch.setattr("sys.stdin", io.StringIO("y\n"))
    code, out, err = run(capsys, *unlock_argv(config, pg_dsn))
    assert 2 == code
    assert "nightly" in out and "web-1:100" in out and "LIVE until" in out
    assert "pgcrond: error: stdin is not a terminal, so I cannot ask: pass --yes to release" == (
        err.rstrip("\n")
    )
    assert before == rows(pg_dsn, schema)


def test_unlock_answered_no_changes_nothing(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch,
    pg_dsn: str, schema: str, config: str, stuck: Acquired,
) -> None:  # fmt: skip
    before = rows(pg_dsn, schema)
    monkeypatch.setattr("sys.stdin", FakeTerminal("n"))
    code, out, _ = run(capsys, *unlock_argv(config, pg_dsn))
    assert 1 == code
    assert out.endswith("Release this run? [y/N] not released\n")
    assert before == rows(pg_dsn, schema)


def test_unlock_yes_releases_only_the_target_row_and_fences_its_owner(
    capsys: pytest.CaptureFixture[str], pg_dsn: str, schema: str, config: str, stuck: Acquired
) -> None:
    before = rows(pg_dsn, schema)
    code, out, err = run(capsys, *unlock_argv(config, pg_dsn, "--yes"))
    assert (0, "") == (code, err)
    assert out.splitlines()[:5] == [
        "FIELD    VALUE",
        "job      nightly",
        "run key  2026-01-10T03:00:00Z",
        "status   RUNNING",
        "attempt  1",
    ]
    assert out.endswith(
        "released job nightly, run key 2026-01-10T03:00:00Z: now FAIL/released; "
        "web-1:100 is fenced and the next claim may run it again\n"
        "to run it again now, under the same idempotency key: "
        "pgcrond trigger nightly --run-key 2026-01-10T03:00:00Z\n"
    )
    after = rows(pg_dsn, schema)
    assert {k: v for k, v in before.items() if k != stuck.id} == {
        k: v for k, v in after.items() if k != stuck.id
    }
    old, new = before[stuck.id], after[stuck.id]
    changed = {key for key in old if old[key] != new[key]}
    assert {"status", "reason", "owner_token", "finished_at", "retry_at", "error"} == changed
    assert ("FAIL", "released") == (new["status"], new["reason"])
    assert new["retry_at"] == new["finished_at"]
    assert new["error"].startswith("released by `pgcrond unlock` on ")
    assert new["error"].endswith("; was RUNNING (owner web-1:100, attempt 1)")

    with SyncLeaseStore(pg_dsn, schema=schema, owner="web-2:200") as store:
        assert not store.heartbeat(stuck)
        assert not store.complete(stuck)
        again = store.claim(STUCK, SHORT)
        assert isinstance(again, Acquired)
        assert ("retry", 2) == (again.claimed_from, again.attempt)


def test_unlock_initial_lets_a_finished_run_once_job_run_again(
    capsys: pytest.CaptureFixture[str], pg_dsn: str, schema: str, config: str, stuck: Acquired
) -> None:
    code, out, _ = run(capsys, "unlock", "seed", "--initial", "--yes", "-c", config,
                       "--database-url", pg_dsn)  # fmt: skip
    assert 0 == code
    assert "run key  (initial)" in out
    assert "released job seed, run-once (INITIAL) row: now FAIL/released" in out
    with SyncLeaseStore(pg_dsn, schema=schema) as store:
        assert isinstance(store.claim(Identity.initial("seed"), SHORT), Acquired)


def test_unlock_refuses_a_finished_tick_and_points_to_trigger(
    capsys: pytest.CaptureFixture[str], pg_dsn: str, schema: str, config: str, stuck: Acquired
) -> None:
    before = rows(pg_dsn, schema)
    code, out, err = run(capsys, "unlock", "nightly", "--run-key", "2026-01-09T03:00:00Z", "--yes",
                         "-c", config, "--database-url", pg_dsn)  # fmt: skip
    assert (2, "") == (code, out)
    assert (
        "pgcrond: error: not releasing job 'nightly', run key 2026-01-09T03:00:00Z: it finished "
        "with SUCCESS, and a finished tick is history; use `pgcrond trigger nightly` to run "
        "the job again\n"
    ) == err
    assert before == rows(pg_dsn, schema)


def test_unlock_of_an_unknown_run_says_where_to_look(
    capsys: pytest.CaptureFixture[str], pg_dsn: str, config: str, stuck: Acquired
) -> None:
    code, _, err = run(capsys, "unlock", "nightly", "--run-key", "2030-01-01T00:00:00Z", "--yes",
                       "-c", config, "--database-url", pg_dsn)  # fmt: skip
    assert 2 == code
    assert "has no run key 2030-01-01T00:00:00Z in " in err
    assert "`pgcrond history --job nightly`" in err


def test_unlock_leaves_a_row_alone_that_changed_after_it_was_shown(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch,
    pg_dsn: str, schema: str, config: str, stuck: Acquired,
) -> None:  # fmt: skip
    def takeover_while_asking() -> None:
        with psycopg.connect(pg_dsn, autocommit=True) as conn:
            conn.execute(
                f'UPDATE "{schema}".leases SET owner_token = gen_random_uuid(), '
                "owner = 'web-7:700', attempt = attempt + 1, reason = 'takeover' WHERE id = %s",
                (stuck.id,),
            )

    monkeypatch.setattr("sys.stdin", FakeTerminal("y", before_answer=takeover_while_asking))
    before = rows(pg_dsn, schema)
    code, _, err = run(capsys, *unlock_argv(config, pg_dsn))
    assert 1 == code
    assert (
        "pgcrond: not released: the row changed after it was shown (it is now RUNNING by "
        "web-7:700); nothing was changed, run the command again to see it\n"
    ) == err
    after = rows(pg_dsn, schema)
    assert ("RUNNING", "web-7:700") == (after[stuck.id]["status"], after[stuck.id]["owner"])
    assert {k: v for k, v in before.items() if k != stuck.id} == {
        k: v for k, v in after.items() if k != stuck.id
    }


# -- prune --------------------------------------------------------------------------------


def seed_for_pruning(dsn: str, schema: str, old_rows: int) -> None:
    """``old_rows`` prunable rows, plus rows that must survive any prune of 30 days."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(
            f'INSERT INTO "{schema}".leases (lock_key, type, code, run_key, status, owner_token, '
            "owner, attempt, fencing_token, lease_ms, created_at, acquired_at, heartbeat_at, "
            "expires_at, finished_at, reason) "
            "SELECT 'old-' || n, 'SCHEDULE', 'bulk', 'tick-' || n, "
            "(ARRAY['SUCCESS', 'FAIL', 'SKIPPED'])[mod(n, 3) + 1], gen_random_uuid(), 'w:1', 1, n, "
            "30000, t, t, t, t + interval '30 seconds', t + interval '1 second', NULL "
            "FROM generate_series(1, %s) AS n, LATERAL (SELECT now() - interval '40 days' AS t) x",
            (old_rows,),
        )
    old = datetime.now(UTC) - timedelta(days=40)
    recent = datetime.now(UTC) - timedelta(days=29)
    put(dsn, schema, "seed", None, "SUCCESS", acquired=old)
    put(dsn, schema, "bulk", "stale-running", "RUNNING", acquired=old)
    put(dsn, schema, "bulk", "recent", "FAIL", acquired=recent)


async def test_prune_deletes_old_finished_ticks_in_batches_and_keeps_the_rest(
    pg_dsn: str, schema: str
) -> None:
    async with open_store(pg_dsn, schema) as store:
        seed_for_pruning(pg_dsn, schema, 1200)
        batches: list[int] = []
        deleted = await prune(store, timedelta(days=30), batch_size=500, on_batch=batches.append)
        assert (1200, [500, 500, 200]) == (deleted, batches)
        assert 0 == await prune(store, timedelta(days=30), batch_size=500)
    kept = sorted((r["type"], r["run_key"], r["status"]) for r in rows(pg_dsn, schema).values())
    assert [
        ("INITIAL", None, "SUCCESS"),
        ("SCHEDULE", "recent", "FAIL"),
        ("SCHEDULE", "stale-running", "RUNNING"),
    ] == kept


def test_prune_command_prints_progress_and_uses_the_configs_retention(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, pg_dsn: str, schema: str, migrated: None
) -> None:
    path = tmp_path / "retention.yaml"
    path.write_text(
        f"database: {{schema: {schema}}}\nhistory_retention: 35d\n"
        'jobs:\n  bulk: {cron: "* * * * *", command: ["/bin/true"]}\n'
    )
    seed_for_pruning(pg_dsn, schema, 700)
    code, out, err = run(capsys, "prune", "-c", str(path), "--database-url", pg_dsn)
    assert (0, "") == (code, err)
    assert [
        # The seeded RUNNING row expired long ago: its owner vanished.
        "closed 1 RUNNING rows whose owner vanished (now FAIL/abandoned)",
        "deleted 500 rows…",
        "deleted 200 rows…",
        f"deleted 700 finished rows older than 35d from {schema}.leases",
    ] == out.splitlines()
    code, out, _ = run(capsys, "prune", "-c", str(path), "--database-url", pg_dsn,
                       "--older-than", "1d")  # fmt: skip
    assert out.splitlines()[-1] == f"deleted 1 finished rows older than 1d from {schema}.leases"


def test_prune_keeps_a_jobs_own_history_retention(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, pg_dsn: str, schema: str, migrated: None
) -> None:
    path = tmp_path / "retention.yaml"
    path.write_text(
        f"database: {{schema: {schema}}}\nhistory_retention: 35d\n"
        "jobs:\n"
        '  bulk: {cron: "* * * * *", command: ["/bin/true"], history_retention: 45d}\n'
        '  other: {cron: "* * * * *", command: ["/bin/true"]}\n'
    )
    seed_for_pruning(pg_dsn, schema, 10)  # 40 days old: pruned at 35d, kept at 45d
    code, out, err = run(capsys, "prune", "-c", str(path), "--database-url", pg_dsn)
    assert (0, "") == (code, err)
    assert f"deleted 0 finished rows of bulk older than 45d from {schema}.leases" in out
    kept = [r for r in rows(pg_dsn, schema).values() if str(r["run_key"]).startswith("tick-")]
    assert 10 == len(kept)


def test_prune_rejects_a_bad_duration(
    capsys: pytest.CaptureFixture[str], pg_dsn: str, config: str, migrated: None
) -> None:
    code, _, err = run(capsys, "prune", "-c", config, "--database-url", pg_dsn,
                       "--older-than", "a month")  # fmt: skip
    assert 2 == code
    assert err.startswith("pgcrond: error: --older-than 'a month': cannot read")


def test_an_embedded_config_without_a_url_says_to_pass_one(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.delenv("PGCROND_DATABASE_URL", raising=False)
    path = tmp_path / "embedded.yaml"
    path.write_text('database: {embedded: true}\njobs:\n  a: {cron: "* * * * *", shell: "true"}\n')
    code, _, err = run(capsys, "status", "-c", str(path))
    assert 2 == code
    assert err.startswith("pgcrond: error: the config uses an embedded server")
    assert "pass --database-url" in err


def test_an_invalid_config_lists_its_issues_and_points_to_check(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, pg_dsn: str
) -> None:
    path = tmp_path / "broken.yaml"
    path.write_text('jobs:\n  a: {cron: "61 * * * *", shell: "true"}\n')
    code, out, err = run(capsys, "status", "-c", str(path), "--database-url", pg_dsn)
    assert (2, "") == (code, out)
    assert err.startswith("pgcrond: error: 1 configuration error:\n")
    assert str(path) in err
    assert err.endswith("(run `pgcrond check -c ...` to validate the config alone)\n")


def test_history_rejects_a_limit_below_one(
    capsys: pytest.CaptureFixture[str], pg_dsn: str, config: str, migrated: None
) -> None:
    code, _, err = run(capsys, "history", "-c", config, "--database-url", pg_dsn, "--limit", "0")
    assert (2, "pgcrond: error: --limit must be at least 1, got 0\n") == (code, err)


def test_unlock_of_a_finally_failed_tick_lets_trigger_rerun_it_under_its_key(
    capsys: pytest.CaptureFixture[str], pg_dsn: str, schema: str, config: str, stuck: Acquired
) -> None:
    failed = Identity.schedule("nightly", "2026-01-08T03:00:00Z")
    with SyncLeaseStore(pg_dsn, schema=schema, owner="web-1:100") as store:
        lease = store.claim(failed, SHORT)
        assert isinstance(lease, Acquired)
        assert store.fail(lease, "exit status 3", retry_after=None)
        refused = store.claim(failed, SHORT)
        assert isinstance(refused, NotAcquired)
        assert "failed" == refused.reason
    code, out, _ = run(capsys, "unlock", "nightly", "--run-key", "2026-01-08T03:00:00Z", "--yes",
                       "-c", config, "--database-url", pg_dsn)  # fmt: skip
    assert 0 == code
    assert "pgcrond trigger nightly --run-key 2026-01-08T03:00:00Z" in out
    with SyncLeaseStore(pg_dsn, schema=schema, owner="web-2:200") as store:
        again = store.claim(failed, SHORT)
    assert isinstance(again, Acquired)
    assert lease.idempotency_key == again.idempotency_key
    assert 2 == again.attempt
