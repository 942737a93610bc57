"""OpenTelemetry at the claim's edges: the claim span begins with the claim that won,
and an attempt fenced at its record ends its span, saying so.

One fire through :class:`~pgcrond.fire.Firing` with the in-memory guard (a
row held by another owner, or a record the guard fences) and the SDK's
in-memory exporter; the job is a real command.
"""

from __future__ import annotations

import time
from collections import deque
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import StatusCode

from pgcrond.config.loader import load_config
from pgcrond.config.models import JobConfig
from pgcrond.core.keys import Identity
from pgcrond.core.schedule import run_key_for
from pgcrond.daemon.observed import Observing
from pgcrond.daemon.tracing import Tracing
from pgcrond.events import FanOut
from pgcrond.fire import Fire, Firing
from pgcrond.guard.memory import MemoryGuard, Row


def traced_job(tmp_path: Path) -> JobConfig:
    path = tmp_path / "jobs.yaml"
    path.write_text(
        "database: {url: 'postgresql://x@127.0.0.1/x'}\n"
        "jobs:\n"
        "  traced: {cron: '* * * * *', command: ['true'], lease: 300ms, heartbeat: 0s,"
        " misfire_grace: 5s}\n"
    )
    return load_config([path]).jobs["traced"]


def traced(guard: MemoryGuard) -> tuple[Firing, InMemorySpanExporter]:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    firing = Firing(
        guards=lambda _: guard,
        replica="host:1",
        events=FanOut([Observing(), Tracing(provider, "host:1")]),
    )
    return firing, exporter


def by_attempt(spans: tuple[ReadableSpan, ...]) -> dict[int, dict[str, ReadableSpan]]:
    """Each attempt's spans by name: its root, and the children whose parent it is."""
    roots = {s.context.span_id: s for s in spans if s.name == "pgcrond.attempt"}
    found: dict[int, dict[str, ReadableSpan]] = {}
    for span_id, root in roots.items():
        number = int((root.attributes or {})["pgcrond.attempt"])  # type: ignore[arg-type]
        found[number] = {"pgcrond.attempt": root} | {
            s.name: s for s in spans if s.parent is not None and s.parent.span_id == span_id
        }
    return found


@pytest.mark.usefixtures("subprocesses")
async def test_the_claim_span_begins_with_the_claim_that_won_not_the_fire(tmp_path: Path) -> None:
    """Another owner holds the tick until its lease lapses; the takeover's claim span
    starts after that, not when the fire began following the tick."""
    tick = datetime.now(UTC).replace(microsecond=0)
    identity = Identity.schedule("traced", run_key_for(tick))
    guard = MemoryGuard()
    lapses = datetime.now(UTC) + timedelta(milliseconds=300)
    guard.rows[identity] = Row("RUNNING", 1, token=1000, expires_at=lapses)
    firing, exporter = traced(guard)
    fired_ns = time.time_ns()

    assert "success" == await firing.fire(Fire(traced_job(tmp_path), tick, identity))

    (spans,) = by_attempt(exporter.get_finished_spans()).values()
    root, claim = spans["pgcrond.attempt"], spans["claim"]
    attributes = root.attributes or {}
    assert (2, "takeover", "takeover") == (
        attributes["pgcrond.attempt"],
        attributes["pgcrond.claimed_from"],
        attributes["pgcrond.trigger"],
    )
    assert claim.start_time is not None and claim.end_time is not None
    assert claim.start_time >= int(lapses.timestamp() * 1e9) > fired_ns
    assert root.start_time == claim.start_time
    assert claim.end_time <= spans["run"].start_time  # type: ignore[operator]


@pytest.mark.usefixtures("subprocesses")
async def test_a_fenced_attempts_span_ends_with_a_status_saying_fenced(tmp_path: Path) -> None:
    """Attempt 1's record finds it fenced: its spans end there, its status an error
    'fenced'; the tick, taken over once the lease lapses, is attempt 2's own tree."""
    tick = datetime.now(UTC).replace(microsecond=0)
    identity = Identity.schedule("traced", run_key_for(tick))
    # The claim goes through ("won"), the record of attempt 1 finds it fenced.
    guard = MemoryGuard(script=deque(["won", "fence"]))
    firing, exporter = traced(guard)

    assert "success" == await firing.fire(Fire(traced_job(tmp_path), tick, identity))

    attempts = by_attempt(exporter.get_finished_spans())
    assert [1, 2] == sorted(attempts)
    fenced, taken_over = attempts[1], attempts[2]
    assert {"pgcrond.attempt", "claim", "run", "record"} == set(fenced) == set(taken_over)
    root = fenced["pgcrond.attempt"]
    assert (StatusCode.ERROR, "fenced") == (root.status.status_code, root.status.description)
    assert "fenced" == (root.attributes or {})["pgcrond.outcome"]
    assert root.end_time == fenced["record"].end_time
    assert StatusCode.OK == taken_over["pgcrond.attempt"].status.status_code
    assert fenced["run"].context.trace_id != taken_over["run"].context.trace_id
