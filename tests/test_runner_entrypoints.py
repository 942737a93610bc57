"""The runner with Python entrypoints: in a thread, on the loop, and isolated in a child."""

from __future__ import annotations

import asyncio
import dataclasses
import gc
import json
import os
import sys
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from structlog.testing import capture_logs

from pgcrond.core.actions import EntrypointAction
from pgcrond.core.cancel import Cancellation
from pgcrond.run.attempt import RunRequest
from pgcrond.run.context import RunContext
from pgcrond.run.runner import execute
from tests import jobs_fixture
from tests.jobs_fixture import RUN_KEY, docs_example, is_alive, make_request, wait_for_path

pytestmark = [pytest.mark.timeout(30), pytest.mark.usefixtures("subprocesses")]

FIXTURE = "tests.jobs_fixture"

# (target, isolate): every way an entrypoint can run.
MODES = [
    pytest.param("write_context", False, id="sync"),
    pytest.param("write_context_async", False, id="async"),
    pytest.param("write_context", True, id="isolated-sync"),
    pytest.param("write_context_async", True, id="isolated-async"),
]


def entrypoint(name: str, isolate: bool = False) -> EntrypointAction:
    return EntrypointAction(f"{FIXTURE}:{name}", isolate=isolate)


async def wait_started(run_key: str) -> None:
    started = await asyncio.to_thread(jobs_fixture.STARTED[run_key].wait, 10)
    assert started, "the entrypoint never started"


async def start(request: RunRequest, cancellation: Cancellation) -> asyncio.Task[Any]:
    run = asyncio.create_task(execute(request, cancellation))
    await wait_started(request.run_key)
    return run


@pytest.mark.parametrize(("name", "isolate"), MODES)
async def test_the_context_describes_the_run(name: str, isolate: bool, tmp_path: Path) -> None:
    out = tmp_path / "context.json"
    before = datetime.now(UTC)
    request = make_request(
        entrypoint(name, isolate),
        attempt=3,
        fencing_token=12,
        timeout=timedelta(seconds=20),
        env={"OUT": str(out)},
        cwd=tmp_path,
    )
    with capture_logs() as logs:
        result = await execute(request, Cancellation())
    assert ("success", None) == (result.outcome, result.error)
    seen = json.loads(out.read_text())
    expected = {
        "job": "report",
        "run_key": RUN_KEY,
        "fire_time": "2026-03-29T01:30:00+00:00",
        "attempt": 3,
        "idempotency_key": request.idempotency_key,
        "idempotency_key_hex": request.idempotency_key_hex,
        "fencing_token": 12,
        "cwd": str(tmp_path),
    }
    assert expected == {k: seen[k] for k in expected}
    deadline = datetime.fromisoformat(seen["deadline"])
    assert before + timedelta(seconds=20) <= deadline <= datetime.now(UTC) + timedelta(seconds=20)
    assert "3" == seen["env"]["PGCRON_ATTEMPT"]
    assert str(out) == seen["env"]["OUT"]
    if isolate:
        assert os.getpid() != seen["pid"]
        assert (str(tmp_path), "3") == (seen["process_cwd"], seen["process_attempt"])
        # The child logs JSON to stderr, which the runner logs as job output.
        lines = [json.loads(e["line"]) for e in logs if e["event"] == "job_output"]
        assert [("context_seen", "report", RUN_KEY)] == [
            (line["event"], line["job"], line["run_key"]) for line in lines
        ]
    else:
        assert [("report", RUN_KEY)] == [
            (e["job"], e["run_key"]) for e in logs if e["event"] == "context_seen"
        ]


