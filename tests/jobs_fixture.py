"""Sample entrypoints the runner tests execute (``tests.jobs_fixture:<name>``), and helpers.

In-process entrypoints report to the test through module state keyed by run
key (``STARTED``, ``RELEASE``, ``SEEN``); isolated ones run in another process
and report through files named in their job env (``OUT``).
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import subprocess
import sys
import threading
import time
from collections import defaultdict
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from pgcrond.core.actions import Action
from pgcrond.core.keys import Identity
from pgcrond.run.attempt import RunRequest
from pgcrond.run.context import RunContext

STARTED: defaultdict[str, threading.Event] = defaultdict(threading.Event)
RELEASE: defaultdict[str, threading.Event] = defaultdict(threading.Event)
SEEN: dict[str, str | None] = {}

# Bounds every wait here so a broken runner fails a test instead of hanging it.
_PATIENCE = 30.0


def _snapshot(ctx: RunContext) -> dict[str, object]:
    return {
        "job": ctx.job,
        "run_key": ctx.run_key,
        "fire_time": ctx.fire_time.isoformat(),
        "attempt": ctx.attempt,
        "idempotency_key": ctx.idempotency_key,
        "idempotency_key_hex": ctx.idempotency_key_hex,
        "fencing_token": ctx.fencing_token,
        "trigger": ctx.trigger,
        "deadline": None if ctx.deadline is None else ctx.deadline.isoformat(),
        "env": dict(ctx.env),
        "cwd": None if ctx.cwd is None else str(ctx.cwd),
        "pid": os.getpid(),
        "process_cwd": os.getcwd(),
        "process_attempt": os.environ.get("PGCRON_ATTEMPT"),
    }


def write_context(ctx: RunContext) -> None:
    ctx.log.info("context_seen")
    Path(ctx.env["OUT"]).write_text(json.dumps(_snapshot(ctx)))


async def write_context_async(ctx: RunContext) -> None:
    ctx.log.info("context_seen")
    await asyncio.to_thread(Path(ctx.env["OUT"]).write_text, json.dumps(_snapshot(ctx)))


def raise_value_error(ctx: RunContext) -> None:
    raise ValueError(ctx.env.get("MESSAGE", "boom"))


async def raise_value_error_async(ctx: RunContext) -> None:
    raise ValueError(ctx.env.get("MESSAGE", "boom"))


def exit_3(ctx: RunContext) -> None:
    sys.exit(3)


def wait_then_check(ctx: RunContext) -> None:
    """Cooperative: waits for the stop signal, then raises Cancelled like ctx.check() does."""
    STARTED[ctx.run_key].set()
    ctx.cancelled.wait_sync(_PATIENCE)
    SEEN[ctx.run_key] = ctx.cancelled.reason
    ctx.check()


def wait_then_return(ctx: RunContext) -> None:
    """Cooperative, but returns normally once stopped: still not a success."""
    STARTED[ctx.run_key].set()
    ctx.cancelled.wait_sync(_PATIENCE)
    SEEN[ctx.run_key] = ctx.cancelled.reason


async def wait_then_return_async(ctx: RunContext) -> None:
    STARTED[ctx.run_key].set()
    SEEN[ctx.run_key] = await ctx.cancelled.wait()


def ignore_cancel(ctx: RunContext) -> None:
    """Never looks at the signal: the runner can only abandon its thread."""
    STARTED[ctx.run_key].set()
    RELEASE[ctx.run_key].wait(_PATIENCE)


async def ignore_cancel_async(ctx: RunContext) -> None:
    STARTED[ctx.run_key].set()
    try:
        await asyncio.sleep(_PATIENCE)
    except asyncio.CancelledError:
        SEEN[ctx.run_key] = "task_cancelled"
        raise


def sleep_ignoring_cancel(ctx: RunContext) -> None:
    """For ``isolate: true``: only SIGKILL ends it."""
    Path(ctx.env["OUT"]).write_text(str(os.getpid()))
    time.sleep(_PATIENCE)


def wait_for_sigterm(ctx: RunContext) -> None:
    """For ``isolate: true``: SIGTERM sets the Cancellation, and it stops at once."""
    Path(ctx.env["OUT"]).write_text(str(os.getpid()))
    ctx.cancelled.wait_sync(_PATIENCE)
    ctx.check()


# -- helpers for the tests ----------------------------------------------------

RUN_KEY = "2026-03-29T01:30:00Z"
FIRE_TIME = datetime(2026, 3, 29, 1, 30, tzinfo=UTC)
DOCS = Path(__file__).resolve().parent.parent / "docs" / "jobs.md"


def make_request(action: Action, **overrides: Any) -> RunRequest:
    """A request for job ``report`` at :data:`RUN_KEY`, attempt 1, short stop grace."""
    run_key = overrides.pop("run_key", RUN_KEY)
    identity = Identity.schedule("report", run_key)
    fields: dict[str, Any] = {
        "job": "report",
        "action": action,
        "run_key": run_key,
        "fire_time": FIRE_TIME,
        "attempt": 1,
        "idempotency_key": identity.idempotency_key,
        "idempotency_key_hex": identity.idempotency_key_hex,
        "fencing_token": None,
        "stop_grace": timedelta(seconds=0.3),
    }
    fields.update(overrides)
    return RunRequest(**fields)


# Loads the config and runs its job "job" with pgcrond's own log set up, as the daemon does.
_LOGGED_RUN = """
import asyncio, sys
from pgcrond.config.loader import load_config
from pgcrond.core.cancel import Cancellation
from pgcrond.logs import configure
from pgcrond.run.runner import execute
from tests.jobs_fixture import make_request

