"""`pgcrond status` for scripts, against real replicas: `-o json` carries everything the
text shows, and `--check` exits 0 only for a healthy cluster (docs/operations.md)."""

from __future__ import annotations

import json
import re
import signal
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from pgcrond import __version__
from pgcrond.report import iso
from tests.helpers.daemon_harness import Cluster, cli, cluster, config, wait_until

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("system_processes")]

QUIET = '{cron: "0 0 1 1 *", command: [/bin/true]}'
HEALTHY = "healthy: a replica is live, no lasting drift, no job failing or stale"


def at(moment: datetime) -> str:
    return moment.strftime("%Y-%m-%dT%H:%M:%SZ")


def check(running: Cluster, path: Path) -> tuple[int, list[str]]:
    """`status --check`: its exit code and its verdict lines (after the replicas section)."""
    code, out, err = cli(running, "status", "-c", str(path), "--check")
    assert "" == err
    return code, out.rstrip("\n").split("\n\n")[-1].splitlines()


def status_json(running: Cluster, path: Path, *args: str) -> dict[str, Any]:
    code, out, err = cli(running, "status", "-c", str(path), "-o", "json", *args)
    assert (0, "") == (code, err)
    document: dict[str, Any] = json.loads(out)
    return document


def test_status_json_carries_jobs_replicas_drift_pauses_and_problems_as_the_text_shows_them(
    pg_dsn: str, schema: str, tmp_path: Path
) -> None:
    # `broken` fails and `long` runs at one instant, after both replicas are up (a start
    # under the suite's load takes seconds; an instant passed before it would never run).
    tick = datetime.now(UTC).replace(microsecond=0) + timedelta(seconds=20)
    jobs = (
        f"  steady: {QUIET}\n"
        f"  held: {QUIET}\n"
        f'  broken: {{at: "{at(tick)}", command: [/bin/false]}}\n'
        f'  long: {{at: "{at(tick)}", shell: "sleep 120"}}\n'
    )
    with cluster(pg_dsn, schema, tmp_path) as running:
        old = running.write_config(config(schema, jobs))
        new = tmp_path / "new.yaml"
        new.write_text(config(schema, jobs + f"  extra: {QUIET}\n"))
        [first] = running.start(old)
        [second] = running.start(new, first=1)
        code, _, err = cli(running, "pause", "-c", str(old), "held", "--by", "ops",
                           "--reason", "disk full")  # fmt: skip
        assert (0, "") == (code, err)
        wait_until(
            lambda: len(running.rows("SELECT 1 FROM {leases} WHERE code IN ('broken', 'long') "
                                     "AND status IN ('FAIL', 'RUNNING')")) == 2,
            timeout=30, what="broken failed and long running",
        )  # fmt: skip
        document = status_json(running, old)
        code, text, _ = cli(running, "status", "-c", str(old), "-o", "wide")
        assert 0 == code
        replica_rows = {
            row["name"]: row
            for row in running.rows(
                f'SELECT name, config_at, started_at FROM "{schema}".leases_replicas'
            )
        }

    generated = datetime.fromisoformat(document.pop("generated_at"))
    assert timedelta(0) <= datetime.now(UTC) - generated < timedelta(minutes=1)
    assert ["jobs", "replicas", "drift", "pauses", "problems"] == list(document)

    # Jobs: next fire, last run, running, fails and pause, per job.
    entries = {entry["job"]: entry for entry in document["jobs"]}
    assert ["steady", "held", "broken", "long"] == list(entries)
    next_year = f"{generated.year + 1}-01-01T00:00:00.000Z"
    assert [next_year, next_year, None, None] == [e["next_fire"] for e in entries.values()]
    broken = entries["broken"]
    assert {"run_key": at(tick), "status": "FAIL", "reason": "error", "attempt": 1,
            "retry_at": None, "error": "exit status 1"} == {
        key: broken["last_run"][key] for key in ("run_key", "status", "reason", "attempt",
                                                 "retry_at", "error")
    }  # fmt: skip
    # A replica's name in the registry and in a lease's owner: host:pid-token.
    names = [next(r["name"] for r in document["replicas"] if f":{p.pid}-" in r["name"])
             for p in (first, second)]  # fmt: skip
    owners = set(names)
    assert broken["last_run"]["owner"] in owners
    assert (1, None) == (broken["consecutive_failures"], broken["running"])
    long = entries["long"]
    assert (None, 0) == (long["last_run"], long["consecutive_failures"])
    assert {"run_key": at(tick), "attempt": 1, "stale": False} == {
        key: long["running"][key] for key in ("run_key", "attempt", "stale")
    }
    assert long["running"]["owner"] in owners
    assert {"source": "database", "code": "held", "reason": "disk full"} == {
        key: entries["held"]["paused"][key] for key in ("source", "code", "reason")
    }
    assert entries["held"]["paused"]["by"].startswith("ops (")
    assert [None, None, None] == [entries[c]["paused"] for c in ("steady", "broken", "long")]
    assert [(None, 0)] * 2 == [
        (entries[c]["last_run"], entries[c]["consecutive_failures"]) for c in ("steady", "held")
    ]

    # Replicas: both, each with the config it runs.
    replicas = {replica["name"]: replica for replica in document["replicas"]}
    assert sorted(names) == list(replicas)
    assert [(__version__, 4), (__version__, 5)] == [
        (replicas[name]["version"], replicas[name]["jobs"]) for name in names
    ]
    old_hash, new_hash = (replicas[name]["config_hash"] for name in names)
    assert old_hash != new_hash
    for name, replica in replicas.items():
        row = replica_rows[name]
        assert [iso(row["config_at"]), iso(row["started_at"])] == [
            replica["config_since"], replica["started_at"]
        ]  # fmt: skip
        seen = datetime.fromisoformat(replica["last_seen"])
        assert datetime.fromisoformat(replica["started_at"]) <= seen <= generated

    # Drift: since the second config went live, who runs which, the job that differs.
    drift = document["drift"]
    [(extra_hash, _)] = [item for item in drift["jobs"]["extra"].items()
                               if item[0] != "absent"]  # fmt: skip
    assert {
        "since": replicas[names[1]]["config_since"],
        "configs": {old_hash: [names[0]], new_hash: [names[1]]},
        "jobs": {"extra": {"absent": [names[0]], extra_hash: [names[1]]}},
    } == drift

    # Pauses, and the one problem: the failing job (the drift is too young to be one).
    [pause] = document["pauses"]
    assert entries["held"]["paused"]["at"] == pause.pop("at")
    assert {"code": "held", "by": entries["held"]["paused"]["by"], "reason": "disk full"} == pause
    assert [{"kind": "failing", "job": "broken",
             "detail": "broken: 1 failed run(s) in a row"}] == document["problems"]  # fmt: skip

    # The text shows the same: each job's pause, fails and run, the replicas, the drift.
    jobs_text, _, replicas_text = text.partition("\n\n")
    rows = {row[0]: row for row in (re.split(r"\s{2,}", line) for line in jobs_text.splitlines())}
    assert f"by {pause['by']}: disk full" == rows["held"][-1]
    assert ["1", "FAIL/error"] == [rows["broken"][6], rows["broken"][4].split()[0]]
    assert rows["long"][5].startswith(long["running"]["owner"])
    for name, replica in replicas.items():
        assert re.search(rf"{name}\s+{re.escape(__version__)}\s+{replica['config_hash'][:8]}",
                         replicas_text), replicas_text  # fmt: skip
    assert f"DRIFT since {drift['since'][:19]}Z" in replicas_text
    assert f"  job extra: absent on {names[0]}; {extra_hash} on {names[1]}" in replicas_text


