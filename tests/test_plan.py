"""``pgcrond plan``: each kind of change with its consequence, the warnings, the exit codes.

The cluster's side is a registry row written by the replica's own code
(``entry_of`` + ``registry.join``) and real open ticks in the lease table.
"""

from __future__ import annotations

import asyncio
import json
import uuid
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from pgcrond.cli import main
from pgcrond.config.definition import definition
from pgcrond.config.loader import load_config
from pgcrond.config.plan import FieldChange, make_plan
from pgcrond.core.keys import Identity
from pgcrond.core.timing import LeaseTiming
from pgcrond.daemon.registry import entry_of
from pgcrond.storage import registry
from pgcrond.storage.claims import Acquired
from pgcrond.storage.leases import LeaseStore

RUNNING_NOW = """\
  keep: {cron: "0 3 * * *", command: [/bin/true]}
  gone: {cron: "* * * * *", command: [/bin/gone]}
  old-seed: {once: true, command: [/bin/seed]}
  moving: {cron: "*/2 * * * *", command: [/bin/true]}
  guarded: {cron: "* * * * *", command: [/bin/true]}
"""
APPLIED = """\
  keep: {cron: "0 3 * * *", command: [/bin/true]}
  added: {cron: "0 4 * * *", command: [/bin/new]}
  seed: {once: true, command: [/bin/seed], renamed_from: [old-seed]}
  moving: {cron: "*/3 * * * *", command: [/bin/true]}
  guarded: {cron: "* * * * *", command: [/bin/true], guard: advisory}
"""


def write(tmp_path: Path, schema: str, jobs: str, name: str) -> Path:
    path = tmp_path / name
    path.write_text(f"database: {{schema: {schema}}}\njobs:\n{jobs}")
    return path


async def plan(
    capsys: pytest.CaptureFixture[str], pg_dsn: str, path: Path, *extra: str
) -> tuple[int, str, str]:
    # The CLI runs its own event loop: in a thread, next to the test's.
    argv = ["plan", "-c", str(path), "--database-url", pg_dsn, *extra]
    code = await asyncio.to_thread(main, argv)
    out, err = capsys.readouterr()
    return code, out, err


@pytest.fixture
async def cluster_runs(store: LeaseStore, schema: str, tmp_path: Path, pg_dsn: str) -> Path:
    """A live replica running RUNNING_NOW, with open ticks of `gone` and `guarded`."""
    path = write(tmp_path, schema, RUNNING_NOW, "running.yaml")
    config = load_config([str(path)], database_url=pg_dsn)
    await registry.join(store, entry_of("replica-1", uuid.uuid4(), config))
    for code in ("gone", "guarded"):
        lease = await store.claim(
            Identity.schedule(code, "2026-12-02T07:00:00Z"), LeaseTiming.build(timedelta(hours=1))
        )
        assert isinstance(lease, Acquired)
    return path


async def test_plan_prints_each_change_with_its_consequence_and_exits_2(
    cluster_runs: Path,
    schema: str,
    tmp_path: Path,
    pg_dsn: str,
    capsys: pytest.CaptureFixture[str],
) -> None:
    code, out, err = await plan(capsys, pg_dsn, write(tmp_path, schema, APPLIED, "applied.yaml"))
    assert 2 == code, err
    assert out.startswith("Plan: 1 added, 1 removed, 1 renamed, 2 changed (against 1 live replica")
    blocks = {block.splitlines()[0]: block for block in out.split("\n\n")[1:]}
    assert "new job: its first tick is" in blocks["+ added (added)"]
    assert "history is kept" in blocks["- gone (removed)"]
    assert (
        "Its 1 open tick(s) are followed only while a replica still has the job"
        in (blocks["- gone (removed)"])
    )
    assert "renamed from old-seed: its history, open ticks" in blocks["~ seed (renamed)"]
    assert (
        "a replica still on the old config finds the run-once job done"
        in (blocks["~ seed (renamed)"])
    )
    moving = blocks["~ moving (changed)"]
    assert 'schedule: {"cron": "*/2 * * * *"} -> {"cron": "*/3 * * * *"}' in moving
    assert "both schedules' ticks can run" in moving
    before = moving.split("next fires before: ")[1].splitlines()[0].split(", ")
    after = moving.split("next fires after:  ")[1].splitlines()[0].split(", ")
    assert 5 == len(before) == len(after)
    assert all(int(key[14:16]) % 2 == 0 for key in before)
    assert all(int(key[14:16]) % 3 == 0 for key in after)
    assert 'guard: "lease" -> "advisory"' in blocks["~ guarded (changed)"]
    assert "the two guards do not see each other" in blocks["~ guarded (changed)"]
    assert (
        "warning: job guarded: guard lease -> advisory while 1 tick(s) are open: the new "
        "guard does not see the old one's claims, so they may run again"
    ) in out
    assert "keep" not in blocks