configure(sys.argv[2])
job = load_config([sys.argv[1]]).jobs["job"]
request = make_request(job.action, env=job.env, box=job.box)
asyncio.run(execute(request, Cancellation()))
"""


def logged_run(config: Path, fmt: str = "json") -> subprocess.CompletedProcess[str]:
    """A process that runs ``config``'s job ``job`` once; its log (``fmt``) is its stderr."""
    done = subprocess.run(
        [sys.executable, "-c", _LOGGED_RUN, str(config), fmt],
        check=False,
        capture_output=True,
        text=True,
        timeout=30,
        env={**os.environ, "PYTHONPATH": str(Path(__file__).parent.parent)},
    )
    assert 0 == done.returncode, done.stderr
    return done


def poll(condition: Callable[[], bool], within: float) -> bool:
    """True once ``condition`` holds, False if it still does not after ``within`` seconds."""
    deadline = time.monotonic() + within
    while not condition():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.01)
    return True


async def wait_for_path(path: Path, within: float = 10.0) -> None:
    """Wait until a child process has created ``path`` (bounded; polled off the loop)."""
    if not await asyncio.to_thread(poll, path.exists, within):
        raise AssertionError(f"{path} did not appear within {within}s")


async def wait_for_line(path: Path, within: float = 10.0) -> str:
    """The line a child process writes to ``path``, once all of it is there.

    ``echo $$ > file`` creates the file before it writes the line: a reader
    that only waits for the file may find it empty (CI, under load).
    """

    def written() -> bool:
        return path.exists() and path.read_text().endswith("\n")

    if not await asyncio.to_thread(poll, written, within):
        raise AssertionError(f"no whole line in {path} within {within}s")
    return await asyncio.to_thread(path.read_text)


def _session_members(session: int) -> list[tuple[int, str]]:
    members = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            text = stat.read_text()
        except OSError:
            continue  # exited while we looked
        # comm (field 2) may hold spaces and parentheses; the rest follows the last ')'.
        state, _ppid, _pgrp, sid = text.rpartition(")")[2].split()[:4]
        if int(sid) == session:
            members.append((int(stat.parent.name), state))
    return members


def live_processes_in_session(session: int) -> list[int]:
    """Pids whose session id is ``session``, zombies excepted (reaping them is init's job)."""
    return [pid for pid, state in _session_members(session) if state != "Z"]


async def wait_until_session_gone(session: int, within: float = 5.0) -> list[int]:
    """Killed processes take a moment to die; returns what is still alive after ``within``."""
    await asyncio.to_thread(poll, lambda: not live_processes_in_session(session), within)
    return live_processes_in_session(session)


def is_alive(pid: int) -> bool:
    """True while ``pid`` exists and is not a zombie."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return False
    return stat.rpartition(")")[2].split()[0] != "Z"


def docs_example(kind: str) -> str:
    """The code block marked ``<!-- example: kind ... -->`` in docs/jobs.md."""
    pattern = rf"<!-- example: {kind}\b[^>]*-->\n```\w+\n(.*?)```"
    match = re.search(pattern, DOCS.read_text(), re.DOTALL)
    assert match is not None, f"no {kind} example in {DOCS}"
    return match.group(1)
