"""Work on the event loop that grows with the job count: a /metrics scrape, the scan's plan.

    .venv/bin/python -m bench.loop_work [--jobs 2000]

No database. Prints, for ``--jobs`` per-minute jobs: the size of a /metrics
body and the longest stall of the daemon's loop while one scrape is served
(the same HTTP server, in-process, on loopback); and the schedule
evaluations and time of one job's catch-up plan after a day's and a week's
gap (window 7 days, row cap 1,000).
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import tempfile
import time
import urllib.request
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any
from zoneinfo import ZoneInfo

from pgcrond.catchup import plan_job
from pgcrond.config.loader import load_config
from pgcrond.core.schedule import CronSchedule, Occasion
from pgcrond.daemon.http import HealthServer
from pgcrond.daemon.metrics import Metrics


async def scrape_stall(jobs: int) -> tuple[int, float]:
    metrics = Metrics()
    codes = [f"job-{n}" for n in range(jobs)]
    metrics.set_jobs(codes)
    for code in codes:
        metrics.last_duration.labels(code).set(1.0)
        metrics.takeovers.labels(code).inc()

    async def ready() -> bool:
        return True

    server = HealthServer(
        "127.0.0.1:0", health=lambda: True, ready=ready, registry=metrics.registry
    )
    await server.start()
    worst = 0.0
    done = asyncio.Event()

    async def probe() -> None:
        nonlocal worst
        last = time.monotonic()
        while not done.is_set():
            await asyncio.sleep(0.001)
            now = time.monotonic()
            worst, last = max(worst, now - last), now

    task = asyncio.create_task(probe())
    url = f"http://127.0.0.1:{server.port}/metrics"
    body = await asyncio.to_thread(lambda: urllib.request.urlopen(url, timeout=120).read())
    done.set()
    await task
    await server.stop()
    return len(body), worst


class Counting:
    def __init__(self, schedule: CronSchedule) -> None:
        self.schedule, self.calls = schedule, 0

    def next_after(self, t: datetime) -> datetime | None:
        self.calls += 1
        return self.schedule.next_after(t)

    def occasion_after(self, t: datetime) -> Occasion | None:
        self.calls += 1
        return self.schedule.occasion_after(t)

    def describe(self) -> str:
        return self.schedule.describe()

    def definition(self) -> dict[str, Any]:
        return self.schedule.definition()


def plan_cost(gap: timedelta) -> tuple[int, float]:
    with tempfile.TemporaryDirectory() as directory:
        path = Path(directory) / "jobs.yaml"
        path.write_text(
            "database: {url: 'postgresql://unused@127.0.0.1/x'}\n"
            "jobs:\n  job: {cron: '* * * * *', command: ['true']}\n"
        )
        job = load_config([path]).jobs["job"]
    counting = Counting(CronSchedule.parse("* * * * *", ZoneInfo("UTC")))
    job = dataclasses.replace(job, schedule=counting)
    now = datetime.now(UTC)
    started = time.perf_counter()
    plan_job(job, now - gap, now, window=timedelta(days=7))
    return counting.calls, time.perf_counter() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=2000)
    args = parser.parse_args()
    size, stall = asyncio.run(scrape_stall(args.jobs))
    print(f"/metrics at {args.jobs} jobs: {size / 1e6:.1f} MB, loop stalled {stall * 1000:.0f} ms")
    for gap in (timedelta(days=1), timedelta(days=7)):
        calls, took = plan_cost(gap)
        print(f"plan of one per-minute job after {gap}: {calls} evaluations, {took * 1000:.1f} ms")


if __name__ == "__main__":
    main()
