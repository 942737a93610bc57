"""Who hears the fire's events besides the metrics and the accounting: the observers.

In this order, told only of the jobs that have something to observe
(:class:`Watched`): :class:`~pgcrond.daemon.observed.Observing` (the attempt
the others read), the hooks and pings, ``max_duration`` and
``start_deadline``, ``pause_after_failures``. Then OpenTelemetry, when asked
for, of every job's; the tracing module, and the SDK under it, is imported
only then.
"""

from __future__ import annotations

import importlib.util
import os
from collections.abc import Callable, Mapping
from typing import Any

import structlog

from pgcrond.config.models import JobConfig
from pgcrond.core.keys import Identity
from pgcrond.daemon.failure_pause import FailurePause
from pgcrond.daemon.hooks import HookEvents, Hooks
from pgcrond.daemon.metrics import Metrics
from pgcrond.daemon.observed import Observing
from pgcrond.daemon.overdue import Overdue
from pgcrond.events import FanOut, FireEvents
from pgcrond.storage import jobstate
from pgcrond.storage.leases import LeaseStore

log = structlog.get_logger("pgcrond.daemon.observers")

# OTLP's own variables: either names where the spans go.
_OTLP_ENDPOINTS = ("OTEL_EXPORTER_OTLP_ENDPOINT", "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT")


def subscribers(
    store: LeaseStore, hooks: Hooks, metrics: Metrics, replica: str
) -> list[FireEvents]:
    """The observers of a replica's fires, in the order they are to be told."""

    async def failure_streak(job: JobConfig, identity: Identity) -> int:
        return await jobstate.failure_streak(store, identity)

    found: list[FireEvents] = [
        Watched(
            [
                Observing(),
                HookEvents(hooks, failure_streak),
                Overdue(hooks, metrics),
                FailurePause(store, hooks, metrics),
            ]
        )
    ]
    if tracing_wanted(os.environ):
        if not _installed("opentelemetry.exporter.otlp.proto.http"):
            log.warning(
                "tracing_unavailable",
                detail="OTEL_* variables ask for traces, but the otel extra is not "
                "installed (pip install 'pgcrond[otel]')",
            )
        else:
            from pgcrond.daemon import tracing

            found.append(tracing.Tracing(tracing.otlp_provider(), replica))
            log.info("tracing_on", exporter="otlp")
    return found


class Watched(FireEvents):
    """The observers, told only of the jobs that have something to observe (``observed``).

    Most jobs have none: their fires cost the observers one attribute read
    per event, not a call to each (10,000 co-firing jobs, every event). Its
    methods are made from :class:`FireEvents`' own (below); ``database``,
    which names no job, it leaves alone: no observer counts database calls.
    """

    def __init__(self, observers: list[FireEvents]) -> None:
        self._observers = FanOut(observers)


def _watched(name: str) -> Callable[..., None]:
    def told_if_observed(self: Watched, job: JobConfig, *args: Any, **kwargs: Any) -> None:
        if job.observed:
            getattr(self._observers, name)(job, *args, **kwargs)

    told_if_observed.__name__ = told_if_observed.__qualname__ = name
    return told_if_observed


# Every event but database names its job first.
for _event in [name for name in vars(FireEvents) if not name.startswith("_")]:
    if _event != "database":
        setattr(Watched, _event, _watched(_event))


def _installed(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is not None
    except ModuleNotFoundError:  # a parent package is missing
        return False


def tracing_wanted(environ: Mapping[str, str]) -> bool:
    """Whether the ``OTEL_*`` variables ask for traces: an OTLP endpoint or exporter named."""
    if environ.get("OTEL_SDK_DISABLED", "").strip().lower() == "true":
        return False
    exporter = environ.get("OTEL_TRACES_EXPORTER")
    if exporter is not None:
        return exporter.strip().lower() == "otlp"
    return any(environ.get(name) for name in _OTLP_ENDPOINTS)