def test_check_exits_0_for_a_healthy_cluster(pg_dsn: str, schema: str, tmp_path: Path) -> None:
    with cluster(pg_dsn, schema, tmp_path) as running:
        path = running.write_config(config(schema, f"  steady: {QUIET}\n"))
        running.start(path)
        assert (0, [HEALTHY]) == check(running, path)


def test_check_exits_1_when_no_replica_is_live(pg_dsn: str, schema: str, tmp_path: Path) -> None:
    with cluster(pg_dsn, schema, tmp_path) as running:
        path = running.write_config(config(schema, f"  steady: {QUIET}\n"))
        [replica] = running.start(path)
        # A clean stop keeps the replica's row in the registry, marked stopped.
        replica.signal(signal.SIGTERM)
        assert 0 == replica.wait_exit(30)
        assert (1, ["problem: no live replica in the registry"]) == check(running, path)


def test_check_exits_1_once_drift_lasts_longer_than_15_minutes(
    pg_dsn: str, schema: str, tmp_path: Path
) -> None:
    with cluster(pg_dsn, schema, tmp_path) as running:
        old = running.write_config(config(schema, f"  steady: {QUIET}\n"))
        new = tmp_path / "new.yaml"
        new.write_text(config(schema, f"  steady: {QUIET}\n  extra: {QUIET}\n"))
        running.start(old)
        running.start(new, first=1)
        # Drift is judged by when the second config went live (the registry's
        # config_at): moved back, it reads as a drift that has lasted that long.
        assert (0, [HEALTHY]) == check(running, old)
        shift(running, timedelta(minutes=14))
        assert (0, [HEALTHY]) == check(running, old)
        shift(running, timedelta(minutes=2))
        [row] = running.rows(f'SELECT max(config_at) AS since FROM "{schema}".leases_replicas')
        assert (
            1,
            [f"problem: 2 configs live since {at(row['since'])}, longer than 15m"],
        ) == check(running, old)


