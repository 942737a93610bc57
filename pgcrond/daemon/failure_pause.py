"""``pause_after_failures: N``: a job that failed N ticks in a row is paused, by pgcrond.

After a final failure it recorded, the replica counts the job's failed ticks
in a row in the lease table (the cluster's truth, as ``pgcrond status``
counts them; any SUCCESS ends the streak). At N it pauses the job
cluster-wide through the same pause a person makes (``pgcrond pause``), with
who = ``pgcrond`` and the reason ``failed N times in a row``, so that the page,
``status`` and ``resume`` treat it as any pause; and says so: a log line,
``pgcrond_paused_after_failures``, the job's ``on_failure`` hook. A job paused
already (by a person, or by this rule) is left as it is. After a ``resume``
the count goes on from where it was: a success resets it, a failure pauses
the job again.
"""

from __future__ import annotations

import structlog

from pgcrond.config.models import JobConfig
from pgcrond.core.outcome import RunResult
from pgcrond.daemon.hooks import Hooks, held_facts
from pgcrond.daemon.metrics import Metrics
from pgcrond.errors import PgcrondError
from pgcrond.events import FireEvents
from pgcrond.guard.base import Held
from pgcrond.storage import jobstate
from pgcrond.storage.leases import LeaseStore

log = structlog.get_logger("pgcrond.daemon.failure_pause")

# Who a pause made by this rule is recorded as paused by.
PAUSED_BY = "pgcrond"


def pause_reason(failures: int) -> str:
    """The recorded reason of a pause after ``failures`` failed ticks in a row."""
    return f"failed {failures} times in a row"


class FailurePause(FireEvents):
    """Pauses a job with ``pause_after_failures`` once its failures in a row reach it."""

    def __init__(self, store: LeaseStore, hooks: Hooks, metrics: Metrics) -> None:
        self.store = store
        self.hooks = hooks
        self.metrics = metrics

    def failed_for_good(self, job: JobConfig, held: Held, result: RunResult) -> None:
        if job.pause_after_failures is not None and job.guard_remembers:
            self.hooks.spawn(self._judge(job, held), f"pause_after_failures:{job.code}")

    async def _judge(self, job: JobConfig, held: Held) -> None:
        limit = job.pause_after_failures
        assert limit is not None
        reason = pause_reason(limit)
        try:
            failures = await jobstate.failure_streak(self.store, held.identity)
            if failures < limit:
                return
            if jobstate.pause_of(await jobstate.paused(self.store), job.code) is not None:
                return  # paused already: by a person, or by this rule on another replica
            await jobstate.pause(self.store, [job.code], by=PAUSED_BY, reason=reason)
        except PgcrondError as exc:
            log.warning("job_not_paused", job=job.code, reason=reason, error=str(exc))
            return
        self.metrics.paused_after_failures.labels(job.code).inc()
        self.metrics.events.paused(job, True)
        log.warning("job_paused", job=job.code, by=PAUSED_BY, reason=reason, failures=failures)
        self.hooks.send(
            job,
            "job_paused",
            {**held_facts(held), "outcome": "paused", "error": reason, "failures": failures},
        )
