"""``on_failure:`` hooks: a JSON webhook and/or a command when a run fails for good.

Sent in the background on the replica that ran the job, once per final
failure; bounded (a timeout per attempt, a few retries on a connect error,
5xx or 429) and never awaited by the fire, so a slow receiver cannot hold up
the next tick. The webhook gets the event as JSON; the command gets it on
stdin and as ``PGCRON_*`` variables, in an environment stripped of the
daemon's secrets (the DSN never reaches either). The event carries the failed
attempt's output tail (``output.stdout`` / ``output.stderr``: ``text``,
``dropped_bytes``), as its attempt record keeps it.
"""

from __future__ import annotations

import asyncio
import json
import os
from datetime import UTC, datetime
from typing import Any

import structlog

from pgcrond import __version__
from pgcrond.config.models import JobConfig
from pgcrond.core.box import Box
from pgcrond.core.hooks import FailureHook
from pgcrond.core.outcome import RunResult
from pgcrond.events import FireEvents
from pgcrond.guard.base import Held
from pgcrond.run.environment import job_environ

log = structlog.get_logger("pgcrond.daemon.hooks")
_BACKOFF_S = 1.0


class FailureHooks(FireEvents):
    """Sends each job's ``on_failure`` for final failures; holds the tasks it started."""

    def __init__(self, replica: str) -> None:
        self.replica = replica
        self._tasks: set[asyncio.Task[None]] = set()

    def failed_for_good(self, job: JobConfig, held: Held, result: RunResult) -> None:
        hook = job.on_failure
        if hook is None:
            return
        event = {
            "event": "run_failed",
            "job": job.code,
            "run_key": held.identity.run_key,
            "idempotency_key": held.identity.idempotency_key,
            "attempt": held.attempt,
            "outcome": result.outcome,
            "error": result.error,
            "exit_code": result.exit_code,
            # The attempt's output tail, as its record keeps it (redacted,
            # bounded, shown safely): what a person needs to see why.
            "output": result.output.as_json(),
            "replica": self.replica,
            "at": datetime.now(UTC).isoformat(),
        }
        # The hook command inherits what the job does (it runs as pgcrond's own user).
        inherits = Box(env_passthrough=job.box.env_passthrough)
        task = asyncio.create_task(self._send(hook, event, inherits), name=f"on_failure:{job.code}")
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def drain(self, seconds: float) -> None:
        """At shutdown: give hooks still sending up to ``seconds``."""
        if self._tasks:
            await asyncio.wait(set(self._tasks), timeout=seconds)

    async def _send(self, hook: FailureHook, event: dict[str, Any], inherits: Box) -> None:
        sends = []
        if hook.webhook is not None:
            sends.append(self._webhook(hook, hook.webhook, event))
        if hook.command is not None:
            sends.append(self._command(hook, hook.command, event, inherits))
        await asyncio.gather(*sends)

    async def _webhook(self, hook: FailureHook, url: str, event: dict[str, Any]) -> None:
        bound = log.bind(job=event["job"], run_key=event["run_key"], hook="webhook")
        timeout = hook.timeout.total_seconds()
        headers = {"User-Agent": f"pgcrond/{__version__}"}
        status: int | None = None
        error: str | None = None
        attempt = 0
        import httpx  # here, not at start: about 10 MiB a replica without webhooks never needs

        async with httpx.AsyncClient(timeout=timeout, headers=headers) as client:
            for attempt in range(1, hook.retries + 2):
                try:
                    response = await client.post(url, json=event)
                except httpx.HTTPError as exc:
                    status, error = None, f"{type(exc).__name__}: {exc}"
                else:
                    if response.status_code < 400:
                        bound.info("hook_sent", status=response.status_code, attempt=attempt)
                        return
                    status, error = response.status_code, None
                    if status < 500 and status != 429:
                        break  # the receiver refused it: retrying would not help
                if attempt <= hook.retries:
                    await asyncio.sleep(_BACKOFF_S * attempt)
        bound.warning("hook_failed", status=status, error=error, attempts=attempt)

    async def _command(
        self, hook: FailureHook, argv: tuple[str, ...], event: dict[str, Any], inherits: Box
    ) -> None:
        bound = log.bind(job=event["job"], run_key=event["run_key"], hook="command")
        run_env = {
            "PGCRON_JOB": event["job"],
            "PGCRON_RUN_KEY": event["run_key"] or "",
            "PGCRON_IDEMPOTENCY_KEY": event["idempotency_key"],
            "PGCRON_ATTEMPT": str(event["attempt"]),
            "PGCRON_ERROR": event["error"] or "",
        }
        try:
            process = await asyncio.create_subprocess_exec(
                *argv,
                stdin=asyncio.subprocess.PIPE,
                stdout=asyncio.subprocess.DEVNULL,
                stderr=asyncio.subprocess.DEVNULL,
                env=job_environ({}, run_env, inherits.inherited(os.environ)),
                start_new_session=True,
            )
        except OSError as exc:
            bound.warning("hook_failed", error=f"cannot start: {exc}")
            return
        try:
            await asyncio.wait_for(
                process.communicate(json.dumps(event).encode()), hook.timeout.total_seconds()
            )
        except TimeoutError:
            process.kill()
            await process.wait()
            bound.warning("hook_failed", error=f"timeout after {hook.timeout.total_seconds():g}s")
            return
        if process.returncode == 0:
            bound.info("hook_sent", exit_code=0)
        else:
            bound.warning("hook_failed", exit_code=process.returncode)
