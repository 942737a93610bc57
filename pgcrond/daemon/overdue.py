"""A run that takes too long, or starts too late: reported, never acted on.

``max_duration:``: a timer from the run's start on the replica that runs it;
a run still going when it rings is ``run_overdue`` (a log line, the
``pgcrond_runs_overdue`` counter, the job's ``on_failure`` hook), once per
attempt, and goes on (``timeout:`` is what stops a run). ``start_deadline:``:
a run that starts later than it after its tick is ``start_overdue`` (the
same three), told by the replica that starts it; a tick that never starts
within ``misfire_grace`` is MISSED (``on_missed``).
"""

from __future__ import annotations

import asyncio
import time
from typing import Literal

import structlog

from pgcrond.config.models import JobConfig
from pgcrond.daemon.hooks import Hooks, held_facts
from pgcrond.daemon.metrics import Metrics
from pgcrond.daemon.observed import Attempt, current
from pgcrond.events import FireEvents

log = structlog.get_logger("pgcrond.daemon.overdue")


class Overdue(FireEvents):
    """Times each run of a job with ``max_duration`` and judges each start by ``start_deadline``."""

    def __init__(self, hooks: Hooks, metrics: Metrics) -> None:
        self.hooks = hooks
        self.metrics = metrics
        # The attempts running here with a max_duration: their timers.
        self._timers: dict[int, asyncio.TimerHandle] = {}

    def run_started(self, job: JobConfig, lateness_s: float) -> None:
        attempt = current(job)
        if attempt is None:
            return
        if job.start_deadline is not None and lateness_s > job.start_deadline.total_seconds():
            self._report(
                job,
                attempt,
                "start_overdue",
                lateness_s=round(lateness_s, 3),
                start_deadline_s=job.start_deadline.total_seconds(),
            )
        if job.max_duration is not None:
            handle = asyncio.get_running_loop().call_later(
                job.max_duration.total_seconds(), self._ring, job, attempt
            )
            self._timers[id(attempt)] = handle

    def run_finished(self, job: JobConfig, outcome: str, duration_s: float) -> None:
        attempt = current(job)
        handle = None if attempt is None else self._timers.pop(id(attempt), None)
        if handle is not None:
            handle.cancel()

    def _ring(self, job: JobConfig, attempt: Attempt) -> None:
        self._timers.pop(id(attempt), None)
        assert job.max_duration is not None and attempt.started_at is not None
        self._report(
            job,
            attempt,
            "run_overdue",
            running_s=round(time.monotonic() - attempt.started_at, 3),
            max_duration_s=job.max_duration.total_seconds(),
        )

    def _report(
        self,
        job: JobConfig,
        attempt: Attempt,
        event: Literal["run_overdue", "start_overdue"],
        **facts: float,
    ) -> None:
        series = (
            self.metrics.runs_overdue if event == "run_overdue" else self.metrics.starts_overdue
        )
        series.labels(job.code).inc()
        held = attempt.held
        log.warning(
            event,
            job=job.code,
            run_key=held.identity.run_key,
            attempt=held.attempt,
            **facts,
        )
        self.hooks.send(job, event, {**held_facts(held), **facts})
