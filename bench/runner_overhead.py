"""Per-run overhead of the runner.

``python bench/runner_overhead.py [--runs 200]``

Spawn-to-exit of ``/bin/true`` through ``execute()`` against a bare
``asyncio.create_subprocess_exec`` in the same process, alternated run by run so
that machine load hits both sides alike; then no-op sync and async entrypoints
in process, and a no-op isolated entrypoint (one Python start per run, so fewer
runs). The runner's line is with each attempt in a cgroup of its own where this
machine can make one; the line after it, alternated with it, without
(``cgroups: never``): the difference is what a job's box costs. Alternated
with them too, the programs the runner execs before the job, spawned bare
(no pipes, no attempt): ``setpriv`` setting the death signal, and in a
cgroup the ``/bin/sh`` that joins it first: what of the runner's cost is
those execs, and what is the runner's own.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import time
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime

from pgcrond.core.actions import Action, CommandAction, EntrypointAction
from pgcrond.core.box import Box
from pgcrond.core.cancel import Cancellation
from pgcrond.run import box
from pgcrond.run.attempt import RunRequest
from pgcrond.run.command import _dying_with_daemon
from pgcrond.run.context import RunContext
from pgcrond.run.runner import execute

# The script's directory is on sys.path, and the isolated child is given the
# same path, so the no-ops resolve in both.
MODULE = "runner_overhead"


def noop(ctx: RunContext) -> None:
    pass


async def noop_async(ctx: RunContext) -> None:
    pass


def request(action: Action) -> RunRequest:
    return RunRequest(
        job="bench",
        action=action,
        run_key="2026-03-29T01:30:00Z",
        fire_time=datetime(2026, 3, 29, 1, 30, tzinfo=UTC),
        attempt=1,
        idempotency_key="v2:bench",
        idempotency_key_hex="0" * 64,
        fencing_token=None,
    )


def runner_call(action: Action) -> Callable[[], Awaitable[None]]:
    run_request = request(action)

    async def call() -> None:
        result = await execute(run_request, Cancellation())
        assert result.outcome == "success", result

    return call


async def bare_true() -> None:
    process = await asyncio.create_subprocess_exec("/bin/true")
    assert await process.wait() == 0


async def chain_true() -> None:
    """``/bin/true`` through what the runner execs before it, in the configured box mode."""
    cell = box.Cell("bench", Box())
    argv = cell.enter(_dying_with_daemon(["/bin/true"], dict(os.environ)))
    process = await asyncio.create_subprocess_exec(*argv, start_new_session=True)
    assert await process.wait() == 0
    await cell.close()


async def timed(call: Callable[[], Awaitable[None]]) -> float:
    started = time.perf_counter()
    await call()
    return (time.perf_counter() - started) * 1000


def summary(name: str, samples: list[float]) -> str:
    ordered = sorted(samples)
    p90 = ordered[int(len(ordered) * 0.9) - 1]
    return (
        f"{name:<34} median {statistics.median(ordered):8.3f} ms"
        f"   p90 {p90:8.3f} ms   (n={len(ordered)})"
    )


async def main(runs: int, isolated_runs: int) -> None:
    via_runner = runner_call(CommandAction(("/bin/true",)))
    baseline: list[float] = []
    runner: list[float] = []
    unboxed: list[float] = []
    chain_boxed: list[float] = []
    chain: list[float] = []
    boxed_by = box.configure("auto").mode
    for _ in range(runs):
        baseline.append(await timed(bare_true))
        box.configure("auto")
        runner.append(await timed(via_runner))
        chain_boxed.append(await timed(chain_true))
        box.configure("never")
        unboxed.append(await timed(via_runner))
        chain.append(await timed(chain_true))
    box.configure("auto")
    sync_noop = runner_call(EntrypointAction(f"{MODULE}:noop"))
    async_noop = runner_call(EntrypointAction(f"{MODULE}:noop_async"))
    isolated_noop = runner_call(EntrypointAction(f"{MODULE}:noop", isolate=True))
    sync_samples = [await timed(sync_noop) for _ in range(runs)]
    async_samples = [await timed(async_noop) for _ in range(runs)]
    isolated_samples = [await timed(isolated_noop) for _ in range(isolated_runs)]

    print(summary("/bin/true, bare create_subprocess", baseline))
    print(summary(f"/bin/true via execute(), {boxed_by}", runner))
    ratio = statistics.median(runner) / statistics.median(baseline)
    extra = statistics.median(runner) - statistics.median(baseline)
    print(f"{'':<34} runner / bare: {ratio:.2f}x the median (+{extra:.3f} ms)")
    print(summary("/bin/true via execute(), no cgroup", unboxed))
    extra = statistics.median(runner) - statistics.median(unboxed)
    print(f"{'':<34} the box costs +{extra:.3f} ms of the median")
    print(summary(f"its execs alone, {boxed_by}", chain_boxed))
    print(summary("its execs alone, no cgroup", chain))
    extra = statistics.median(unboxed) - statistics.median(chain)
    print(f"{'':<34} the runner's own: +{extra:.3f} ms of the median (no cgroup)")
    print(summary("sync entrypoint no-op (thread)", sync_samples))
    print(summary("async entrypoint no-op (loop)", async_samples))
    print(summary("isolated entrypoint no-op (child)", isolated_samples))


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--runs", type=int, default=200)
    parser.add_argument("--isolated-runs", type=int, default=30)
    args = parser.parse_args()
    asyncio.run(main(args.runs, args.isolated_runs))