def shift(running: Cluster, back: timedelta) -> None:
    running.rows(
        f'UPDATE "{running.schema}".leases_replicas SET config_at = config_at - %s RETURNING 1',
        back,
    )


def test_check_exits_1_while_a_job_is_failing(pg_dsn: str, schema: str, tmp_path: Path) -> None:
    with cluster(pg_dsn, schema, tmp_path) as running:
        path = running.write_config(
            config(schema, f"  steady: {QUIET}\n  broken: {{once: true, command: [/bin/false]}}\n")
        )
        running.start(path)
        wait_until(
            lambda: running.rows("SELECT 1 FROM {leases} WHERE code = 'broken' "
                                 "AND status = 'FAIL'"),
            timeout=30, what="broken failed",
        )  # fmt: skip
        assert (1, ["problem: broken: 1 failed run(s) in a row"]) == check(running, path)


def test_check_exits_1_when_a_job_is_stale(pg_dsn: str, schema: str, tmp_path: Path) -> None:
    with cluster(pg_dsn, schema, tmp_path) as running:
        path = running.write_config(
            config(
                schema,
                f"  steady: {QUIET}\n"
                '  quiet: {cron: "0 0 1 1 *", command: [/bin/true], alert_after: 1s}\n',
            )
        )
        running.start(path)
        # Never succeeded: stale once alert_after has passed since the replica started.
        wait_until(lambda: check(running, path)[0] == 1, timeout=10, what="quiet stale")
        code, lines = check(running, path)
    assert 1 == code
    [line] = lines
    assert re.fullmatch(r"problem: quiet: no success for \d+s \(alert_after 1s\)", line), line


def test_check_exits_2_when_it_cannot_tell(pg_dsn: str, schema: str, tmp_path: Path) -> None:
    """No database, or a config with errors: no verdict, an error line on stderr."""
    anywhere = Cluster(pg_dsn, schema, tmp_path)
    path = tmp_path / "pgcrond.yaml"
    path.write_text(f"jobs:\n  steady: {QUIET}\n")
    nowhere = "postgresql://nobody@127.0.0.1:1/none"
    code, out, err = cli(anywhere, "status", "-c", str(path), "--check", "--database-url", nowhere)
    assert (2, "") == (code, out)
    assert err.startswith("pgcrond: error: cannot reach the database")
    path.write_text('jobs:\n  steady: {cron: "61 * * * *", command: [/bin/true]}\n')
    code, out, err = cli(anywhere, "status", "-c", str(path), "--check")
    assert (2, "") == (code, out)
    assert f"{path}:2" in err and "steady" in err, err
