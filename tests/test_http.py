"""The health server: probe status codes follow the callbacks; /metrics is Prometheus text."""

from __future__ import annotations

import asyncio
import gzip
import math
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from contextlib import asynccontextmanager

import httpx
import pytest
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.metrics_core import Metric
from prometheus_client.openmetrics.parser import (
    text_string_to_metric_families as openmetrics_families,
)
from prometheus_client.parser import text_string_to_metric_families

import pgcrond
from pgcrond.daemon import http
from pgcrond.daemon.http import HealthServer, parse_listen
from pgcrond.daemon.metrics import Metrics
from pgcrond.errors import DatabaseUnavailable, ValidationError
from pgcrond.storage.db import Database
from pgcrond.storage.embedded import LocalServer
from tests.helpers.daemon_harness import until
from tests.helpers.http import fetch


async def always(value: bool) -> bool:
    return value


@asynccontextmanager
async def serving(
    *,
    health: Callable[[], bool] = lambda: True,
    ready: Callable[[], Awaitable[bool]] = lambda: always(True),
    metrics: Metrics | None = None,
    ready_timeout: float = 2.0,
) -> AsyncIterator[HealthServer]:
    server = HealthServer(
        "127.0.0.1:0",
        health=health,
        ready=ready,
        registry=(metrics or Metrics()).registry,
        ready_timeout=ready_timeout,
    )
    await server.start()
    try:
        yield server
    finally:
        await server.stop()


@pytest.mark.parametrize(
    ("listen", "expected"),
    [
        ("127.0.0.1:9464", ("127.0.0.1", 9464)),
        ("[::1]:9464", ("::1", 9464)),
        (":9464", (None, 9464)),
        ("localhost:0", ("localhost", 0)),
    ],
)
def test_listen_addresses_are_parsed(listen: str, expected: tuple[str | None, int]) -> None:
    assert expected == parse_listen(listen)


@pytest.mark.parametrize("listen", ["9464", "host:", "host:http", "::1:9464", "h:70000"])
def test_bad_listen_addresses_are_rejected_naming_the_field(listen: str) -> None:
    with pytest.raises(ValidationError, match=r"http\.listen"):
        parse_listen(listen)


async def test_healthz_follows_the_health_callback() -> None:
    healthy = True
    async with serving(health=lambda: healthy) as server:
        assert (200, b"ok\n") == (await fetch(server.port, "/healthz"))[::2]
        healthy = False
        assert 503 == (await fetch(server.port, "/healthz"))[0]


async def test_readyz_follows_the_ready_callback_and_a_raising_check_is_not_ready() -> None:
    answer: bool | Exception = True

    async def ready() -> bool:
        if isinstance(answer, Exception):
            raise answer
        return answer

    async with serving(ready=ready) as server:
        assert 200 == (await fetch(server.port, "/readyz"))[0]
        answer = False
        assert 503 == (await fetch(server.port, "/readyz"))[0]
        answer = DatabaseUnavailable("down")
        assert 503 == (await fetch(server.port, "/readyz"))[0]


async def test_a_ready_check_slower_than_its_timeout_answers_503_in_time() -> None:
    async def hang() -> bool:
        await asyncio.sleep(30)
        return True

    async with serving(ready=hang, ready_timeout=0.2) as server:
        status, _, body = await asyncio.wait_for(fetch(server.port, "/readyz"), 2)
        assert (503, b"not ready\n") == (status, body)


async def test_metrics_show_a_counter_after_it_is_incremented() -> None:
    metrics = Metrics()
    async with serving(metrics=metrics) as server:
        metrics.runs.labels(cronjob="nightly", outcome="success").inc()
        metrics.runs.labels(cronjob="nightly", outcome="success").inc()
        status, headers, body = await fetch(server.port, "/metrics")
    assert 200 == status
    assert headers["Content-Type"].startswith("text/plain; version=")
    families = {family.name: family for family in text_string_to_metric_families(body.decode())}
    samples = {
        (sample.name, tuple(sorted(sample.labels.items()))): sample.value
        for sample in families["pgcrond_runs"].samples
    }
    assert 2.0 == samples[("pgcrond_runs_total", (("cronjob", "nightly"), ("outcome", "success")))]


