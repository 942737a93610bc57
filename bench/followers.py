"""Followed ticks: what a tick lost to another replica costs while it is followed.

    .venv/bin/python -m bench.followers [--ticks 10000]

No database: the in-memory guard answers every first claim "held" (another
replica runs the tick, its lease lapses in 2 s) and every re-check "done",
as a replica that lost a big tick sees it. Prints the memory held per
followed tick while its fire sleeps (tracemalloc), the loop time of the wave
in which the followers wake and claim again, and of a shutdown that ends a
second set of sleeping followers.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import tempfile
import time
import tracemalloc
from collections import deque
from datetime import UTC, datetime, timedelta
from pathlib import Path

import structlog

from pgcrond.config.loader import load_config
from pgcrond.config.models import JobConfig
from pgcrond.core.keys import Identity
from pgcrond.fire import Fire, Firing
from pgcrond.guard.base import Refused
from pgcrond.guard.memory import MemoryGuard

RECHECK_IN = timedelta(seconds=2)


def followed_job(workdir: Path) -> JobConfig:
    path = workdir / "jobs.yaml"
    path.write_text(
        "database: {url: 'postgresql://unused@127.0.0.1/x'}\n"
        "jobs:\n  followed: {cron: '* * * * *', entrypoint: 'bench.jobs:async_noop'}\n"
    )
    return load_config([path]).jobs["followed"]


def stop_firing(firing: Firing) -> None:
    """Shutdown as the daemon does it, whichever fire.py this runs on."""
    stop = getattr(firing, "stop", None)
    if stop is not None:
        stop()
    else:
        firing.stopping.set()


async def wave(job: JobConfig, ticks: int, *, by_stop: bool) -> tuple[float, float]:
    """(KiB held per sleeping follower, seconds of loop time for their wake wave)."""
    identities = [Identity.schedule("followed", f"t{n}") for n in range(ticks)]
    script: deque[str | Refused] = deque(
        Refused(i, "held", "RUNNING", wait=RECHECK_IN) for i in identities
    )
    script.extend(Refused(i, "done", "SUCCESS") for i in identities)
    guard = MemoryGuard(script=script)
    firing = Firing(guards=lambda _: guard, replica="bench:1")
    tick = datetime.now(UTC)
    tracemalloc.start()
    before = tracemalloc.get_traced_memory()[0]
    fires = [asyncio.create_task(firing.fire(Fire(job, tick, i))) for i in identities]
    while len(guard.script) > ticks:
        await asyncio.sleep(0.01)
    await asyncio.sleep(0.05)
    held = tracemalloc.get_traced_memory()[0] - before
    tracemalloc.stop()
    if by_stop:
        started = time.process_time()
        stop_firing(firing)
    else:
        await asyncio.sleep(RECHECK_IN.total_seconds() - 0.3)
        started = time.process_time()
    await asyncio.gather(*fires)
    return held / ticks / 1024, time.process_time() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--ticks", type=int, default=10000)
    args = parser.parse_args()
    # As a replica at its default level: a lost claim's debug line is not written.
    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(logging.INFO))
    with tempfile.TemporaryDirectory() as scratch:
        job = followed_job(Path(scratch))
        per, woke = asyncio.run(wave(job, args.ticks, by_stop=False))
        _, stopped = asyncio.run(wave(job, args.ticks, by_stop=True))
    print(
        json.dumps(
            {
                "followed_ticks": args.ticks,
                "kib_per_sleeping_follower": round(per, 2),
                "recheck_wave_cpu_s": round(woke, 3),
                "shutdown_wave_cpu_s": round(stopped, 3),
            }
        )
    )


if __name__ == "__main__":
    main()
