"""The replica registry and job renames against a real PostgreSQL (the store's own schema).

Drift and the canonical definition are pure and tested without a database;
join, touch, leave, the name refusal and the renames on the real tables.
"""

from __future__ import annotations

import asyncio
import dataclasses
import uuid
from datetime import UTC, datetime, timedelta
from pathlib import Path

import psycopg
import pytest

from pgcrond.config.definition import (
    Definition,
    canonical_text,
    canonical_texts,
    config_hash,
    definition,
    text_hash,
)
from pgcrond.config.loader import load_config
from pgcrond.config.models import Config
from pgcrond.core.keys import Identity
from pgcrond.core.timing import LeaseTiming
from pgcrond.daemon.registry import entry_of
from pgcrond.errors import ConfigError, ReplicaNameTaken
from pgcrond.storage import jobstate, registry
from pgcrond.storage.claims import Acquired
from pgcrond.storage.history import open_ticks
from pgcrond.storage.leases import LeaseStore
from pgcrond.storage.registry import ABSENT, LiveReplica, drift
from pgcrond.storage.renames import apply_renames
from tests.helpers.store import open_store

NOW = datetime(2026, 12, 2, 8, 0, tzinfo=UTC)
TIMING = LeaseTiming.build(timedelta(minutes=1))


def load(tmp_path: Path, jobs: str, name: str = "jobs.yaml") -> Config:
    path = tmp_path / name
    path.write_text('database: {url: "postgresql://u@h/db"}\njobs:\n' + jobs)
    return load_config([str(path)])


def job_hash(job: Definition) -> str:
    return text_hash(canonical_text(job))


def live(name: str, config_hash: str, at: datetime, **jobs: str) -> LiveReplica:
    return LiveReplica(name, "0.1.0", config_hash, at, dict(jobs), at, at)


# -- pure ----------------------------------------------------------------------------------


def test_replicas_that_run_one_config_show_no_drift() -> None:
    replicas = [live("a", "h1", NOW, job="x1"), live("b", "h1", NOW, job="x1")]
    assert None is drift(replicas)


def test_drift_names_the_configs_the_differing_jobs_and_when_the_second_config_went_live() -> None:
    replicas = [
        live("a", "h1", NOW, steady="s", moving="m1", gone="g"),
        live("b", "h2", NOW + timedelta(minutes=5), steady="s", moving="m2"),
        live("c", "h2", NOW + timedelta(minutes=7), steady="s", moving="m2"),
    ]
    found = drift(replicas)
    assert found is not None
    assert NOW + timedelta(minutes=5) == found.since
    assert {"h1": ["a"], "h2": ["b", "c"]} == found.configs
    assert {
        "gone": {"g": ["a"], ABSENT: ["b", "c"]},
        "moving": {"m1": ["a"], "m2": ["b", "c"]},
    } == found.jobs


def test_drift_reads_oldest_config_first_whatever_order_the_rows_come_in() -> None:
    replicas = [
        live("z-old", "h1", NOW, steady="s"),
        live("b-new", "h2", NOW + timedelta(minutes=5), steady="s", extra="e"),
        live("a-new", "h2", NOW + timedelta(minutes=6), steady="s", extra="e"),
    ]
    for order in (replicas, replicas[::-1], replicas[1:] + replicas[:1]):
        found = drift(order)
        assert found is not None
        assert [("h1", ["z-old"]), ("h2", ["a-new", "b-new"])] == list(found.configs.items())
        assert [(ABSENT, ["z-old"]), ("e", ["a-new", "b-new"])] == list(found.jobs["extra"].items())


def test_the_definition_ignores_layout_and_hides_environment_values(tmp_path: Path) -> None:
    first = load(
        tmp_path,
        "  a:\n    cron: '*/5 * * * *'\n    command: [/bin/true]\n"
        "    env: {TOKEN: s3cret-value}\n    description: one\n",
        "one.yaml",
    )
    second = load(
        tmp_path,
        "  a: {env: {TOKEN: s3cret-value}, command: [/bin/true], cron: '*/5  * * * *',"
        " description: two}\n",
        "two.yaml",
    )
    one, two = definition(first.jobs["a"]), definition(second.jobs["a"])
    assert one == two
    assert job_hash(one) == job_hash(two)
    assert config_hash(first) == config_hash(second)
    assert "s3cret-value" not in str(one)
    assert str(one["env"]["TOKEN"]).startswith("sha256:")


def test_a_changed_schedule_changes_the_job_hash_and_the_config_hash(tmp_path: Path) -> None:
    before = load(tmp_path, "  a: {cron: '*/5 * * * *', command: [/bin/true]}\n", "1.yaml")
    after = load(tmp_path, "  a: {cron: '*/10 * * * *', command: [/bin/true]}\n", "2.yaml")
    assert job_hash(definition(before.jobs["a"])) != job_hash(definition(after.jobs["a"]))
    assert config_hash(before) != config_hash(after)


