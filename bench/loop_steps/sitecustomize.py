"""A bench-only instrument (``bench.scale --steps``): how long each step of the loop held it.

Python runs a ``sitecustomize`` module found on ``PYTHONPATH`` at start-up;
``bench.scale --steps`` puts this directory there for its replicas (and
``BENCH_LOOP_STEPS`` names where to write). Each callback the event loop
runs (a task's step, a timer, a reader) is timed, and so is each loop turn
outside ``select()`` (all the callbacks it ran, plus its own bookkeeping).
Steps of 2 ms or more (with the loop thread's CPU time in them) and turns of
10 ms or more are written, with the wall time they ended, one JSON object
per line to ``steps-<pid>.jsonl``.

The daemon's own stall probe measures the longest turn: while a tick
saturates the loop that is every callback the turn ran, not any one step.
This tells the two apart. It costs two clock reads per callback, so it is
off unless asked for.
"""

from __future__ import annotations

import asyncio.base_events
import asyncio.events
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

STEP_S = 0.002
TURN_S = 0.010


def _name(callback: Any) -> str:
    """A task's coroutine name, or the callback's own."""
    owner = getattr(callback, "__self__", None)
    get_coro = getattr(owner, "get_coro", None)
    if get_coro is not None:
        coro = get_coro()
        return "task " + getattr(coro, "__qualname__", type(coro).__name__)
    return getattr(callback, "__qualname__", type(callback).__name__)


def _install(out: Path) -> None:
    sink = out.open("a", buffering=1)
    run_handle = asyncio.events.Handle._run
    run_once = asyncio.base_events.BaseEventLoop._run_once  # type: ignore[attr-defined]
    clock = time.perf_counter
    # The loop thread's own CPU: a step's wall time also counts the time the
    # machine gave the CPU to another process (three replicas and PostgreSQL
    # on two cores).
    cpu_clock = time.thread_time
    in_select = [0.0]
    handles = [0.0, 0]

    def timed_run(self: asyncio.events.Handle) -> None:
        began, cpu = clock(), cpu_clock()
        run_handle(self)
        took = clock() - began
        handles[0] += took
        handles[1] += 1
        if took >= STEP_S:
            what = _name(self._callback)  # type: ignore[attr-defined]
            cpu_ms = (cpu_clock() - cpu) * 1000
            said = {"at": time.time(), "step_ms": took * 1000, "cpu_ms": cpu_ms, "what": what}
            sink.write(json.dumps(said) + "\n")

    def timed_run_once(self: asyncio.base_events.BaseEventLoop) -> None:
        selector = self._selector  # type: ignore[attr-defined]
        if not getattr(selector, "_bench_timed", False):
            select = selector.select

            def timed_select(timeout: float | None = None) -> Any:
                began = clock()
                try:
                    return select(timeout)
                finally:
                    in_select[0] += clock() - began

            selector.select = timed_select
            selector._bench_timed = True
        in_select[0] = 0.0
        handles[0], handles[1] = 0.0, 0
        began = clock()
        run_once(self)
        held = clock() - began - in_select[0]
        if held >= TURN_S:
            sink.write(
                json.dumps(
                    {
                        "at": time.time(),
                        "turn_ms": held * 1000,
                        "callbacks": handles[1],
                        "callbacks_ms": handles[0] * 1000,
                    }
                )
                + "\n"
            )

    asyncio.events.Handle._run = timed_run  # type: ignore[method-assign]
    asyncio.base_events.BaseEventLoop._run_once = timed_run_once  # type: ignore[attr-defined]


_where = os.environ.get("BENCH_LOOP_STEPS")
if _where and "pgcrond" in " ".join(sys.argv):
    _install(Path(_where) / f"steps-{os.getpid()}.jsonl")