async def test_unknown_paths_are_404_and_other_methods_405() -> None:
    async with serving() as server:
        assert 404 == (await fetch(server.port, "/"))[0]
        assert 404 == (await fetch(server.port, "/health"))[0]
        status, headers, _ = await fetch(server.port, "/metrics", method="POST")
        assert (405, "GET, HEAD") == (status, headers["Allow"])
        assert 405 == (await fetch(server.port, "/healthz", method="DELETE"))[0]
        status, headers, body = await fetch(server.port, "/healthz", method="HEAD")
        assert (200, "3", b"") == (status, headers["Content-Length"], body)
        assert 200 == (await fetch(server.port, "/readyz?verbose=1"))[0]


async def test_garbage_is_answered_400_and_the_server_keeps_serving() -> None:
    async with serving() as server:
        reader, writer = await asyncio.open_connection("127.0.0.1", server.port)
        writer.write(b"hello\r\n\r\n")
        status_line = (await reader.read()).split(b"\r\n", 1)[0]
        assert b"400" == status_line.split()[1]
        writer.close()
        assert 200 == (await fetch(server.port, "/healthz"))[0]


async def _until(port: int, expected: int, within: float) -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + within
    while (status := (await fetch(port, "/readyz"))[0]) != expected:
        assert loop.time() < deadline, f"/readyz still {status}, expected {expected}"
        await asyncio.sleep(0.1)


async def test_readyz_turns_unready_while_the_database_is_down_and_recovers(
    own_server: LocalServer,
) -> None:
    db = Database(own_server.dsn, timeout=1.0)
    await db.open()

    async def ready() -> bool:
        return await db.fetchone("SELECT 1 AS ok") == {"ok": 1}

    try:
        async with serving(ready=ready, ready_timeout=1.5) as server:
            await _until(server.port, 200, within=10)
            # stop() blocks until the server is down; off the loop, so probes keep being served.
            await asyncio.to_thread(own_server.stop)
            await _until(server.port, 503, within=10)
            await asyncio.to_thread(own_server.start)
            await _until(server.port, 200, within=20)
    finally:
        await db.close()


def families_of(body: bytes, content_type: str) -> dict[str, Metric]:
    """Parse the exposition with prometheus_client's own parser for its format."""
    if content_type.startswith("application/openmetrics-text"):
        return {f.name: f for f in openmetrics_families(body.decode())}  # type: ignore[no-untyped-call]
    return {f.name: f for f in text_string_to_metric_families(body.decode())}


async def scrape(port: int) -> dict[str, Metric]:
    status, headers, body = await fetch(port, "/metrics")
    assert 200 == status
    return families_of(body, headers["Content-Type"])


async def test_metrics_have_no_created_series_and_carry_build_and_process_metrics() -> None:
    metrics = Metrics()
    metrics.runs.labels(cronjob="nightly", outcome="success").inc()
    metrics.run_duration.observe(0.2)
    async with serving(metrics=metrics) as server:
        status, headers, body = await fetch(server.port, "/metrics")
    assert 200 == status
    families = families_of(body, headers["Content-Type"])
    sample_names = {s.name for f in families.values() for s in f.samples}
    assert [] == sorted(name for name in sample_names if name.endswith("_created"))
    build = [s for f in families.values() for s in f.samples if s.name == "pgcrond_build_info"]
    assert [({"version": pgcrond.__version__}, 1.0)] == [(s.labels, s.value) for s in build]
    # Linux: the process collector reads /proc/self.
    assert {
        "process_cpu_seconds_total",
        "process_resident_memory_bytes",
        "process_open_fds",
        "process_start_time_seconds",
    } <= sample_names
    assert "python_info" in sample_names