def test_the_hashes_are_those_every_earlier_version_made(tmp_path: Path) -> None:
    """Replicas of two versions that run one config show no drift in a rolling upgrade.

    The values were made by the version that encoded the whole document at
    once (e9ebb77); the hashes are now put together from each job's text.
    """
    config = load(
        tmp_path,
        "  zeta: {cron: '*/5 * * * *', command: [echo, 'héllo wörld ✓'], env: {TOKEN: s3cret}}\n"
        "  alpha: {cron: '0 3 * * *', shell: 'date', timeout: 90s}\n"
        "  Mid-Job: {once: true, entrypoint: 'tests.jobs_fixture:write_context'}\n",
    )
    config = dataclasses.replace(config, spread=timedelta(seconds=2))
    assert "affb5b59420eda3294d73ca102fd7e64" == config_hash(config)
    assert {"zeta": "c18e71036fb1", "alpha": "0a8fcfbb8eaf", "Mid-Job": "349e57efa05c"} == {
        code: job_hash(definition(job)) for code, job in config.jobs.items()
    }


def test_each_jobs_canonical_text_is_its_whole_definition_encoded(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Put together field by field, with the values jobs share encoded once: the same bytes.

    config/example.yaml sets every field; its jobs share defaults and differ in the rest.
    """
    monkeypatch.setenv("PGCROND_DATABASE_URL", "postgresql://app:pw@db/app")
    config = load_config([Path(__file__).parents[1] / "config" / "example.yaml"])
    expected = {code: canonical_text(definition(job)) for code, job in config.jobs.items()}
    assert expected == canonical_texts(config)


@pytest.mark.parametrize(
    ("jobs", "message"),
    [
        (
            "  a: {cron: '* * * * *', command: [x], renamed_from: [b]}\n"
            "  b: {cron: '* * * * *', command: [x], renamed_from: [a]}\n",
            "jobs.yaml:3: job 'a': field 'renamed_from': 'b' is a cycle",
        ),
        (
            "  a: {cron: '* * * * *', command: [x], renamed_from: [a]}\n",
            "jobs.yaml:3: job 'a': field 'renamed_from': names this job's own code",
        ),
        (
            "  a: {cron: '* * * * *', command: [x], renamed_from: [b]}\n"
            "  b: {cron: '* * * * *', command: [x]}\n",
            "jobs.yaml:3: job 'a': field 'renamed_from': 'b' is still a job of this config",
        ),
        (
            "  a: {cron: '* * * * *', command: [x], renamed_from: [old]}\n"
            "  b: {cron: '* * * * *', command: [x], renamed_from: [old]}\n",
            "jobs.yaml:4: job 'b': field 'renamed_from': 'old' is also in the renamed_from "
            "of job 'a'",
        ),
        (
            "  a: {cron: '* * * * *', command: [x], renamed_from: old}\n",
            "jobs.yaml:3: job 'a': field 'renamed_from': must be a list of job codes",
        ),
    ],
    ids=["cycle", "itself", "clash", "claimed-twice", "not-a-list"],
)
def test_a_bad_renamed_from_is_a_config_error_naming_file_line_job_and_field(
    tmp_path: Path, jobs: str, message: str
) -> None:
    with pytest.raises(ConfigError) as raised:
        load(tmp_path, jobs)
    assert any(message in str(issue) for issue in raised.value.issues), raised.value.issues


# -- the registry --------------------------------------------------------------------------


async def test_a_replica_joins_is_listed_live_and_leaves(store: LeaseStore, tmp_path: Path) -> None:
    config = load(tmp_path, "  a: {cron: '* * * * *', command: [/bin/true]}\n")
    entry = entry_of("r1", uuid.uuid4(), config)
    await registry.join(store, entry)
    [seen] = await registry.live(store, definitions=True)
    assert ("r1", config_hash(config)) == (seen.name, seen.config_hash)
    assert {"a": job_hash(definition(config.jobs["a"]))} == seen.job_hashes
    assert seen.definitions == {"a": definition(config.jobs["a"])}
    assert 1 == (await registry.touch(store, entry)).hashes
    await registry.leave(store, entry)
    assert [] == await registry.live(store)
    # Stopped, its row stays with the config it ran, for `plan` while none runs.
    found = await registry.last_seen(store)
    assert found is not None
    last, stopped_at = found
    assert ("r1", seen.definitions) == (last.name, last.definitions)
    assert stopped_at is not None
    # The name is free at once: a stopped replica holds nothing.
    await registry.join(store, entry_of("r1", uuid.uuid4(), config))
    assert ["r1"] == [r.name for r in await registry.live(store)]


async def test_a_join_deletes_the_rows_of_replicas_not_seen_for_keep_stopped(
    store: LeaseStore, tmp_path: Path, pg_dsn: str, schema: str
) -> None:
    config = load(tmp_path, "  a: {cron: '* * * * *', command: [/bin/true]}\n")
    old = entry_of("old", uuid.uuid4(), config)
    await registry.join(store, old)
    await registry.leave(store, old)
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        conn.execute(
            f'UPDATE "{schema}".leases_replicas SET last_seen = last_seen - %s',
            (registry.KEEP_STOPPED + timedelta(seconds=1),),
        )
    recent = entry_of("recent", uuid.uuid4(), config)
    await registry.join(store, recent)
    await registry.leave(store, recent)
    await registry.join(store, entry_of("new", uuid.uuid4(), config))
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        names = [row[0] for row in conn.execute(
            f'SELECT name FROM "{schema}".leases_replicas ORDER BY name'
        )]  # fmt: skip
    assert ["new", "recent"] == names


async def test_a_name_held_by_a_live_replica_is_refused_and_a_gone_ones_is_taken(
    store: LeaseStore, tmp_path: Path, pg_dsn: str, schema: str
) -> None:
    config = load(tmp_path, "  a: {cron: '* * * * *', command: [/bin/true]}\n")
    await registry.join(store, entry_of("same", uuid.uuid4(), config))
    with pytest.raises(ReplicaNameTaken) as raised:
        await registry.join(store, entry_of("same", uuid.uuid4(), config))
    assert "replica name 'same' is held by another live replica" in str(raised.value)
    assert "--replica or PGCROND_REPLICA" in str(raised.value)
    # Not seen for longer than GONE_AFTER: it died without leaving; the name is free.
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        conn.execute(
            f'UPDATE "{schema}".leases_replicas SET last_seen = last_seen - %s',
            (registry.GONE_AFTER + timedelta(seconds=1),),
        )
    assert [] == await registry.live(store)
    newcomer = entry_of("same", uuid.uuid4(), config)
    await registry.join(store, newcomer)
    [seen] = await registry.live(store)
    assert "same" == seen.name


async def test_a_touch_whose_row_is_gone_joins_again(
    store: LeaseStore, tmp_path: Path, pg_dsn: str, schema: str
) -> None:
    config = load(tmp_path, "  a: {cron: '* * * * *', command: [/bin/true]}\n")
    entry = entry_of("r1", uuid.uuid4(), config)
    await registry.join(store, entry)
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        conn.execute(f'DELETE FROM "{schema}".leases_replicas')
    await registry.touch(store, entry)
    assert ["r1"] == [r.name for r in await registry.live(store)]


# -- renames -------------------------------------------------------------------------------


async def finished(store: LeaseStore, identity: Identity) -> None:
    lease = await store.claim(identity, TIMING)
    assert isinstance(lease, Acquired)
    assert await store.complete(lease)


async def test_a_rename_moves_history_open_ticks_run_once_state_and_pause_once(
    store: LeaseStore, pg_dsn: str, schema: str
) -> None:
    await finished(store, Identity.schedule("old-report", "2026-12-02T07:00:00Z"))
    await finished(store, Identity.schedule("older-report", "2026-12-02T06:00:00Z"))
    open_tick = await store.claim(Identity.schedule("old-report", "2026-12-02T07:01:00Z"), TIMING)
    assert isinstance(open_tick, Acquired)
    await finished(store, Identity.initial("old-seed"))
    await jobstate.pause(store, ["old-report"], by="ops", reason="maintenance")
    renames = [("report", ("old-report", "older-report")), ("seed", ("old-seed",))]

    # Two replicas starting together: the lock queues them, the second moves nothing.
    async with open_store(pg_dsn, schema, owner="test:2", migrate=False) as other:
        first, second = await asyncio.gather(
            apply_renames(store, renames, {"seed"}), apply_renames(other, renames, {"seed"})
        )
    moved = first or second
    assert [] == (second if first else first)
    assert {("report", 3, 0, 1), ("seed", 0, 1, 0)} == {
        (m.code, m.ticks, m.initial, m.paused) for m in moved
    }
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        codes = conn.execute(
            f'SELECT code, type, status, reason FROM "{schema}".leases '
            "WHERE code NOT IN ('report', 'seed') ORDER BY 1"
        ).fetchall()
    # Only the run-once job's old code is marked, as renamed.
    assert [("old-seed", "INITIAL", "SKIPPED", "renamed")] == codes
    assert "report" in await jobstate.paused(store)
    # The run-once job is done under its new code: a claim is refused.
    assert not isinstance(await store.claim(Identity.initial("seed"), TIMING), Acquired)
    # The open tick is followed under the new code with the key it was claimed with.
    [tick] = await open_ticks(store, ["report"], within=timedelta(days=1))
    followed = Identity.schedule("report", tick.run_key, tick.key_code)
    assert open_tick.identity.idempotency_key == followed.idempotency_key
    assert [] == await apply_renames(store, renames, {"seed"})
    # A replica of the old config finds the run-once job settled under its old code.
    assert not isinstance(await store.claim(Identity.initial("old-seed"), TIMING), Acquired)


async def test_a_tick_both_codes_ran_stays_under_the_old_code(
    store: LeaseStore, pg_dsn: str, schema: str
) -> None:
    await finished(store, Identity.schedule("old", "2026-12-02T07:00:00Z"))
    await finished(store, Identity.schedule("new", "2026-12-02T07:00:00Z"))
    assert [] == await apply_renames(store, [("new", ("old",))])
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        codes = conn.execute(f'SELECT code FROM "{schema}".leases ORDER BY 1').fetchall()
    assert [("new",), ("old",)] == codes
