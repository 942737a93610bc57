"""The attempt whose events a subscriber hears: what the fire told of it so far.

The fire's events name the job, and only some of them the attempt
(``claim_won``, ``failed_for_good``); ``run_started``, ``run_finished`` and
``recorded`` do not. Every event of one attempt is said in the fire's own task,
one after the other (pgcrond/events.py), so the attempt a task won last is
the one its later events are about: :class:`Observing`, subscribed before the
observers that read it, keeps it in a context variable of that task.
"""

from __future__ import annotations

import time
from contextvars import ContextVar
from dataclasses import dataclass

from pgcrond.config.models import JobConfig
from pgcrond.core.trigger import TriggerKind
from pgcrond.events import FireEvents
from pgcrond.guard.base import Held


@dataclass
class Attempt:
    """One attempt as its events told it: won, started, finished."""

    job: JobConfig
    held: Held
    # time.monotonic() of each step; None until it came.
    won_at: float
    started_at: float | None = None
    lateness_s: float | None = None
    outcome: str | None = None
    duration_s: float | None = None
    # Why it runs (PGCRON_TRIGGER), once told.
    trigger: TriggerKind | None = None


_current: ContextVar[Attempt | None] = ContextVar("pgcrond_observed_attempt", default=None)


def current(job: JobConfig) -> Attempt | None:
    """The attempt of ``job`` this task runs or ran last, if any."""
    attempt = _current.get()
    return attempt if attempt is not None and attempt.job.code == job.code else None


def trigger_of(held: Held) -> TriggerKind | None:
    """Why the attempt ``held`` runs, if it is the one this task runs or ran last."""
    attempt = _current.get()
    return attempt.trigger if attempt is not None and attempt.held is held else None


class Observing(FireEvents):
    """Keeps :func:`current` up to date; subscribed ahead of every observer that reads it."""

    def claim_won(self, job: JobConfig, held: Held) -> None:
        _current.set(Attempt(job, held, won_at=time.monotonic()))

    def run_trigger(self, job: JobConfig, held: Held, trigger: TriggerKind) -> None:
        attempt = current(job)
        if attempt is not None and attempt.held is held:
            attempt.trigger = trigger

    def run_started(self, job: JobConfig, lateness_s: float) -> None:
        attempt = current(job)
        if attempt is not None:
            attempt.started_at, attempt.lateness_s = time.monotonic(), lateness_s

    def run_finished(self, job: JobConfig, outcome: str, duration_s: float) -> None:
        attempt = current(job)
        if attempt is not None:
            attempt.outcome, attempt.duration_s = outcome, duration_s