async def test_an_in_process_entrypoint_sees_the_stripped_environment_in_its_context(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PGPASSWORD", "s3cret")
    out = tmp_path / "context.json"
    await execute(make_request(entrypoint("write_context"), env={"OUT": str(out)}), Cancellation())
    env = json.loads(out.read_text())["env"]
    assert "PGPASSWORD" not in env
    assert "PGCRON_FENCING_TOKEN" not in env


@pytest.mark.parametrize(
    ("name", "isolate"),
    [
        pytest.param("raise_value_error", False, id="sync"),
        pytest.param("raise_value_error_async", False, id="async"),
        pytest.param("raise_value_error", True, id="isolated"),
    ],
)
async def test_an_entrypoint_that_raises_fails_with_type_and_message(
    name: str, isolate: bool
) -> None:
    result = await execute(make_request(entrypoint(name, isolate)), Cancellation())
    assert ("fail", "ValueError: boom") == (result.outcome, result.error)


async def test_a_huge_error_message_is_capped() -> None:
    request = make_request(entrypoint("raise_value_error"), env={"MESSAGE": "x" * 10_000})
    result = await execute(request, Cancellation())
    assert result.error is not None
    assert ("fail", 2000) == (result.outcome, len(result.error))
    assert result.error.startswith("ValueError: xxx")


async def test_sys_exit_in_an_entrypoint_is_a_failure_not_the_daemons_exit() -> None:
    result = await execute(make_request(entrypoint("exit_3")), Cancellation())
    assert ("fail", "SystemExit: 3") == (result.outcome, result.error)


@pytest.mark.parametrize("isolate", [False, True], ids=["in-process", "isolated"])
async def test_an_unresolvable_target_is_a_failure(isolate: bool) -> None:
    action = EntrypointAction("tests.no_such_module:job", isolate=isolate)
    result = await execute(make_request(action), Cancellation())
    assert "fail" == result.outcome
    assert result.error is not None
    assert result.error.startswith("EntrypointError: cannot import module 'tests.no_such_module'")


# -- cancellation and timeout, in process --------------------------------------------


@pytest.mark.parametrize(
    "name",
    ["wait_then_check", "wait_then_return", "wait_then_return_async"],
)
async def test_cancellation_reaches_a_cooperative_entrypoint_and_it_is_never_a_success(
    name: str,
) -> None:
    run_key = f"manual:{name}"
    cancellation = Cancellation()
    run = await start(make_request(entrypoint(name), run_key=run_key), cancellation)
    cancellation.cancel("lease_lost")
    result = await run
    assert ("cancelled", "cancelled: lease_lost") == (result.outcome, result.error)
    assert "lease_lost" == jobs_fixture.SEEN[run_key]
    assert result.duration_s < 5, "a cooperative job stops without waiting the grace"


async def test_timeout_sets_the_cancellation_a_sync_entrypoint_waits_on() -> None:
    run_key = "manual:timeout"
    request = make_request(
        entrypoint("wait_then_check"), run_key=run_key, timeout=timedelta(seconds=0.5)
    )
    cancellation = Cancellation()
    result = await execute(request, cancellation)
    assert ("timeout", "timeout after 0.5s") == (result.outcome, result.error)
    assert "timeout" == jobs_fixture.SEEN[run_key] == cancellation.reason


async def test_an_async_entrypoint_ignoring_cancellation_is_cancelled_within_the_grace() -> None:
    """Half the grace to notice, half to unwind: the whole stop fits in one grace."""
    run_key = "manual:async-ignores"
    cancellation = Cancellation()
    run = await start(
        make_request(entrypoint("ignore_cancel_async"), run_key=run_key), cancellation
    )
    cancellation.cancel("shutdown")
    result = await run
    assert ("cancelled", "cancelled: shutdown") == (result.outcome, result.error)
    assert "task_cancelled" == jobs_fixture.SEEN[run_key]
    assert 0.15 <= result.duration_s < 0.3


async def test_a_sync_entrypoint_ignoring_cancellation_is_abandoned_after_the_grace() -> None:
    run_key = "manual:sync-ignores"
    cancellation = Cancellation()
    try:
        with capture_logs() as logs:
            run = await start(
                make_request(entrypoint("ignore_cancel"), run_key=run_key), cancellation
            )
            cancellation.cancel("lease_lost")
            result = await run
    finally:
        jobs_fixture.RELEASE[run_key].set()
    assert ("cancelled", "cancelled: lease_lost") == (result.outcome, result.error)
    assert 0.3 <= result.duration_s < 5
    assert ["entrypoint_thread_abandoned"] == [
        e["event"] for e in logs if e["event"].startswith("entrypoint_")
    ]


# -- isolate: true -------------------------------------------------------------------


async def test_an_isolated_entrypoint_is_killed_on_timeout(tmp_path: Path) -> None:
    pid_file = tmp_path / "pid"
    request = make_request(
        entrypoint("sleep_ignoring_cancel", isolate=True),
        env={"OUT": str(pid_file)},
        timeout=timedelta(seconds=2),
    )
    with capture_logs() as logs:
        run = asyncio.create_task(execute(request, Cancellation()))
        await wait_for_path(pid_file)
        result = await run
    assert ("timeout", "timeout after 2s") == (result.outcome, result.error)
    assert ["job_stopping", "job_killed"] == [
        e["event"] for e in logs if e["event"] in ("job_stopping", "job_killed")
    ]
    assert not is_alive(int(pid_file.read_text()))


async def test_sigterm_sets_the_cancellation_inside_an_isolated_entrypoint(tmp_path: Path) -> None:
    pid_file = tmp_path / "pid"
    request = make_request(
        entrypoint("wait_for_sigterm", isolate=True),
        env={"OUT": str(pid_file)},
        stop_grace=timedelta(seconds=20),
    )
    cancellation = Cancellation()
    with capture_logs() as logs:
        run = asyncio.create_task(execute(request, cancellation))
        await wait_for_path(pid_file)
        cancellation.cancel("lease_lost")
        result = await run
    assert ("cancelled", "cancelled: lease_lost") == (result.outcome, result.error)
    assert result.duration_s < 10, "stopped at SIGTERM, long before the 20 s grace"
    assert [] == [e for e in logs if e["event"] == "job_killed"]


# -- documentation --------------------------------------------------------------------


@pytest.mark.parametrize("isolate", [False, True], ids=["in-process", "isolated"])
async def test_the_python_example_in_the_docs_sends_once_per_idempotency_key(
    isolate: bool, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    package = tmp_path / "code"
    package.mkdir()
    (package / "reports.py").write_text(docs_example("python"))
    monkeypatch.syspath_prepend(str(package))
    monkeypatch.delitem(sys.modules, "reports", raising=False)
    state = tmp_path / "state"
    state.mkdir()
    events = []
    for attempt in (1, 2):
        request = make_request(
            EntrypointAction("reports:send_report", isolate=isolate),
            attempt=attempt,
            env={"STATE_DIR": str(state)},
        )
        with capture_logs() as logs:
            result = await execute(request, Cancellation())
        assert "success" == result.outcome
        if isolate:
            events += [json.loads(e["line"]) for e in logs if e["event"] == "job_output"]
        else:
            events += logs
    key = make_request(EntrypointAction("reports:send_report")).idempotency_key
    assert [
        ("report_page_sent", 0, key),
        ("report_page_sent", 1, key),
        ("report_page_sent", 2, key),
        ("report_already_sent", None, None),
    ] == [(e["event"], e.get("page"), e.get("key")) for e in events]
    assert 2 == events[-1]["attempt"]


async def prints_and_reads_its_environment(ctx: RunContext) -> None:
    print("a line", file=ctx.stdout)
    assert ctx.env["PGCRON_JOB"] == ctx.job


@pytest.mark.parametrize("name", ["prints_and_reads_its_environment", "write_context_async"])
async def test_a_run_leaves_no_reference_cycle_of_its_own(name: str, tmp_path: Path) -> None:
    """What a run makes is freed by reference counting alone: ten thousand
    co-firing runs' cycles made the collector hold the loop for 70-350 ms at
    a time."""
    module = "tests.test_runner_entrypoints" if name.startswith("prints") else FIXTURE
    request = make_request(
        EntrypointAction(f"{module}:{name}"), env={"OUT": str(tmp_path / "context.json")}
    )
    gc.collect()
    gc.disable()
    gc.set_debug(gc.DEBUG_SAVEALL)
    try:
        result = await execute(request, Cancellation())
        gc.collect()
        ours = [
            type(o).__qualname__ for o in gc.garbage if type(o).__module__.startswith("pgcrond")
        ]
    finally:
        gc.set_debug(0)
        gc.garbage.clear()
        gc.enable()
    assert "success" == result.outcome, result.error
    assert [] == ours


async def test_an_isolated_entrypoint_s_host_imports_nothing_from_its_working_directory(
    tmp_path: Path,
) -> None:
    """A ``json.py`` planted where the job runs is never imported by the host (as root)."""
    planted = tmp_path / "planted"
    (tmp_path / "json.py").write_text(f"open({str(planted)!r}, 'w').close()\n")
    out = tmp_path / "context.json"
    request = make_request(entrypoint("write_context", isolate=True), env={"OUT": str(out)})
    request = dataclasses.replace(request, cwd=tmp_path)
    result = await execute(request, Cancellation())
    assert ("success", False) == (result.outcome, planted.exists())
