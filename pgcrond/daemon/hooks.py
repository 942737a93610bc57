"""A job's hooks and ping: a JSON webhook and/or a command, and a dead-man's switch.

Each event goes to the hook that names it
(:data:`pgcrond.core.hooks.HOOK_OF_EVENT`) and, for a start, a success and a
final failure, to the job's ``ping:``. It is sent by the replica that recorded
what it tells, once per event across the cluster: the winner of an attempt says
its start; the replica whose finalize landed says its success or final failure
(a fenced owner records nothing, so a takeover is never told twice); the claim
that recorded a tick MISSED says so, and so does the replica that recorded one
found after the fact (at its start, after an outage:
:mod:`pgcrond.daemon.accounting`); in advisory mode, which records nothing,
each replica that gave a tick up says so. Sent in the background, bounded (a timeout
per attempt, a few retries on a connect error, 5xx or 429), never awaited by
the fire, so a slow receiver cannot hold up the next tick; a replica killed
between recording and sending sends nothing (at most once). The webhook gets
the event as JSON; the command gets it on stdin and as ``PGCRON_*`` variables,
in an environment stripped of the daemon's secrets (the DSN never reaches
either). A success and a failure carry the attempt's output tail
(``output.stdout`` / ``output.stderr``: ``text``, ``dropped_bytes``), as its
attempt record keeps it; a ping to ``/fail`` has it as its body.
"""

from __future__ import annotations

import asyncio
import json
import os
from collections.abc import Awaitable, Callable, Coroutine
from datetime import UTC, datetime
from typing import Any

import structlog

from pgcrond import __version__
from pgcrond.config.models import JobConfig
from pgcrond.core.box import Box
from pgcrond.core.hooks import HOOK_OF_EVENT, PING_OF_EVENT, Hook, HookEvent
from pgcrond.core.keys import Identity
from pgcrond.core.outcome import RunResult
from pgcrond.daemon.observed import current, trigger_of
from pgcrond.events import FireEvents
from pgcrond.guard.base import Held
from pgcrond.run.environment import job_environ

log = structlog.get_logger("pgcrond.daemon.hooks")
_BACKOFF_S = 1.0
# Every event has every key (None where it does not apply): one shape to parse.
_SHAPE: dict[str, Any] = dict.fromkeys(
    (
        "run_key",
        "idempotency_key",
        "attempt",
        "trigger",
        "outcome",
        "error",
        "exit_code",
        "duration_s",
        "output",
    )
)
# How many failures in a row came before a success (lease table): 0, none.
FailureStreak = Callable[[JobConfig, Identity], Awaitable[int]]


