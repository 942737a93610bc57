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

``--part run`` measures, for the same jobs, the runner alone
(``pgcrond.run.runner.execute`` of each attempt, as the fire hands it on,
without its log lines): what a run costs whatever carries it from claim to
record, so ``fire − run`` bounds what any reshaping of the fire's own steps
(one task per chunk of a tick, say) could save per run.
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
from pgcrond.core.cancel import Cancellation
from pgcrond.core.keys import Identity
from pgcrond.core.schedule import run_key_for
from pgcrond.daemon import interpreter
from pgcrond.decide import FireOutcome
from pgcrond.fire import Fire, Firing
from pgcrond.guard.memory import MemoryGuard
from pgcrond.run.attempt import RunRequest
from pgcrond.run.runner import execute


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
    runs: list[asyncio.Future[FireOutcome]] = []
    firing = Firing(
        guards=lambda _: guard,
        replica="bench:1",
        spawn=lambda _, carry: runs.append(asyncio.ensure_future(carry)),
    )
    tick = datetime.now(UTC).replace(microsecond=0)
    identities = [Identity.schedule(job.code, run_key_for(tick)) for job in jobs]
    # The collector as the daemon holds it while a big tick's runs are in flight.
    ticks = interpreter.BigTicks()
    began = time.process_time()
    ticks.tick(len(jobs))
    # The tick as the daemon hands it on: claimed together, each won claim a run.
    await firing.fire_tick(
        [Fire(job, tick, identity) for job, identity in zip(jobs, identities, strict=True)]
    )
    while len(runs) < len(jobs):
        await asyncio.sleep(0)  # the runs start on the wheel, a share a loop turn
    outcomes = await asyncio.gather(*runs)
    ticks.idle()
    spent = time.process_time() - began
    if set(outcomes) != {"success"}:
        raise SystemExit(f"not every fire succeeded: {sorted(set(outcomes))}")
    return spent


async def runs_alone(jobs: list[JobConfig]) -> float:
    """Process CPU seconds for the runner alone to run one attempt of each of ``jobs``."""
    tick = datetime.now(UTC).replace(microsecond=0)
    run_key = run_key_for(tick)
    requests = []
    for job in jobs:
        identity = Identity.schedule(job.code, run_key)
        requests.append(
            RunRequest(
                job=job.code,
                action=job.action,
                run_key=run_key,
                fire_time=tick,
                attempt=1,
                idempotency_key=identity.idempotency_key,
                idempotency_key_hex=identity.idempotency_key_hex,
                fencing_token=1,
                env=job.env,
                cwd=job.cwd,
                box=job.box,
                timeout=job.timeout,
            )
        )
    ticks = interpreter.BigTicks()
    began = time.process_time()
    ticks.tick(len(jobs))
    results = await asyncio.gather(*(execute(request, Cancellation()) for request in requests))
    ticks.idle()
    spent = time.process_time() - began
    if {result.outcome for result in results} != {"success"}:
        raise SystemExit("not every run succeeded")
    return spent


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--fires", type=int, default=3000)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument(
        "--part",
        choices=("fire", "run"),
        default="fire",
        help="fire: claim, run and record (default); run: the runner alone",
    )
    args = parser.parse_args()
    measure = one_round if args.part == "fire" else runs_alone
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
        best = min(asyncio.run(measure(jobs)) for _ in range(args.rounds))
    print(
        json.dumps(
            {
                "part": args.part,
                "fires": args.fires,
                "best_round_cpu_ms": round(best * 1000, 1),
                "cpu_per_fire_us": round(best / args.fires * 1e6, 1),
            }
        )
    )


if __name__ == "__main__":
    main()
