"""The alert gauges: seeded from the table's truth, kept current by this replica's finalizes.

Unit tests of :class:`pgcrond.daemon.alerts.JobAlerts` on a fake clock, the
exposition it adds to the daemon's registry, /readyz's detail, and the seed
against a real lease table (the restart: gauges start from what the table
says, not from zero).
"""

from __future__ import annotations

import asyncio
import time
from datetime import UTC, datetime, timedelta
from typing import Any

from prometheus_client.openmetrics.parser import (
    text_string_to_metric_families as openmetrics_families,
)
from prometheus_client.parser import text_string_to_metric_families

from pgcrond.core.keys import Identity
from pgcrond.core.timing import LeaseTiming
from pgcrond.daemon.alerts import JobAlerts, seed
from pgcrond.daemon.http import HealthServer
from pgcrond.daemon.metrics import MISSED_REASONS, Metrics, exposition
from pgcrond.storage.claims import Acquired
from pgcrond.storage.leases import LeaseStore
from pgcrond.storage.ticks import MISSED_REASONS as STORED_REASONS
from pgcrond.storage.ticks import job_ticks
from tests.helpers.http import fetch
from tests.helpers.store import open_store

T0 = datetime(2026, 11, 30, 4, 0, tzinfo=UTC).timestamp()


class Clock:
    def __init__(self) -> None:
        self.now = T0

    def __call__(self) -> float:
        return self.now


def gauges(metrics: Metrics) -> dict[tuple[str, str], float]:
    text = exposition(metrics.registry, "text/plain")[0]().decode()
    return {
        (sample.name, sample.labels["cronjob"]): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
        if sample.name.startswith("pgcrond_job_") and sample.name != "pgcrond_job_paused"
    }


def row(code: str, **values: Any) -> dict[str, Any]:
    return {
        "code": code,
        "last_success_at": None,
        "last_failure_at": None,
        "consecutive_failures": 0,
        **values,
    }


def test_before_any_outcome_every_job_has_zero_failures_and_no_made_up_timestamps() -> None:
    metrics = Metrics()
    metrics.set_jobs(["nightly", "sync"], {"nightly": timedelta(hours=2), "sync": None})
    # Stale only for a job with alert_after, and not stale right after the start.
    assert {
        ("pgcrond_job_consecutive_failures", "nightly"): 0.0,
        ("pgcrond_job_consecutive_failures", "sync"): 0.0,
        ("pgcrond_job_stale", "nightly"): 0.0,
    } == gauges(metrics)


def test_the_seed_sets_the_table_truth_and_finalizes_move_it() -> None:
    clock = Clock()
    alerts = JobAlerts(clock)
    alerts.set_jobs({"nightly": timedelta(hours=2)})
    ok = datetime(2026, 11, 29, 2, 4, 31, tzinfo=UTC)
    bad = datetime(2026, 11, 30, 2, 15, tzinfo=UTC)
    alerts.seed([row("nightly", last_success_at=ok, last_failure_at=bad, consecutive_failures=2)])
    metrics = Metrics()
    families = metrics.registry.job_families
    families[families.index(metrics.alerts)] = metrics.alerts = alerts
    assert {
        ("pgcrond_job_last_success_timestamp_seconds", "nightly"): ok.timestamp(),
        ("pgcrond_job_last_failure_timestamp_seconds", "nightly"): bad.timestamp(),
        ("pgcrond_job_consecutive_failures", "nightly"): 2.0,
        # More than 2 h since the last success: stale, computed at scrape time.
        ("pgcrond_job_stale", "nightly"): 1.0,
    } == gauges(metrics)
    clock.now += 10
    alerts.recorded("nightly", "fail", final=False)  # a retry follows: not counted yet
    assert 2 == alerts._jobs["nightly"].consecutive_failures
    assert T0 + 10 == alerts._jobs["nightly"].last_failure
    alerts.recorded("nightly", "timeout", final=True)
    assert 3 == alerts._jobs["nightly"].consecutive_failures
    alerts.recorded("nightly", "released", final=False)  # a shutdown hand-over: no outcome
    assert 3 == alerts._jobs["nightly"].consecutive_failures
    clock.now += 5
    alerts.recorded("nightly", "success", final=True)
    assert (T0 + 15, 0) == (
        alerts._jobs["nightly"].last_success,
        alerts._jobs["nightly"].consecutive_failures,
    )
    assert {} == alerts.stale()