class Hooks:
    """Sends each job's hooks and ping for its events; holds the tasks it started."""

    def __init__(self, replica: str) -> None:
        self.replica = replica
        self._tasks: set[asyncio.Task[None]] = set()
        # Each job's last ping still being sent: the next one waits for it.
        self._pings: dict[str, asyncio.Task[None]] = {}

    def send(
        self, job: JobConfig, event: HookEvent, facts: dict[str, Any], *, body: str = ""
    ) -> None:
        """Tell ``event`` of ``job`` to its hook and ping, in the background.

        ``facts`` fill the event's shape (its run key, attempt, outcome, …);
        ``body`` is a ping's text (the output tail of a failure).
        """
        hook: Hook | None = getattr(job, HOOK_OF_EVENT[event])
        state = PING_OF_EVENT.get(event) if job.ping is not None else None
        if hook is None and state is None:
            return
        message = {
            "event": event,
            "job": job.code,
            **_SHAPE,
            **facts,
            "replica": self.replica,
            "at": datetime.now(UTC).isoformat(),
        }
        if hook is not None:
            # The hook command inherits what the job does (it runs as pgcrond's own user).
            inherits = Box(env_passthrough=job.box.env_passthrough)
            self.spawn(self._hook(hook, message, inherits), f"{HOOK_OF_EVENT[event]}:{job.code}")
        if job.ping is not None and state is not None:
            ping = job.ping
            send = self._post(
                message,
                "ping",
                ping.url_for(state),
                ping.timeout.total_seconds(),
                ping.retries,
                content=body.encode(),
            )
            # A job's pings go out in order: a quick run's /fail must not
            # overtake its /start, which the monitor would read as running.
            after = self._pings.get(job.code)
            task = self.spawn(_in_turn(after, send), f"ping:{job.code}")
            self._pings[job.code] = task
            task.add_done_callback(lambda done: self._ping_sent(job.code, done))

    def spawn(self, work: Coroutine[Any, Any, None], name: str) -> asyncio.Task[None]:
        """Run ``work`` in the background, held until it ends (and drained at shutdown)."""
        task = asyncio.create_task(work, name=name)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task

    def _ping_sent(self, code: str, task: asyncio.Task[None]) -> None:
        if self._pings.get(code) is task:
            del self._pings[code]

    async def drain(self, seconds: float) -> None:
        """At shutdown: give hooks still sending up to ``seconds``."""
        if self._tasks:
            await asyncio.wait(set(self._tasks), timeout=seconds)

    async def _hook(self, hook: Hook, event: dict[str, Any], inherits: Box) -> None:
        sends = []
        per_try_s = hook.timeout.total_seconds()
        if hook.webhook is not None:
            sends.append(
                self._post(event, "webhook", hook.webhook, per_try_s, hook.retries, as_json=event)
            )
        if hook.command is not None:
            sends.append(self._command(hook, hook.command, event, inherits))
        await asyncio.gather(*sends)

    async def _post(
        self,
        event: dict[str, Any],
        kind: str,
        url: str,
        per_try_s: float,
        retries: int,
        *,
        as_json: dict[str, Any] | None = None,
        content: bytes | None = None,
    ) -> None:
        bound = log.bind(
            job=event["job"], run_key=event["run_key"], hook=kind, hook_event=event["event"]
        )
        headers = {"User-Agent": f"pgcrond/{__version__}"}
        status: int | None = None
        error: str | None = None
        attempt = 0
        import httpx  # here, not at start: about 10 MiB a replica without webhooks never needs

        async with httpx.AsyncClient(timeout=per_try_s, headers=headers) as client:
            for attempt in range(1, retries + 2):
                try:
                    response = await client.post(url, json=as_json, content=content)
                except httpx.HTTPError as exc:
                    status, error = None, f"{type(exc).__name__}: {exc}"
                else:
                    if response.status_code < 400:
                        bound.info("hook_sent", status=response.status_code, attempt=attempt)
                        return
                    status, error = response.status_code, None
                    if status < 500 and status != 429:
                        break  # the receiver refused it: retrying would not help
                if attempt <= retries:
                    await asyncio.sleep(_BACKOFF_S * attempt)
        bound.warning("hook_failed", status=status, error=error, attempts=attempt)

    async def _command(
        self, hook: Hook, argv: tuple[str, ...], event: dict[str, Any], inherits: Box
    ) -> None:
        bound = log.bind(
            job=event["job"], run_key=event["run_key"], hook="command", hook_event=event["event"]
        )
        run_env = {
            "PGCRON_EVENT": event["event"],
            "PGCRON_JOB": event["job"],
            "PGCRON_RUN_KEY": event["run_key"] or "",
            "PGCRON_IDEMPOTENCY_KEY": event["idempotency_key"] or "",
            "PGCRON_ATTEMPT": "" if event["attempt"] is None else str(event["attempt"]),
            "PGCRON_TRIGGER": event["trigger"] or "",
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


async def _in_turn(after: asyncio.Task[None] | None, send: Coroutine[Any, Any, None]) -> None:
    if after is not None:
        await asyncio.wait({after})  # its outcome is its own (logged there)
    await send


def held_facts(held: Held) -> dict[str, Any]:
    """The attempt's part of an event: which tick, which attempt, and why it runs."""
    return {
        "run_key": held.identity.run_key,
        "idempotency_key": held.identity.idempotency_key,
        "attempt": held.attempt,
        "trigger": trigger_of(held),
    }


def result_facts(held: Held, result: RunResult) -> dict[str, Any]:
    """What an ended attempt tells: its tick, how it ended, and its output tail."""
    return {
        **held_facts(held),
        "outcome": result.outcome,
        "error": result.error,
        "exit_code": result.exit_code,
        "duration_s": round(result.duration_s, 3),
        # The attempt's output tail, as its record keeps it (redacted,
        # bounded, shown safely): what a person needs to see why.
        "output": result.output.as_json(),
    }


def missed_facts(identity: Identity, cause: str) -> dict[str, Any]:
    """A tick recorded MISSED: which one, and why (late, coalesced, no_replica, …)."""
    return {
        "run_key": identity.run_key,
        "idempotency_key": identity.idempotency_key,
        "outcome": "missed",
        "error": cause,
    }


def ping_text(result: RunResult) -> str:
    """A failed attempt's error and output tail, as a ping's body (stderr first)."""
    parts = [result.error or result.outcome]
    for name, stream in result.output.streams(failing_first=True):
        if not stream.empty:
            parts.append(f"--- {name} ---\n{stream.text()}")
    return "\n".join(parts)


class HookEvents(FireEvents):
    """The fire's events, told to each job's hooks and ping (see the module's docstring)."""

    def __init__(self, hooks: Hooks, failure_streak: FailureStreak | None = None) -> None:
        self.hooks = hooks
        # None: no guard here keeps outcomes, so no recovery can be told.
        self._failure_streak = failure_streak

    def run_started(self, job: JobConfig, lateness_s: float) -> None:
        attempt = current(job)
        if attempt is not None:
            facts = {**held_facts(attempt.held), "lateness_s": round(lateness_s, 3)}
            self.hooks.send(job, "run_started", facts)

    def succeeded(self, job: JobConfig, held: Held, result: RunResult) -> None:
        facts = result_facts(held, result)
        self.hooks.send(job, "run_succeeded", facts)
        if job.on_recovery is not None and self._failure_streak is not None and job.guard_remembers:
            self.hooks.spawn(self._recovery(job, held.identity, facts), f"on_recovery:{job.code}")

    def failed_for_good(self, job: JobConfig, held: Held, result: RunResult) -> None:
        self.hooks.send(job, "run_failed", result_facts(held, result), body=ping_text(result))

    def missed(
        self, job: JobConfig, identity: Identity, tick: datetime, cause: str, recorded: bool
    ) -> None:
        # Only the claim that stored the miss tells it: every other replica's
        # claim is answered with the row it wrote, and says nothing. (A miss
        # this replica's clock saw first is told once stored: missed_found.)
        # Advisory mode stores nothing: each replica that gave the tick up
        # tells it, as it alone cannot know whether another replica ran it.
        if recorded or not job.guard_remembers:
            self.hooks.send(job, "tick_missed", missed_facts(identity, cause))

    def missed_found(
        self, job: JobConfig, identity: Identity, tick: datetime, cause: str, why: str
    ) -> None:
        # Stored by this replica alone (a write that found the row there already
        # returns nothing): told once across the cluster as well.
        self.hooks.send(job, "tick_missed", {**missed_facts(identity, cause), "detail": why})

    async def _recovery(self, job: JobConfig, identity: Identity, facts: dict[str, Any]) -> None:
        assert self._failure_streak is not None
        try:
            failures = await self._failure_streak(job, identity)
        except Exception as exc:
            log.warning("hook_failed", job=job.code, hook="on_recovery", error=str(exc))
            return
        if failures:
            self.hooks.send(job, "run_recovered", {**facts, "failures": failures})
