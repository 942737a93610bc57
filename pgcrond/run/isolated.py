"""``isolate: true`` entrypoints: the executor, and the child-process host it starts.

``python -P -m pgcrond.run.isolated --result-fd N --sys-path JSON TARGET``

The executor (:func:`run`) starts this module in a process group of its own,
exactly like a command (:func:`pgcrond.run.command.run_process`),
so a stuck entrypoint can be killed. The run context arrives as the ``PGCRON_*``
environment variables; SIGTERM (the first step of the stop sequence) sets the
run's Cancellation so cooperative code can stop before SIGKILL. When the
entrypoint raises, ``ExcType: message`` is written to the result pipe so the
runner can report it like an in-process failure.
"""

from __future__ import annotations

import argparse
import asyncio
import inspect
import json
import os
import signal
import sys
import traceback
from collections.abc import Awaitable
from pathlib import Path
from typing import Any

from pgcrond import logs
from pgcrond.core.actions import EntrypointAction
from pgcrond.core.cancel import Cancellation
from pgcrond.core.entrypoints import resolve
from pgcrond.run.attempt import Attempt, Ending, describe
from pgcrond.run.command import run_process
from pgcrond.run.context import RunContext

FAILURE_EXIT = 1
TERMINATED = "terminated"
_READ_CHUNK = 64 * 1024


async def run(action: EntrypointAction, attempt: Attempt) -> Ending:
    """The executor of ``entrypoint:`` with ``isolate: true``: this module as a child."""
    read_end, write_end = os.pipe()
    # -P: `-m` would put the working directory first on sys.path, and the
    # host would import a `json.py` planted there (as whoever pgcrond runs as)
    # before its first line; the job's own path is set from --sys-path.
    argv = [
        sys.executable,
        "-P",
        "-m",
        "pgcrond.run.isolated",
        "--result-fd",
        str(write_end),
        "--sys-path",
        json.dumps(sys.path),
        action.target,
    ]
    try:
        ending = await run_process(argv, attempt, hand_over=write_end)
        error = _read_available(read_end)
    finally:
        os.close(read_end)
    if ending.outcome == "fail" and error:
        return Ending("fail", error, ending.exit_code)
    return ending


def _read_available(fd: int) -> str:
    # Non-blocking: a grandchild that inherited the write end must not stall us.
    os.set_blocking(fd, False)
    chunks = []
    while True:
        try:
            chunk = os.read(fd, _READ_CHUNK)
        except BlockingIOError:
            break
        if not chunk:
            break
        chunks.append(chunk)
    return b"".join(chunks).decode("utf-8", "replace")


# -- the child ------------------------------------------------------------------


async def _await(awaitable: Awaitable[Any], cancellation: Cancellation) -> None:
    # On the loop, SIGTERM must wake asyncio waiters through the loop itself.
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, cancellation.cancel, TERMINATED)
    await awaitable


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m pgcrond.run.isolated")
    parser.add_argument("--result-fd", type=int, required=True)
    parser.add_argument("--sys-path", required=True)
    parser.add_argument("target")
    args = parser.parse_args(argv)
    # The daemon validated the target against its own import path; resolve it
    # against the same one, not the one `-m` derives from the working directory.
    sys.path[:] = json.loads(args.sys_path)
    cancellation = Cancellation()
    signal.signal(signal.SIGTERM, lambda _signum, _frame: cancellation.cancel(TERMINATED))
    logs.configure("json")
    try:
        function = resolve(args.target)
        context = RunContext.from_environ(os.environ, cancellation, cwd=Path.cwd())
        result = function(context)
        if inspect.isawaitable(result):
            asyncio.run(_await(result, cancellation))
    except BaseException as exc:
        traceback.print_exc()
        with os.fdopen(args.result_fd, "w", encoding="utf-8") as result_pipe:
            result_pipe.write(describe(exc))
        return FAILURE_EXIT
    return 0


if __name__ == "__main__":
    sys.exit(main())
