"""A request's life in one replica: taken, joined, retaken, given back, polled, pruned.

One fire per identity, whatever asks for it.

Real PostgreSQL, real guards, the daemon's own :class:`~pgcrond.daemon.requests.Requests`
in this process (its bounds shortened), shell jobs that append to a file: the
file is the ground truth of how often a run started.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, MutableMapping
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import psycopg
import pytest
import structlog
import yaml

from pgcrond.config.loader import load_config
from pgcrond.config.models import Config
from pgcrond.core.keys import Identity
from pgcrond.daemon.requests import Requests
from pgcrond.fire import Fire, Firing
from pgcrond.guard import Guards
from pgcrond.storage import requests as stored
from pgcrond.storage.leases import LeaseStore
from pgcrond.storage.pooling import Pooling
from pgcrond.storage.requests import request_run, take_requests
from tests.helpers.daemon_harness import until

# Starts replicas or servers: the system tier.
pytestmark = pytest.mark.usefixtures("system_processes")

Logs = list[MutableMapping[str, Any]]


def configured(tmp_path: Path, pg_dsn: str, schema: str, **report: object) -> Config:
    """A config of one job, ``report``: daily at 03:00 (requests run it), and ``report``."""
    path = tmp_path / "jobs.yaml"
    document = {
        "database": {"url": pg_dsn, "schema": schema},
        "defaults": {"misfire_grace": "30s", "lease": "20s"},
        "jobs": {"report": {"cron": "0 3 * * *", **report}},
    }
    path.write_text(yaml.safe_dump(document))
    return load_config([path])


def starts(path: Path) -> int:
    return len(path.read_text().splitlines()) if path.exists() else 0


@dataclass
class Replica:
    """What the daemon wires for requests: a Firing over real guards, and Requests."""

    store: LeaseStore
    firing: Firing
    requests: Requests
    stopping: asyncio.Event
    tasks: set[asyncio.Task[Any]] = field(default_factory=set)

    async def shutdown(self) -> None:
        """As the daemon does: stop claiming, stop the runs, wait for the fires."""
        self.stopping.set()
        self.firing.stop()
        for cancellation in list(self.firing.running.values()):
            cancellation.cancel("shutdown")
        if self.requests.tasks:
            await asyncio.wait(self.requests.tasks, timeout=15)


@contextlib.asynccontextmanager
async def replica(
    store: LeaseStore, pg_dsn: str, config: Config, name: str, **options: Any
) -> AsyncIterator[Replica]:
    own = LeaseStore(store.db, schema=store.queries.schema, owner=name)
    firing = Firing(guards=Guards(own, store.db).for_job, replica=name)
    stopping = asyncio.Event()
    fire_tasks: set[asyncio.Task[Any]] = set()
    requests = Requests(
        store=own,
        conninfo=pg_dsn,
        config=lambda: config,
        firing=firing,
        tasks=fire_tasks,
        stopping=stopping,
        replica=name,
        **options,
    )
    running = Replica(own, firing, requests, stopping, fire_tasks)
    try:
        yield running
    finally:
        await running.shutdown()


def lock_waits(pg_dsn: str, schema: str) -> int:
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        row = conn.execute(
            "SELECT count(*) FROM pg_locks WHERE NOT granted AND relation = %s::regclass",
            (f'"{schema}".leases',),
        ).fetchone()
    return 0 if row is None else int(row[0])


async def claimed_or_joined(pg_dsn: str, schema: str, logs: Logs, what: str) -> None:
    """Wait until ``what``, a second fire of a claimed identity, claims too or joins the first."""
    await until(
        lambda: lock_waits(pg_dsn, schema) == 2 or any(e["event"] == "fire_joined" for e in logs),
        5,
        f"{what} to claim or join",
    )


def request_row(pg_dsn: str, schema: str, run_key: str) -> dict[str, Any]:
    with psycopg.connect(pg_dsn, autocommit=True, row_factory=psycopg.rows.dict_row) as conn:
        row = conn.execute(
            f'SELECT * FROM "{schema}".leases_requests WHERE run_key = %s', (run_key,)
        ).fetchone()
    assert row is not None
    return dict(row)


def lease_row(pg_dsn: str, schema: str, run_key: str) -> dict[str, Any] | None:
    with psycopg.connect(pg_dsn, autocommit=True, row_factory=psycopg.rows.dict_row) as conn:
        row = conn.execute(
            f'SELECT status, reason, attempt FROM "{schema}".leases WHERE run_key = %s',
            (run_key,),
        ).fetchone()
    return None if row is None else dict(row)


# -- one fire per identity on a replica --------------------------------------------------


async def test_two_fires_of_one_identity_on_one_replica_run_it_once_and_share_its_outcome(
    store: LeaseStore, pg_dsn: str, schema: str, tmp_path: Path
) -> None:
    """Catch-up or a request firing a tick whose first claim is still unanswered: joined."""
    ran = tmp_path / "ran"
    config = configured(tmp_path, pg_dsn, schema, shell=f"echo x >> {ran}")
    job = config.jobs["report"]
    identity = Identity.schedule("report", "manual:join")
    async with replica(store, pg_dsn, config, "r:1") as one:
        with structlog.testing.capture_logs() as logs, psycopg.connect(pg_dsn) as blocker:
            blocker.execute(f'LOCK TABLE "{schema}".leases IN ACCESS EXCLUSIVE MODE')
            first = asyncio.create_task(one.firing.fire(Fire(job, datetime.now(UTC), identity)))
            await until(lambda: lock_waits(pg_dsn, schema) == 1, 5, "the first claim to wait")
            second = asyncio.create_task(one.firing.fire(Fire(job, datetime.now(UTC), identity)))
            await claimed_or_joined(pg_dsn, schema, logs, "the second fire")
            blocker.rollback()
            outcomes = await asyncio.wait_for(asyncio.gather(first, second), 15)
    assert ["success", "success"] == list(outcomes)
    assert 1 == starts(ran)
    assert 1 == sum(e["event"] == "run_started" for e in logs)
    assert [] == [e for e in logs if e["event"] in ("fire_crashed", "run_crashed")]
    assert {"status": "SUCCESS", "reason": None, "attempt": 1} == lease_row(
        pg_dsn, schema, "manual:join"
    )


async def test_a_request_retaken_by_its_own_replica_while_it_claims_runs_once_and_stops(
    store: LeaseStore, pg_dsn: str, schema: str, tmp_path: Path
) -> None:
    """A claim retried past the retake interval, and the request taken again, run once."""
    ran = tmp_path / "ran"
    config = configured(tmp_path, pg_dsn, schema, shell=f"echo x >> {ran}; exec sleep 60")
    async with replica(store, pg_dsn, config, "r:1", retake_after=timedelta(milliseconds=1)) as one:
        await request_run(store, "report", "manual:retake", by="shell")
        with structlog.testing.capture_logs() as logs, psycopg.connect(pg_dsn) as blocker:
            blocker.execute(f'LOCK TABLE "{schema}".leases IN ACCESS EXCLUSIVE MODE')
            assert 1 == await one.requests.take()
            await until(lambda: lock_waits(pg_dsn, schema) == 1, 5, "the first claim to wait")
            # Its take interval passed: the same replica takes again. Today's
            # take keeps a running request taken; one taken again anyway (the
            # renewal late through an outage) must be joined, not run twice.
            if await one.requests.take():
                await claimed_or_joined(pg_dsn, schema, logs, "the retaken request")
            assert "r:1" == request_row(pg_dsn, schema, "manual:retake")["taken_by"]
            blocker.rollback()
            await until(lambda: starts(ran) >= 1, 10, "the run to start")
            await until(lambda: len(one.firing.running) >= 1, 5, "the run to be tracked")
            # Room for a second run to show up, if one were coming.
            await until(lambda: any(e["event"] == "run_started" for e in logs), 5, "run_started")
            await asyncio.sleep(0.5)
            runs = starts(ran)
            tracked = len(one.firing.running)
            await asyncio.wait_for(one.shutdown(), 20)
    assert 1 == runs
    assert 1 == tracked
    assert 1 == sum(e["event"] == "run_started" for e in logs)
    assert [] == [e for e in logs if e["event"] in ("fire_crashed", "run_crashed")]
    # Shutdown stopped the one run: released for a survivor, the request given back.
    finished = [e for e in logs if e["event"] == "run_finished"]
    assert ["cancelled"] == [e["outcome"] for e in finished]
    assert {"status": "FAIL", "reason": "released", "attempt": 1} == lease_row(
        pg_dsn, schema, "manual:retake"
    )
    row = request_row(pg_dsn, schema, "manual:retake")
    assert (None, None) == (row["taken_by"], row["done_at"])


async def test_a_request_stopped_with_a_retry_pending_is_given_back_and_run_to_its_end(
    store: LeaseStore, pg_dsn: str, schema: str, tmp_path: Path
) -> None:
    """Its first attempt failed, its replica stops before the retry: another one retries it."""
    ran = tmp_path / "ran"
    config = configured(
        tmp_path,
        pg_dsn,
        schema,
        retries=1,
        retry_delay="2s",
        # The first attempt fails, the second succeeds.
        shell=f"echo x >> {ran}; test $(wc -l < {ran}) -ge 2",
    )
    await request_run(store, "report", "manual:retry", by="shell")
    with structlog.testing.capture_logs() as logs:
        async with replica(store, pg_dsn, config, "r:1") as first:
            assert 1 == await first.requests.take()
            await until(
                lambda: any(e["event"] == "run_finished" for e in logs), 10, "the first attempt"
            )
            await asyncio.wait_for(first.shutdown(), 20)
        # The retry is pending and nobody follows it: the request is not done.
        assert ["fail"] == [e["outcome"] for e in logs if e["event"] == "run_finished"]
        assert {"status": "FAIL", "reason": "error", "attempt": 1} == lease_row(
            pg_dsn, schema, "manual:retry"
        )
        row = request_row(pg_dsn, schema, "manual:retry")
        assert (None, None, None) == (row["taken_by"], row["done_at"], row["outcome"])
        async with replica(store, pg_dsn, config, "r:2") as second:
            assert 1 == await second.requests.take()
            await until(
                lambda: request_row(pg_dsn, schema, "manual:retry")["done_at"], 15, "the retry"
            )
    assert 2 == starts(ran)
    row = request_row(pg_dsn, schema, "manual:retry")
    assert ("r:2", "success") == (row["taken_by"], row["outcome"])
    assert {"status": "SUCCESS", "reason": None, "attempt": 2} == lease_row(
        pg_dsn, schema, "manual:retry"
    )


# -- a dead taker, an unknown pooling mode, pruning -------------------------------------


async def test_a_request_whose_taker_died_before_it_claimed_is_taken_again_unprompted(
    store: LeaseStore, pg_dsn: str, schema: str, tmp_path: Path
) -> None:
    ran = tmp_path / "ran"
    config = configured(tmp_path, pg_dsn, schema, shell=f"echo x >> {ran}")
    await request_run(store, "report", "manual:orphan", by="shell")
    await take_requests(
        store,
        ["report"],
        by="dead:1",
        within=timedelta(hours=1),
        retake_after=timedelta(minutes=1),
        limit=10,
    )
    async with replica(
        store, pg_dsn, config, "r:1", retake_after=timedelta(seconds=1), sweep_every_s=0.3
    ) as one:
        listening = asyncio.create_task(one.requests.run(_pooling("direct")))
        try:
            await until(lambda: starts(ran) == 1, 10, "the orphaned request to run")
            await until(lambda: request_row(pg_dsn, schema, "manual:orphan")["done_at"], 5, "done")
        finally:
            listening.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await listening
    assert "r:1" == request_row(pg_dsn, schema, "manual:orphan")["taken_by"]


async def test_an_idle_listener_with_no_open_request_sends_nothing(
    store: LeaseStore, pg_dsn: str, schema: str, tmp_path: Path
) -> None:
    config = configured(tmp_path, pg_dsn, schema, shell="true")
    async with replica(
        store, pg_dsn, config, "r:1", retake_after=timedelta(seconds=1), sweep_every_s=0.1
    ) as one:
        with structlog.testing.capture_logs() as logs:
            listening = asyncio.create_task(one.requests.run(_pooling("direct")))
            try:
                # The take at listening start follows its log line: the idle
                # window begins once that take has been answered.
                await until(
                    lambda: (
                        one.requests.takes >= 1
                        and any(e["event"] == "requests_listening" for e in logs)
                    ),
                    5,
                    "listening and the take at its start answered",
                )
                swept = one.requests.takes
                await asyncio.sleep(1.0)  # ten sweep intervals: none may be sent
                idle = one.requests.takes - swept
            finally:
                listening.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await listening
    assert 0 == idle


async def test_a_request_whose_notification_never_arrives_is_polled_when_pooling_is_unknown(
    store: LeaseStore, pg_dsn: str, schema: str, tmp_path: Path
) -> None:
    """Behind a transaction pooler the probe may answer "unknown": LISTEN may hear nothing."""
    ran = tmp_path / "ran"
    config = configured(tmp_path, pg_dsn, schema, shell=f"echo x >> {ran}")
    async with replica(store, pg_dsn, config, "r:1", poll_every_s=0.3) as one:
        with structlog.testing.capture_logs() as logs:
            listening = asyncio.create_task(one.requests.run(_pooling("unknown")))
            try:
                await until(
                    lambda: any(
                        e["event"] in ("requests_listening", "requests_polled") for e in logs
                    ),
                    5,
                    "the replica to listen or poll",
                )
                # As a pooler in transaction mode would: the row, and no notification.
                with psycopg.connect(pg_dsn, autocommit=True) as conn:
                    conn.execute(
                        f'INSERT INTO "{schema}".leases_requests '
                        "(code, run_key, requested_by, requested_at) "
                        "VALUES ('report', 'manual:unheard', 'shell', now())"
                    )
                await until(lambda: starts(ran) == 1, 5, "the unheard request to run")
            finally:
                listening.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await listening
    assert any(e["event"] == "requests_polled" and e["mode"] == "unknown" for e in logs)


async def test_prune_deletes_finished_requests_older_than_the_retention_only(
    store: LeaseStore, pg_dsn: str, schema: str
) -> None:
    for key in ("manual:old", "manual:recent", "manual:pending"):
        await request_run(store, "report", key, by="shell")
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        conn.execute(
            f"UPDATE \"{schema}\".leases_requests SET taken_by = 'r', taken_at = now(), "
            "done_at = now() - CASE run_key WHEN 'manual:old' THEN interval '40 days' "
            "ELSE interval '1 hour' END, outcome = 'success' WHERE run_key <> 'manual:pending'"
        )
        conn.execute(
            f"UPDATE \"{schema}\".leases_requests SET requested_at = now() - interval '50 days'"
        )
    assert 1 == await stored.prune_requests(store, timedelta(days=30))
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        left = conn.execute(
            f'SELECT run_key FROM "{schema}".leases_requests ORDER BY run_key'
        ).fetchall()
    assert [("manual:pending",), ("manual:recent",)] == left


# -- an advisory request that ran, whose finish did not land ----------------------------


async def test_an_advisory_request_retaken_after_its_run_started_is_not_run_again(
    store: LeaseStore, pg_dsn: str, schema: str, tmp_path: Path
) -> None:
    ran = tmp_path / "ran"
    config = configured(
        tmp_path, pg_dsn, schema, guard="advisory", min_hold="1ms", shell=f"echo x >> {ran}"
    )
    await request_run(store, "report", "manual:adv", by="shell")
    async with replica(store, pg_dsn, config, "r:1") as first:
        assert 1 == await first.requests.take()
        await until(
            lambda: request_row(pg_dsn, schema, "manual:adv")["done_at"], 10, "the first run"
        )
    # Its finish did not land (an outage, a kill between the run and the write):
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        conn.execute(
            f'UPDATE "{schema}".leases_requests SET done_at = NULL, outcome = NULL, '
            "taken_at = now() - interval '1 hour'"
        )
    with structlog.testing.capture_logs() as logs:
        async with replica(store, pg_dsn, config, "r:2") as second:
            assert 1 == await second.requests.take()
            await until(
                lambda: request_row(pg_dsn, schema, "manual:adv")["done_at"], 10, "the retake"
            )
    assert 1 == starts(ran)
    row = request_row(pg_dsn, schema, "manual:adv")
    assert ("r:2", "unknown") == (row["taken_by"], row["outcome"])
    assert any(e["event"] == "request_outcome_unknown" for e in logs), logs


async def test_an_advisory_request_taken_by_a_replica_that_died_before_it_ran_still_runs(
    store: LeaseStore, pg_dsn: str, schema: str, tmp_path: Path
) -> None:
    ran = tmp_path / "ran"
    config = configured(
        tmp_path, pg_dsn, schema, guard="advisory", min_hold="1ms", shell=f"echo x >> {ran}"
    )
    await request_run(store, "report", "manual:adv2", by="shell")
    await take_requests(
        store,
        ["report"],
        by="dead:1",
        within=timedelta(hours=1),
        retake_after=timedelta(minutes=1),
        limit=10,
    )
    async with replica(
        store, pg_dsn, config, "r:2", retake_after=timedelta(milliseconds=1)
    ) as second:
        assert 1 == await second.requests.take()
        await until(lambda: request_row(pg_dsn, schema, "manual:adv2")["done_at"], 10, "the retake")
    assert 1 == starts(ran)
    assert "success" == request_row(pg_dsn, schema, "manual:adv2")["outcome"]


async def _resolved(mode: str) -> Pooling:
    return Pooling(mode)  # type: ignore[arg-type]


def _pooling(mode: str) -> Any:
    return _resolved(mode)