def test_a_seed_answering_after_a_local_finalize_keeps_the_newer_truth() -> None:
    clock = Clock()
    alerts = JobAlerts(clock)
    alerts.set_jobs({"nightly": None})
    alerts.recorded("nightly", "success", final=True)
    older = datetime.fromtimestamp(T0 - 3600, UTC)
    alerts.seed([row("nightly", last_success_at=older, consecutive_failures=4)])
    assert (T0, 0) == (
        alerts._jobs["nightly"].last_success,
        alerts._jobs["nightly"].consecutive_failures,
    )


def test_a_job_that_never_succeeded_is_stale_alert_after_past_this_start() -> None:
    clock = Clock()
    alerts = JobAlerts(clock)
    alerts.set_jobs({"new": timedelta(minutes=10)})
    clock.now += 599
    assert {} == alerts.stale()
    clock.now += 2
    assert {"new": 601.0} == alerts.stale()
    assert [
        "stale: new: no success for 601s > alert_after 600s "
        "(never succeeded since this replica started)"
    ] == alerts.readiness_detail()


def test_a_reload_drops_the_removed_jobs_and_keeps_what_is_known_of_the_others() -> None:
    alerts = JobAlerts(Clock())
    alerts.set_jobs({"a": None, "b": None})
    alerts.recorded("a", "fail", final=True)
    alerts.set_jobs({"a": timedelta(hours=1), "c": None})
    assert ["a", "c"] == sorted(alerts._jobs)
    assert 1 == alerts._jobs["a"].consecutive_failures
    alerts.recorded("b", "fail", final=True)  # a removed job's late finalize: ignored
    assert "b" not in alerts._jobs


def test_metrics_and_the_table_name_the_same_missed_reasons() -> None:
    assert STORED_REASONS == MISSED_REASONS


async def test_readyz_names_stale_jobs_in_its_body_without_failing() -> None:
    clock = Clock()
    metrics = Metrics()
    metrics.alerts._clock = clock
    metrics.alerts._started = clock.now
    metrics.set_jobs(["nightly"], {"nightly": timedelta(seconds=30)})

    async def ready() -> bool:
        return True

    server = HealthServer(
        "127.0.0.1:0",
        health=lambda: True,
        ready=ready,
        registry=metrics.registry,
        ready_detail=metrics.alerts.readiness_detail,
    )
    await server.start()
    try:
        assert (200, b"ok\n") == (await fetch(server.port, "/readyz"))[::2]
        clock.now += 31
        status, _, body = await fetch(server.port, "/readyz")
    finally:
        await server.stop()
    assert 200 == status
    assert (
        b"ok\nstale: nightly: no success for 31s > alert_after 30s "
        b"(never succeeded since this replica started)\n"
    ) == body


async def test_a_restarted_replica_seeds_the_gauges_from_the_lease_table(
    pg_dsn: str, schema: str
) -> None:
    """What a fresh replica reads at start: the runs other replicas recorded before it."""
    async with open_store(pg_dsn, schema) as store:
        await _seed_and_compare(store)


async def _seed_and_compare(store: LeaseStore) -> None:
    keys = [("2026-11-30T03:00:00Z", "success"), ("2026-11-30T03:15:00Z", "fail"),
            ("2026-11-30T03:30:00Z", "fail"), ("2026-11-30T03:45:00Z", "retrying")]  # fmt: skip
    for key, outcome in keys:
        claim = await store.claim(
            Identity.schedule("sync", key), LeaseTiming.build(timedelta(minutes=1))
        )
        assert isinstance(claim, Acquired)
        if outcome == "success":
            assert await store.complete(claim)
        else:
            # A failure with a retry pending is a failure, but not yet a final one.
            retry = timedelta(minutes=5) if outcome == "retrying" else None
            assert await store.fail(claim, "exit status 3", retry_after=retry)
    rows = await job_ticks(store, ["sync", "other"], misses_within=timedelta(0))
    truth = {r["code"]: r for r in rows}
    alerts = JobAlerts()
    alerts.set_jobs({"sync": None, "other": None})
    await seed(
        alerts,
        lambda codes: job_ticks(store, codes, misses_within=timedelta(0)),
        lambda: ["sync", "other"],
        asyncio.Event(),
    )
    sync = alerts._jobs["sync"]
    assert truth["sync"]["last_success_at"].timestamp() == sync.last_success
    assert truth["sync"]["last_failure_at"].timestamp() == sync.last_failure
    assert 2 == sync.consecutive_failures
    assert (None, None, 0) == (
        alerts._jobs["other"].last_success,
        alerts._jobs["other"].last_failure,
        alerts._jobs["other"].consecutive_failures,
    )


