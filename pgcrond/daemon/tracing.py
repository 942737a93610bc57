"""OpenTelemetry: a span per attempt, with children for its claim, run and record.

Imported only with the ``otel`` extra and an exporter asked for
(:func:`pgcrond.daemon.observers.tracing_wanted`): a daemon without them
loads none of it. The tree of one attempt, on the replica that ran it::

    pgcrond.attempt   job, run key, attempt, trigger, replica, outcome, lateness
    ├── claim         from the claim that won going out to the win
    ├── run           from the win to the run's end; the job's TRACEPARENT names it
    └── record        from the run's end to its outcome stored

The run span's W3C context is handed to the job (``TRACEPARENT``, and the
``traceparent`` header of an ``http:`` job) before it starts, so that its
own spans are children of the run span. An attempt this replica records
nothing of (fenced: another replica took the tick over; its lease lost) ends
there, its status an error that says why. Spans go through the SDK's batch
processor to the OTLP exporter the ``OTEL_*`` variables configure.
"""

from __future__ import annotations

import time
from contextvars import ContextVar
from dataclasses import dataclass

from opentelemetry import trace
from opentelemetry.context import Context
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor
from opentelemetry.trace import Span, Status, StatusCode
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

from pgcrond import __version__
from pgcrond.config.models import JobConfig
from pgcrond.core.keys import Identity
from pgcrond.core.trigger import TriggerKind
from pgcrond.events import FireEvents
from pgcrond.guard.base import Held, Outcome
from pgcrond.run.context import TRACEPARENT

_PROPAGATOR = TraceContextTextMapPropagator()
# The outcomes of a run that are no error of the span.
_OK = frozenset({"success", "released"})


@dataclass
class _Spans:
    code: str
    attempt: Span
    context: Context
    run: Span
    record: Span | None = None


# The fire's own task: the attempt's spans.
_spans: ContextVar[_Spans | None] = ContextVar("pgcrond_spans", default=None)


def otlp_provider() -> TracerProvider:
    """A provider exporting over OTLP/HTTP, as the ``OTEL_*`` variables say."""
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

    # Resource.create reads OTEL_SERVICE_NAME and OTEL_RESOURCE_ATTRIBUTES too.
    resource = Resource.create({"service.name": "pgcrond", "service.version": __version__})
    provider = TracerProvider(resource=resource)
    provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter()))
    return provider


class Tracing(FireEvents):
    """The fire's events, as spans (see the module's docstring)."""

    def __init__(self, provider: trace.TracerProvider, replica: str) -> None:
        self.tracer = provider.get_tracer("pgcrond", __version__)
        self.replica = replica
        # When each identity's last claim went out (a tick's claims go
        # together, from one task), until the claim is won or the fire ends.
        self._claims: dict[Identity, int] = {}

    def claim_sent(self, job: JobConfig, identity: Identity) -> None:
        self._claims[identity] = time.time_ns()

    def fire_done(self, job: JobConfig, identity: Identity, outcome: str) -> None:
        self._claims.pop(identity, None)

    def claim_won(self, job: JobConfig, held: Held) -> None:
        now = time.time_ns()
        began = self._claims.pop(held.identity, now)
        attempt = self.tracer.start_span(
            "pgcrond.attempt",
            start_time=began,
            attributes={
                "pgcrond.job": job.code,
                "pgcrond.run_key": held.identity.run_key or "",
                "pgcrond.idempotency_key": held.identity.idempotency_key,
                "pgcrond.attempt": held.attempt,
                "pgcrond.replica": self.replica,
                "pgcrond.claimed_from": str(held.claimed_from),
            },
        )
        context = trace.set_span_in_context(attempt)
        self.tracer.start_span("claim", context=context, start_time=began).end(end_time=now)
        run = self.tracer.start_span("run", context=context, start_time=now)
        carrier: dict[str, str] = {}
        _PROPAGATOR.inject(carrier, context=trace.set_span_in_context(run))
        TRACEPARENT.set(carrier.get("traceparent"))
        _spans.set(_Spans(job.code, attempt, context, run))

    def run_trigger(self, job: JobConfig, held: Held, trigger: TriggerKind) -> None:
        spans = _current(job)
        if spans is not None:
            spans.attempt.set_attribute("pgcrond.trigger", trigger)

    def run_started(self, job: JobConfig, lateness_s: float) -> None:
        spans = _current(job)
        if spans is not None:
            spans.attempt.set_attribute("pgcrond.lateness_s", lateness_s)

    def run_finished(self, job: JobConfig, outcome: str, duration_s: float) -> None:
        spans = _current(job)
        if spans is None:
            return
        now = time.time_ns()
        spans.run.set_attribute("pgcrond.outcome", outcome)
        _status(spans.run, outcome)
        spans.run.end(end_time=now)
        if outcome == "lease_lost":
            _end(spans, outcome, now)  # nothing is recorded by a replica that lost its lease
            return
        spans.record = self.tracer.start_span("record", context=spans.context, start_time=now)

    def recorded(self, job: JobConfig, kind: Outcome, final: bool) -> None:
        spans = _current(job)
        if spans is None:
            return
        now = time.time_ns()
        spans.attempt.set_attribute("pgcrond.final", final)
        _end(spans, kind, now)

    def unrecorded(self, job: JobConfig, held: Held, reason: str) -> None:
        _end(_current(job), reason, time.time_ns())


def _current(job: JobConfig) -> _Spans | None:
    spans = _spans.get()
    return spans if spans is not None and spans.code == job.code else None


def _end(spans: _Spans | None, outcome: str, now: int) -> None:
    if spans is None:
        return
    _spans.set(None)
    TRACEPARENT.set(None)
    if spans.run.is_recording():
        spans.run.end(end_time=now)  # a run that never started (its executor failed first)
    if spans.record is not None:
        spans.record.end(end_time=now)
    spans.attempt.set_attribute("pgcrond.outcome", outcome)
    _status(spans.attempt, outcome)
    spans.attempt.end(end_time=now)


def _status(span: Span, outcome: str) -> None:
    span.set_status(Status(StatusCode.OK) if outcome in _OK else Status(StatusCode.ERROR, outcome))
