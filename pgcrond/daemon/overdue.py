"""A run that takes too long, or starts too late: reported, never acted on.

``max_duration:``: a timer from the run's start on the replica that runs it;
a run still going when it rings is ``run_overdue`` (a log line, the
``pgcrond_runs_overdue`` counter, the job's ``on_failure`` hook), once per
attempt, and goes on (``timeout:`` is what stops a run). ``start_deadline:``:
a tick whose run starts later than it after the tick is ``start_overdue``
(the same three), told by the replica that starts it (a retry is no start of
the tick). A tick still not started when the deadline passes (no claim
answered: the database unreachable or slow; a claim not yet due) is
``start_overdue`` at the deadline, with ``started: false``, told by the
replica the tick prefers (spread) while its own fire still waits to start
it; that replica does not tell the late start again. The others leave the
tick to it, so it is told once while the replicas agree on who lives (a
replica that knows no peer counts itself preferred; in advisory mode every
replica does). A tick that never starts within ``misfire_grace`` is MISSED
(``on_missed``).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Literal

import structlog

from pgcrond.config.models import JobConfig
from pgcrond.core.keys import Identity
from pgcrond.daemon.hooks import Hooks, held_facts
from pgcrond.daemon.metrics import Metrics
from pgcrond.daemon.observed import Attempt, current
from pgcrond.events import FireEvents
from pgcrond.guard.base import Held

log = structlog.get_logger("pgcrond.daemon.overdue")


@dataclass
class _Deadline:
    """A first start's ``start_deadline`` on this replica: its timer, and whether it rang."""

    timer: asyncio.TimerHandle | None = None
    # Told not started: the start that comes after is not told again.
    told: bool = False


class Overdue(FireEvents):
    """Times each run of a job with ``max_duration`` and judges each start by ``start_deadline``."""

    def __init__(self, hooks: Hooks, metrics: Metrics) -> None:
        self.hooks = hooks
        self.metrics = metrics
        # The attempts running here with a max_duration: their timers.
        self._timers: dict[int, asyncio.TimerHandle] = {}
        # The first starts this replica fires and tells (start_deadline), by job
        # code: claims of a tick's fires are made together, in one task, and a
        # lost claim's event names the job only.
        self._deadlines: dict[str, dict[Identity, _Deadline]] = {}

    def first_start(
        self, job: JobConfig, identity: Identity, tick: datetime, preferred: Callable[[], bool]
    ) -> None:
        if job.start_deadline is None or not preferred():
            return
        due = (tick + job.start_deadline - datetime.now(UTC)).total_seconds()
        deadline = _Deadline()
        deadline.timer = asyncio.get_running_loop().call_later(
            max(due, 0.0), self._not_started, job, identity, tick, deadline
        )
        self._deadlines.setdefault(job.code, {})[identity] = deadline

    def claim_won(self, job: JobConfig, held: Held) -> None:
        # This replica starts it: judged at its start (run_started).
        deadline = self._deadlines.get(job.code, {}).get(held.identity)
        if deadline is not None and deadline.timer is not None:
            deadline.timer.cancel()

    def claim_lost(self, job: JobConfig, reason: str) -> None:
        # Another replica claimed it, and judges it at its start. The claim
        # answered names no tick: the job's ticks this replica waits on were
        # claimed together (or their database is back), so none is told.
        for deadline in self._deadlines.get(job.code, {}).values():
            if deadline.timer is not None:
                deadline.timer.cancel()

    def fire_done(self, job: JobConfig, identity: Identity, outcome: str) -> None:
        # Run, missed, skipped, or the replica stops.
        waiting = self._deadlines.get(job.code)
        deadline = None if waiting is None else waiting.pop(identity, None)
        if deadline is not None and deadline.timer is not None:
            deadline.timer.cancel()
        if waiting is not None and not waiting:
            del self._deadlines[job.code]

    def _not_started(
        self, job: JobConfig, identity: Identity, tick: datetime, deadline: _Deadline
    ) -> None:
        assert job.start_deadline is not None
        deadline.told = True
        lateness_s = (datetime.now(UTC) - tick).total_seconds()
        self._report(
            job,
            "start_overdue",
            {
                "run_key": identity.run_key,
                "idempotency_key": identity.idempotency_key,
                "outcome": "not_started",
                "started": False,
            },
            lateness_s=round(lateness_s, 3),
            start_deadline_s=job.start_deadline.total_seconds(),
        )

    def run_started(self, job: JobConfig, lateness_s: float) -> None:
        attempt = current(job)
        if attempt is None:
            return
        deadline = self._deadlines.get(job.code, {}).get(attempt.held.identity)
        if (
            job.start_deadline is not None
            and lateness_s > job.start_deadline.total_seconds()
            # A retry is no start of the tick; one told not started is not told twice.
            and attempt.held.claimed_from != "retry"
            and not (deadline is not None and deadline.told)
        ):
            self._report(
                job,
                "start_overdue",
                {**held_facts(attempt.held), "started": True},
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
            "run_overdue",
            held_facts(attempt.held),
            running_s=round(time.monotonic() - attempt.started_at, 3),
            max_duration_s=job.max_duration.total_seconds(),
        )

    def _report(
        self,
        job: JobConfig,
        event: Literal["run_overdue", "start_overdue"],
        told: dict[str, Any],
        **facts: float,
    ) -> None:
        series = (
            self.metrics.runs_overdue if event == "run_overdue" else self.metrics.starts_overdue
        )
        series.labels(job.code).inc()
        shown = {k: told[k] for k in ("run_key", "attempt", "started") if k in told}
        log.warning(event, job=job.code, **shown, **facts)
        self.hooks.send(job, event, {**told, **facts})