async def test_per_job_series_exist_at_zero_before_any_event_and_follow_a_reload(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Every scrape a fresh render: a first render slower than FRESH_RENDER_S
    # (a loaded machine) would answer the second scrape with the first.
    monkeypatch.setattr(http, "FRESH_RENDER_S", math.inf)
    metrics = Metrics()
    metrics.set_jobs(["nightly", "cache-warm"])
    metrics.skips.labels("cache-warm", "overlap").inc()
    async with serving(metrics=metrics) as server:
        families = await scrape(server.port)
        metrics.set_jobs(["nightly", "hourly"])
        after = await scrape(server.port)

    def series(fams: dict[str, Metric], sample: str) -> dict[tuple[tuple[str, str], ...], float]:
        return {
            tuple(sorted(s.labels.items())): s.value
            for f in fams.values()
            for s in f.samples
            if s.name == sample
        }

    assert {
        (("cronjob", job), ("outcome", outcome)): 0.0
        for job in ("nightly", "cache-warm")
        for outcome in ("success", "fail", "timeout", "cancelled")
    } == series(families, "pgcrond_runs_total")
    assert {(("cronjob", "nightly"),): 0.0, (("cronjob", "cache-warm"),): 0.0} == series(
        families, "pgcrond_fires_total"
    )
    # Runs in progress and the histograms are the replica's: no series per job.
    assert {(): 0.0} == series(families, "pgcrond_running_jobs")
    assert {(): 0.0} == series(families, "pgcrond_run_duration_seconds_count")
    # A job's last duration comes with its first run.
    assert {} == series(families, "pgcrond_job_last_run_duration_seconds")
    # After the reload: the removed job's series are gone (reasons too), the new one's exist.
    assert {(("cronjob", "nightly"),): 0.0, (("cronjob", "hourly"),): 0.0} == series(
        after, "pgcrond_fires_total"
    )
    assert {} == series(after, "pgcrond_skips_total")
    # No made-up "last success at 1970": that series appears with the first success.
    assert {} == series(after, "pgcrond_job_last_success_timestamp_seconds")
    # Consecutive failures are there from the start, at 0, for exactly the jobs.
    assert {(("cronjob", "nightly"),): 0.0, (("cronjob", "hourly"),): 0.0} == series(
        after, "pgcrond_job_consecutive_failures"
    )
    assert {"nightly", "hourly"} == {
        dict(labels)["cronjob"] for labels in series(after, "pgcrond_runs_total")
    }


async def fetch_accepting(
    port: int, accept: str, encoding: str | None = None
) -> tuple[int, httpx.Headers, bytes]:
    asked = {} if encoding is None else {"Accept-Encoding": encoding}
    return await fetch(port, "/metrics", accept=accept, headers=asked)


# What Prometheus 2.x and 3.x send by default, and a plain client.
PROMETHEUS_ACCEPT = (
    "application/openmetrics-text;version=1.0.0,application/openmetrics-text;version=0.0.1;"
    "q=0.75,text/plain;version=0.0.4;q=0.5,*/*;q=0.1"
)


@pytest.mark.parametrize(
    ("accept", "expected_type"),
    [
        (PROMETHEUS_ACCEPT, "application/openmetrics-text; version=1.0.0; charset=utf-8"),
        ("text/plain", "text/plain; version=0.0.4; charset=utf-8"),
        ("*/*", "text/plain; version=0.0.4; charset=utf-8"),
    ],
)
async def test_metrics_format_is_negotiated_by_prometheus_clients_encoder(
    accept: str, expected_type: str
) -> None:
    metrics = Metrics()
    metrics.set_jobs(["nightly"])
    metrics.runs.labels("nightly", "fail").inc()
    async with serving(metrics=metrics) as server:
        status, headers, body = await fetch_accepting(server.port, accept)
    assert 200 == status
    assert headers["Content-Type"].startswith(expected_type)
    assert expected_type.startswith("application/openmetrics") == body.endswith(b"# EOF\n")
    families = families_of(body, headers["Content-Type"])
    runs = {
        s.labels["outcome"]: s.value
        for s in families["pgcrond_runs"].samples
        if s.name == "pgcrond_runs_total" and s.labels["cronjob"] == "nightly"
    }
    assert {"success": 0.0, "fail": 1.0, "timeout": 0.0, "cancelled": 0.0} == runs


class _SlowCollector:
    """A collector whose render takes ``seconds`` and shows how many renders began."""

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds
        self.renders = 0

    def collect(self) -> Iterator[Metric]:
        self.renders += 1
        family = GaugeMetricFamily("slow_renders", "Renders begun.")
        family.add_metric([], self.renders)
        time.sleep(self.seconds)
        yield family

    def describe(self) -> Iterator[Metric]:
        return iter(())


def _renders_shown(body: bytes, content_type: str) -> float:
    return families_of(body, content_type)["slow_renders"].samples[0].value


async def test_a_slow_render_is_answered_with_the_last_one_and_refreshed_behind() -> None:
    metrics = Metrics()
    slow = _SlowCollector(seconds=0.3)
    metrics.registry.register(slow)
    async with serving(metrics=metrics) as server:
        _, headers, first = await fetch(server.port, "/metrics")  # no render yet: waits
        started = time.monotonic()
        _, _, second = await fetch(server.port, "/metrics")
        waited = time.monotonic() - started
        await until(lambda: slow.renders >= 2 and not server._renders, 5, "the refresh")
        _, _, third = await fetch(server.port, "/metrics")
    kind = headers["Content-Type"]
    assert (1.0, 1.0, 2.0) == tuple(_renders_shown(b, kind) for b in (first, second, third))
    assert waited < slow.seconds, f"the second scrape waited {waited:.3f}s for a render"


async def test_a_fast_render_is_always_fresh(monkeypatch: pytest.MonkeyPatch) -> None:
    # "Fast" as the server judges it, however loaded the machine running the test.
    monkeypatch.setattr(http, "FRESH_RENDER_S", 5.0)
    metrics = Metrics()
    fast = _SlowCollector(seconds=0.0)
    metrics.registry.register(fast)
    async with serving(metrics=metrics) as server:
        shown = []
        for _ in range(3):
            _, headers, body = await fetch(server.port, "/metrics")
            shown.append(_renders_shown(body, headers["Content-Type"]))
    assert [1.0, 2.0, 3.0] == shown


async def test_while_a_big_tick_is_in_flight_a_scrape_takes_the_last_render_and_starts_none(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # However fast a render is judged, a busy replica answers with the last one.
    monkeypatch.setattr(http, "FRESH_RENDER_S", 5.0)
    metrics = Metrics()
    counted = _SlowCollector(seconds=0.0)
    metrics.registry.register(counted)
    busy = [False]
    server = HealthServer(
        "127.0.0.1:0",
        health=lambda: True,
        ready=lambda: always(True),
        registry=metrics.registry,
        busy=lambda: busy[0],
    )
    await server.start()
    try:
        shown = []
        for busy[0] in (False, True, True, False):
            _, headers, body = await fetch(server.port, "/metrics")
            shown.append(_renders_shown(body, headers["Content-Type"]))
    finally:
        await server.stop()
    # The two busy scrapes show the first render and start no other.
    assert [1.0, 1.0, 1.0, 2.0] == shown
    assert 2 == counted.renders


@pytest.mark.parametrize(
    ("accept_encoding", "gzipped"),
    [
        ("gzip", True),  # what Prometheus sends
        ("br, gzip;q=0.5", True),
        ("x-gzip", True),
        ("gzip;q=0", False),
        ("gzip; q=0.000", False),
        ("gzip;q=nonsense", False),
        ("identity", False),
        ("", False),
    ],
)
def test_gzip_is_served_when_the_scraper_accepts_it(accept_encoding: str, gzipped: bool) -> None:
    assert gzipped == http.accepts_gzip(accept_encoding)


async def test_a_scraper_that_accepts_gzip_gets_the_same_metrics_compressed() -> None:
    metrics = Metrics()
    metrics.set_jobs([f"job-{n}" for n in range(200)])
    metrics.runs.labels("job-7", "fail").inc()
    async with serving(metrics=metrics) as server:
        _, plain_headers, plain = await fetch_accepting(server.port, PROMETHEUS_ACCEPT)
        _, headers, body = await fetch_accepting(server.port, PROMETHEUS_ACCEPT, "gzip")
    assert "Content-Encoding" not in plain_headers
    assert ("gzip", "Accept-Encoding") == (headers["Content-Encoding"], headers["Vary"])
    assert len(body) * 5 < len(plain)
    kind = headers["Content-Type"]
    unzipped = families_of(gzip.decompress(body), kind)
    assert families_of(plain, kind).keys() == unzipped.keys()
    runs = unzipped["pgcrond_runs"].samples
    assert [1.0] == [
        s.value
        for s in runs
        if s.name == "pgcrond_runs_total" and s.labels == {"cronjob": "job-7", "outcome": "fail"}
    ]
