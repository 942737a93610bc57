"""A fire's own CPU: claim, run and record of an in-process no-op, with no database.

    .venv/bin/python -m bench.fire_path [--fires 3000] [--rounds 5]

The in-memory guard (``pgcrond/guard/memory.py``) answers every claim "won"
and every record "done" at once, so what is measured is pgcrond's own path
per fire: the fire's decisions, the runner, the attempt's output record and
the two JSON log lines a run says (written to /dev/null through the daemon's
own logging set-up), with the daemon's collector settings (held off while
the fires are in flight, as the daemon holds it for a big tick). ``--fires`` fires
of one tick go at once, as a co-firing tick's do; the figure is the best
round's process CPU divided by the fires (the least disturbed round on a
shared machine). Compare two trees side by side in one call, alternating
(``farm-bench --vs``, with ``PYTHONPATH`` naming the other tree).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path

from pgcrond import logs
from pgcrond.config.loader import load_config
from pgcrond.config.models import JobConfig
from pgcrond.core.keys import Identity
from pgcrond.core.schedule import run_key_for
from pgcrond.daemon import interpreter
from pgcrond.fire import Firing
from pgcrond.guard.memory import MemoryGuard


def co_firing_jobs(workdir: Path, count: int) -> list[JobConfig]:
    path = workdir / "jobs.yaml"
    path.write_text(
        "database: {url: 'postgresql://unused@127.0.0.1/x'}\njobs:\n"
        + "".join(
            f"  job-{n}: {{cron: '* * * * *', entrypoint: 'bench.jobs:async_noop', "
            "concurrency: allow}\n"
            for n in range(count)
        )
    )
    return list(load_config([path]).jobs.values())


async def one_round(jobs: list[JobConfig]) -> float:
    """Process CPU seconds for one tick of ``jobs``, every fire won and recorded."""
    guard = MemoryGuard()
    firing = Firing(guards=lambda _: guard, replica="bench:1")
    tick = datetime.now(UTC).replace(microsecond=0)
    identities = [Identity.schedule(job.code, run_key_for(tick)) for job in jobs]
    # The collector as the daemon holds it while a tick's fires are in flight.
    bursts = interpreter.Bursts()
    began = time.process_time()
    bursts.fires(len(jobs))
    outcomes = await asyncio.gather(
        *(firing.fire(job, tick, identity) for job, identity in zip(jobs, identities, strict=True))
    )
    bursts.fires(0)
    spent = time.process_time() - began
    if set(outcomes) != {"success"}:
        raise SystemExit(f"not every fire succeeded: {sorted(set(outcomes))}")
    return spent


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--fires", type=int, default=3000)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    # The daemon's log set-up, writing to /dev/null: each line is made in full.
    stderr = sys.stderr
    with open(os.devnull, "w") as sink:
        sys.stderr = sink
        try:
            logs.configure("json", "info")
        finally:
            sys.stderr = stderr
        with tempfile.TemporaryDirectory() as workdir:
            jobs = co_firing_jobs(Path(workdir), args.fires)
        interpreter.tune()
        interpreter.settle()
        best = min(asyncio.run(one_round(jobs)) for _ in range(args.rounds))
    print(
        json.dumps(
            {
                "fires": args.fires,
                "best_round_cpu_ms": round(best * 1000, 1),
                "cpu_per_fire_us": round(best / args.fires * 1e6, 1),
            }
        )
    )


if __name__ == "__main__":
    main()