async def test_plan_json_has_the_same_changes(
    cluster_runs: Path,
    schema: str,
    tmp_path: Path,
    pg_dsn: str,
    capsys: pytest.CaptureFixture[str],
) -> None:
    path = write(tmp_path, schema, APPLIED, "applied.yaml")
    code, out, err = await plan(capsys, pg_dsn, path, "--json")
    assert 2 == code, err
    found = json.loads(out)
    assert ["replica-1"] == found["replicas"]
    assert {
        ("added", "added"),
        ("gone", "removed"),
        ("seed", "renamed"),
        ("moving", "changed"),
        ("guarded", "changed"),
    } == {(job["code"], job["kind"]) for job in found["jobs"]}
    [seed] = [job for job in found["jobs"] if job["code"] == "seed"]
    assert ["old-seed"] == seed["renamed_from"]
    assert 1 == len(found["warnings"])


async def test_plan_of_what_runs_is_nothing_to_do_and_exits_0(
    cluster_runs: Path, pg_dsn: str, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, err = await plan(capsys, pg_dsn, cluster_runs)
    assert (0, "") == (code, err)
    assert out.startswith("Plan: no changes (against 1 live replica(s) running config ")


async def test_plan_after_every_replica_stopped_compares_with_the_config_they_last_ran(
    store: LeaseStore,
    schema: str,
    tmp_path: Path,
    pg_dsn: str,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """A deploy that stops every replica, then plans the new version: a changed schedule is
    changed, not added, and the plan says which replica's config it compared with."""
    path = write(tmp_path, schema, RUNNING_NOW, "running.yaml")
    entry = entry_of("replica-1", uuid.uuid4(), load_config([str(path)], database_url=pg_dsn))
    await registry.join(store, entry)
    await registry.leave(store, entry)
    assert [] == await registry.live(store)

    code, out, err = await plan(capsys, pg_dsn, write(tmp_path, schema, APPLIED, "applied.yaml"))

    assert 2 == code, err
    assert out.startswith(
        "Plan: 1 added, 1 removed, 1 renamed, 2 changed (no live replica: against config "
    )
    assert ", the last one run, by replica-1 (stopped " in out.splitlines()[0]
    blocks = {block.splitlines()[0] for block in out.split("\n\n")[1:]}
    assert {"+ added (added)", "~ moving (changed)", "~ guarded (changed)"} <= blocks
    unchanged = await plan(capsys, pg_dsn, path, "-o", "json")
    assert 0 == unchanged[0], unchanged
    against = json.loads(unchanged[1])["against"]
    assert "last_seen" == against["kind"] and against["stopped_at"] is not None


async def test_plan_with_no_config_ever_recorded_knows_the_jobs_with_history(
    store: LeaseStore,
    schema: str,
    tmp_path: Path,
    pg_dsn: str,
    capsys: pytest.CaptureFixture[str],
) -> None:
    lease = await store.claim(
        Identity.schedule("keep", "2026-12-02T03:00:00Z"), LeaseTiming.build(timedelta(hours=1))
    )
    assert isinstance(lease, Acquired)

    code, out, err = await plan(capsys, pg_dsn, write(tmp_path, schema, APPLIED, "applied.yaml"))

    assert 2 == code, err
    assert "no replica recorded a config yet: against the jobs' history" in out
    assert "+ added (added)" in out and "keep (added)" not in out
    assert "warning: 1 job(s) have history but no recorded definition" in out


async def test_a_run_once_job_renamed_without_renamed_from_is_warned_about(
    cluster_runs: Path,
    schema: str,
    tmp_path: Path,
    pg_dsn: str,
    capsys: pytest.CaptureFixture[str],
) -> None:
    jobs = RUNNING_NOW.replace("old-seed:", "seed:")
    code, out, _ = await plan(capsys, pg_dsn, write(tmp_path, schema, jobs, "no-rename.yaml"))
    assert 2 == code
    assert "- old-seed (removed)" in out and "+ seed (added)" in out
    assert (
        "warning: job seed: a run-once job with the action of removed job old-seed: without "
        "renamed_from: [old-seed] it runs again at the next start"
    ) in out


async def test_plan_exits_1_on_a_bad_config_naming_the_field(
    cluster_runs: Path,
    schema: str,
    tmp_path: Path,
    pg_dsn: str,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """A history_retention shorter than misfire_grace + lease is refused by the config itself."""
    jobs = '  keep: {cron: "0 3 * * *", command: [/bin/true], history_retention: 1m}\n'
    code, out, err = await plan(capsys, pg_dsn, write(tmp_path, schema, jobs, "bad.yaml"))
    assert (1, "") == (code, out)
    assert "bad.yaml:3: job 'keep': field 'history_retention': must be at least 1h" in err


async def test_plan_exits_1_when_the_database_is_unreachable(
    schema: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = write(tmp_path, schema, APPLIED, "applied.yaml")
    code, _, err = await plan(capsys, "postgresql://nobody@127.0.0.1:1/none", path)
    assert 1 == code
    assert "cannot reach the database" in err


def test_a_scheduled_job_renamed_without_renamed_from_is_warned_about(tmp_path: Path) -> None:
    """Pure: the plan from definitions; its history and pause would stay with the old code."""
    old = load_config(
        [str(write(tmp_path, "s", RUNNING_NOW, "old.yaml"))], database_url="postgresql://u@h/db"
    )
    new = load_config(
        [str(write(tmp_path, "s", RUNNING_NOW.replace("gone:", "went:"), "new.yaml"))],
        database_url="postgresql://u@h/db",
    )
    running = {code: [definition(job)] for code, job in old.jobs.items()}
    found = make_plan(new, running, {}, datetime(2026, 12, 2, tzinfo=UTC))
    assert {("went", "added"), ("gone", "removed")} == {(j.code, j.kind) for j in found.jobs}
    assert [
        "job went: has the action of removed job gone: if it is a rename, add "
        "renamed_from: [gone] to keep its history and pause"
    ] == found.warnings


def test_replicas_that_disagree_are_a_warning_and_a_job_any_runs_otherwise_is_changed(
    tmp_path: Path,
) -> None:
    old = load_config(
        [str(write(tmp_path, "s", RUNNING_NOW, "old.yaml"))], database_url="postgresql://u@h/db"
    )
    running = {code: [definition(job)] for code, job in old.jobs.items()}
    other = definition(old.jobs["keep"]) | {"retries": 3}
    running["keep"].append(other)
    found = make_plan(old, running, {}, datetime(2026, 12, 2, tzinfo=UTC), config_hashes=["a", "b"])
    [keep] = found.jobs
    assert ("keep", "changed") == (keep.code, keep.kind)
    assert [FieldChange("retries", 3, 0)] == keep.changes
    assert found.warnings[0].startswith("the live replicas run 2 configs (drift)")