def next_fires(metrics: Metrics) -> dict[str, float]:
    text = exposition(metrics.registry, "text/plain")[0]().decode()
    return {
        sample.labels["cronjob"]: sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
        if sample.name == "pgcrond_next_fire_timestamp_seconds"
    }


def test_next_fire_is_read_from_the_scheduler_at_each_scrape_for_every_job_of_a_schedule() -> None:
    metrics = Metrics()
    assert {} == next_fires(metrics)  # no scheduler yet: no made-up times
    tick = datetime(2026, 11, 30, 5, 0, tzinfo=UTC)
    entries: list[tuple[list[str], datetime | None]] = [
        (["a", "b"], tick),
        (["done"], None),  # a schedule with no tick left
    ]
    metrics.next_fires.follow(lambda: entries)
    assert {"a": tick.timestamp(), "b": tick.timestamp()} == next_fires(metrics)
    # The scheduler moved on (a fire, a reload): the next scrape shows it.
    entries[:] = [(["a"], tick + timedelta(minutes=1))]
    assert {"a": (tick + timedelta(minutes=1)).timestamp()} == next_fires(metrics)


def test_next_fire_of_10000_jobs_on_a_few_schedules_renders_in_milliseconds() -> None:
    metrics = Metrics()
    tick = datetime(2026, 11, 30, 5, 0, tzinfo=UTC)
    groups = [
        ([f"job-{g}-{i}" for i in range(2_000)], tick + timedelta(minutes=g)) for g in range(5)
    ]
    metrics.next_fires.follow(lambda: groups)
    started = time.perf_counter()
    text = metrics.next_fires.render(openmetrics=True)
    took = time.perf_counter() - started
    (family,) = text_string_to_metric_families(text)
    assert 10_000 == len(family.samples)
    # Typically ~10 ms; the bound leaves room for a loaded 2-core machine.
    assert took < 0.5, f"rendering 10,000 next fires took {took:.3f}s"


def test_the_scrape_time_gauges_read_back_in_both_formats_whatever_the_job_code_holds() -> None:
    """pgcrond writes these gauges itself: a code's quotes and backslashes are escaped."""
    code = 'we"ird\\code'
    metrics = Metrics()
    metrics.set_jobs([code, "plain"], {code: timedelta(hours=1), "plain": None})
    metrics.alerts.recorded(code, "success", final=True)
    tick = datetime(2026, 12, 4, tzinfo=UTC)
    metrics.next_fires.follow(lambda: [([code, "plain"], tick)])
    expected = {
        ("pgcrond_job_consecutive_failures", code): 0.0,
        ("pgcrond_job_consecutive_failures", "plain"): 0.0,
        ("pgcrond_job_stale", code): 0.0,
        ("pgcrond_next_fire_timestamp_seconds", code): tick.timestamp(),
        ("pgcrond_next_fire_timestamp_seconds", "plain"): tick.timestamp(),
    }
    names = {name for name, _ in expected} | {"pgcrond_job_last_success_timestamp_seconds"}
    for accept, parse in [
        ("text/plain", text_string_to_metric_families),
        ("application/openmetrics-text;version=1.0.0", openmetrics_families),
    ]:
        render, _ = exposition(metrics.registry, accept)
        found = {
            (sample.name, sample.labels["cronjob"]): sample.value
            for family in parse(render().decode())
            for sample in family.samples
            if sample.name in names
        }
        assert found.pop(("pgcrond_job_last_success_timestamp_seconds", code)) > 0, accept
        assert expected == found, accept
