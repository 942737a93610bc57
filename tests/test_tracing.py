"""OpenTelemetry: a span per attempt (claim, run, record), and the job joins the run's trace.

One fire through :class:`~pgcrond.fire.Firing` with the in-memory guard and
the SDK's in-memory exporter; the job is a real command that writes the
``TRACEPARENT`` it was given. Without the otel extra asked for, a daemon
imports nothing of OpenTelemetry (a fresh interpreter says so).
"""

from __future__ import annotations

import subprocess
import sys
from datetime import UTC, datetime
from pathlib import Path

import pytest
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.proto.trace.v1.trace_pb2 import Span
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from pgcrond.config.loader import load_config
from pgcrond.core.keys import Identity
from pgcrond.core.schedule import run_key_for
from pgcrond.daemon.observed import Observing
from pgcrond.daemon.observers import tracing_wanted
from pgcrond.daemon.tracing import Tracing
from pgcrond.events import FanOut
from pgcrond.fire import Fire, Firing
from pgcrond.guard.memory import MemoryGuard
from tests.helpers.daemon_harness import at, cluster, config, wait_until
from tests.helpers.hook_receiver import Receiver, receiving


@pytest.mark.usefixtures("subprocesses")
async def test_one_run_is_a_span_tree_and_the_job_reports_its_trace_id(tmp_path: Path) -> None:
    out = tmp_path / "traceparent"
    path = tmp_path / "jobs.yaml"
    path.write_text(
        "database: {url: 'postgresql://x@127.0.0.1/x'}\n"
        "jobs:\n"
        f"  traced: {{cron: '* * * * *', shell: 'printf %s \"$TRACEPARENT\" > {out}'}}\n"
    )
    job = load_config([path]).jobs["traced"]
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    guard = MemoryGuard()
    firing = Firing(
        guards=lambda _: guard,
        replica="host:1",
        events=FanOut([Observing(), Tracing(provider, "host:1")]),
    )
    tick = datetime.now(UTC).replace(microsecond=0)
    run_key = run_key_for(tick)
    assert "success" == await firing.fire(Fire(job, tick, Identity.schedule("traced", run_key)))

    spans = {span.name: span for span in exporter.get_finished_spans()}
    assert {"pgcrond.attempt", "claim", "run", "record"} == set(spans)
    root = spans["pgcrond.attempt"]
    assert root.parent is None
    for child in ("claim", "run", "record"):
        assert root.context.span_id == spans[child].parent.span_id  # type: ignore[union-attr]
        assert root.context.trace_id == spans[child].context.trace_id
    assert spans["claim"].end_time <= spans["run"].start_time  # type: ignore[operator]
    assert spans["run"].end_time <= spans["record"].start_time  # type: ignore[operator]
    attributes = dict(root.attributes or {})
    assert {
        "pgcrond.job": "traced",
        "pgcrond.run_key": run_key,
        "pgcrond.attempt": 1,
        "pgcrond.replica": "host:1",
        "pgcrond.outcome": "success",
    }.items() <= attributes.items()
    assert isinstance(attributes["pgcrond.lateness_s"], float)
    # W3C: version-trace id-parent id-flags; the job's parent is the run span.
    version, trace_id, parent_id, _ = out.read_text().split("-")
    assert ("00", f"{root.context.trace_id:032x}") == (version, trace_id)
    assert f"{spans['run'].context.span_id:016x}" == parent_id


def test_tracing_is_asked_for_by_the_otel_variables_only() -> None:
    assert not tracing_wanted({})
    assert tracing_wanted({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://collector:4318"})
    assert tracing_wanted({"OTEL_TRACES_EXPORTER": "otlp"})
    assert not tracing_wanted({"OTEL_TRACES_EXPORTER": "none", "OTEL_EXPORTER_OTLP_ENDPOINT": "x"})
    assert not tracing_wanted({"OTEL_SDK_DISABLED": "true", "OTEL_TRACES_EXPORTER": "otlp"})


@pytest.mark.usefixtures("subprocesses")
def test_a_daemon_without_the_otel_variables_imports_no_opentelemetry() -> None:
    """What ``pgcrond run`` imports, and its observers made, in a fresh interpreter."""
    probe = (
        "import sys, asyncio\n"
        "import pgcrond.daemon.command, pgcrond.daemon.lifecycle\n"
        "from pgcrond.daemon import observers\n"
        "from pgcrond.daemon.hooks import Hooks\n"
        "from pgcrond.daemon.metrics import Metrics\n"
        "found = observers.subscribers(None, Hooks('r'), Metrics(), 'r')\n"
        "print(sorted(type(s).__name__ for s in found))\n"
        "print(sorted(m for m in sys.modules if m.startswith('opentelemetry')))\n"
    )
    env = {"PATH": "/usr/bin:/bin"}
    done = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, env=env, check=True
    )
    observed, imported = done.stdout.splitlines()
    assert "['Watched']" == observed
    assert "[]" == imported


@pytest.mark.slow
@pytest.mark.usefixtures("system_processes")
def test_a_daemon_asked_for_traces_exports_the_attempt_over_otlp(
    pg_dsn: str, schema: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """OTEL_EXPORTER_OTLP_ENDPOINT names a local receiver: the run's spans reach it, and the
    job's TRACEPARENT names their trace."""
    out = tmp_path / "traceparent"
    with receiving() as receiver:
        monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", receiver.base)
        monkeypatch.setenv("OTEL_BSP_SCHEDULE_DELAY", "100")
        jobs = f'  traced:\n    at: "{at(2)}"\n    shell: \'printf %s "$TRACEPARENT" > {out}\'\n'
        with cluster(pg_dsn, schema, tmp_path) as running:
            (replica,) = running.start(running.write_config(config(schema, jobs)), 1)
            replica.wait_event("tracing_on")
            # The batch processor exports what has ended: the run's spans may reach
            # the receiver in more than one post (the record ends after the run).
            wait_until(
                lambda: {"pgcrond.attempt", "record"} <= {s.name for s in exported(receiver)},
                30,
                "the attempt's spans over OTLP",
            )
            running.stop_all()
    spans = exported(receiver)
    assert ["claim", "pgcrond.attempt", "record", "run"] == sorted(s.name for s in spans)
    _, trace_id, parent_id, _ = out.read_text().split("-")
    assert {trace_id} == {s.trace_id.hex() for s in spans}
    assert [parent_id] == [s.span_id.hex() for s in spans if s.name == "run"]


def exported(receiver: Receiver) -> list[Span]:
    """Every span the receiver was sent, in the order they came."""
    spans: list[Span] = []
    for posted in receiver.pings("/v1/traces"):
        request = ExportTraceServiceRequest.FromString(posted.body)
        spans += [s for r in request.resource_spans for ss in r.scope_spans for s in ss.spans]
    return spans
