"""The runner with real child processes: environment, argv, output, exit codes, stops.

Also the pure retry backoff.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import json
import os
import random
import signal
import sys
import tracemalloc
from collections.abc import Iterable, Mapping
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from structlog.testing import capture_logs

from pgcrond.core.actions import CommandAction, ShellAction
from pgcrond.core.box import Box
from pgcrond.core.cancel import Cancellation
from pgcrond.core.outcome import RunResult
from pgcrond.core.retry import retry_delay
from pgcrond.run import command
from pgcrond.run.runner import execute
from tests.jobs_fixture import (
    RUN_KEY,
    docs_example,
    is_alive,
    make_request,
    wait_for_line,
    wait_for_path,
    wait_until_session_gone,
)

pytestmark = [pytest.mark.timeout(30), pytest.mark.usefixtures("subprocesses")]

DUMP_ENV = "import json, os, sys; open(sys.argv[1], 'w').write(json.dumps(dict(os.environ)))"


def output_lines(logs: Iterable[Mapping[str, Any]], stream: str = "stdout") -> list[str]:
    return [e["line"] for e in logs if e["event"] == "job_output" and e["stream"] == stream]


async def run_env(tmp_path: Path, **overrides: Any) -> tuple[RunResult, dict[str, str]]:
    out = tmp_path / "env.json"
    action = CommandAction((sys.executable, "-c", DUMP_ENV, str(out)))
    result = await execute(make_request(action, **overrides), Cancellation())
    return result, json.loads(out.read_text())


# -- environment ----------------------------------------------------------------


async def test_child_gets_every_run_variable_and_the_job_env(tmp_path: Path) -> None:
    before = datetime.now(UTC)
    result, env = await run_env(
        tmp_path,
        attempt=2,
        fencing_token=41,
        timeout=timedelta(seconds=20),
        env={"REPORT_TO": "ops@example.org"},
    )
    request = make_request(CommandAction(("true",)))
    assert "success" == result.outcome
    expected = {
        "PGCRON_IDEMPOTENCY_KEY": request.idempotency_key,
        "PGCRON_IDEMPOTENCY_KEY_HEX": request.idempotency_key_hex,
        "PGCRON_JOB": "report",
        "PGCRON_RUN_KEY": RUN_KEY,
        "PGCRON_FIRE_TIME": "2026-03-29T01:30:00Z",
        "PGCRON_ATTEMPT": "2",
        "PGCRON_FENCING_TOKEN": "41",
    }
    assert expected == {k: env[k] for k in expected}
    assert "ops@example.org" == env["REPORT_TO"]
    assert request.idempotency_key.startswith("v2:")
    assert 64 == len(request.idempotency_key_hex)
    deadline = datetime.fromisoformat(env["PGCRON_DEADLINE"])
    assert env["PGCRON_DEADLINE"].endswith("Z")
    assert before + timedelta(seconds=20) <= deadline <= datetime.now(UTC) + timedelta(seconds=20)


async def test_secrets_of_the_daemon_are_not_inherited(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    for name in ("PGPASSWORD", "PGPASSFILE", "DATABASE_URL", "PGCROND_DATABASE_URL"):
        monkeypatch.setenv(name, "s3cret")
    monkeypatch.setenv("ORDINARY", "kept")
    # Left over from some other run: must not describe this one.
    monkeypatch.setenv("PGCRON_FENCING_TOKEN", "999")
    monkeypatch.setenv("PGCRON_DEADLINE", "2000-01-01T00:00:00Z")
    # Even with everything passed through (env_passthrough: ["*"], the old default).
    _, env = await run_env(tmp_path, box=Box(env_passthrough=("*",)))
    leaked = {"PGPASSWORD", "PGPASSFILE", "DATABASE_URL", "PGCROND_DATABASE_URL"} & env.keys()
    assert set() == leaked
    assert "kept" == env["ORDINARY"]
    assert "PGCRON_FENCING_TOKEN" not in env
    assert "PGCRON_DEADLINE" not in env


async def test_job_env_may_ask_for_a_secret_explicitly_but_not_override_run_variables(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PGPASSWORD", "daemon")
    _, env = await run_env(tmp_path, env={"PGPASSWORD": "job", "PGCRON_ATTEMPT": "7"})
    assert "job" == env["PGPASSWORD"]
    assert "1" == env["PGCRON_ATTEMPT"]


# -- argv and injection -------------------------------------------------------------


async def test_argv_elements_arrive_verbatim_and_nothing_is_interpreted(tmp_path: Path) -> None:
    marker = tmp_path / "x"
    hostile = [
        "two words",
        'it\'s "quoted"',
        f"$(touch {marker})",
        f"; touch {marker}",
        f"`touch {marker}`; rm -rf",
        "$HOME",
        "*",
        "",
    ]
    out = tmp_path / "argv.json"
    dump = "import json, sys; open(sys.argv[1], 'w').write(json.dumps(sys.argv[2:]))"
    action = CommandAction((sys.executable, "-c", dump, str(out), *hostile))
    result = await execute(make_request(action), Cancellation())
    assert "success" == result.outcome
    assert hostile == json.loads(out.read_text())
    assert not marker.exists()


async def test_job_fields_reach_a_shell_as_data_not_code(tmp_path: Path) -> None:
    marker = tmp_path / "x"
    run_key = f"manual:$(touch {marker});`touch {marker}`"
    action = ShellAction('printf "%s\\n" "$PGCRON_RUN_KEY"')
    with capture_logs() as logs:
        result = await execute(make_request(action, run_key=run_key), Cancellation())
    assert "success" == result.outcome
    assert [run_key] == output_lines(logs)
    assert not marker.exists()


# -- output -------------------------------------------------------------------------


async def test_output_lines_are_logged_with_job_run_key_and_stream() -> None:
    action = ShellAction("echo one; echo two >&2; printf 'no newline'")
    with capture_logs() as logs:
        await execute(make_request(action), Cancellation())
    output = [
        (e["job"], e["run_key"], e["stream"], e["line"]) for e in logs if e["event"] == "job_output"
    ]
    assert [
        ("report", RUN_KEY, "stdout", "one"),
        ("report", RUN_KEY, "stdout", "no newline"),
    ] == [o for o in output if o[2] == "stdout"]
    assert [("report", RUN_KEY, "stderr", "two")] == [o for o in output if o[2] == "stderr"]


async def test_a_long_line_is_cut_to_the_line_cap_and_marked() -> None:
    action = ShellAction("head -c 10000 /dev/zero | tr '\\0' a; echo; echo short")
    with capture_logs() as logs:
        await execute(make_request(action), Cancellation())
    events = [e for e in logs if e["event"] == "job_output"]
    assert ["a" * command.OUTPUT_LINE_CAP, "short"] == [e["line"] for e in events]
    assert [True, False] == [e.get("truncated", False) for e in events]


async def test_twenty_megabytes_of_output_complete_within_the_run_cap_and_bounded_memory() -> None:
    line_count, line_size = 320, 64 * 1024
    write = (
        f"import sys; line = b'x' * {line_size - 1} + b'\\n'\n"
        f"for _ in range({line_count}): sys.stdout.buffer.write(line)"
    )
    action = CommandAction((sys.executable, "-c", write))
    tracemalloc.start()
    try:
        with capture_logs() as logs:
            result = await execute(make_request(action), Cancellation())
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert "success" == result.outcome
    logged = sum(len(e["line"]) for e in logs if e["event"] == "job_output")
    assert logged <= command.OUTPUT_RUN_CAP
    assert logged > command.OUTPUT_RUN_CAP - command.OUTPUT_LINE_CAP
    assert 1 == sum(e["event"] == "job_output_truncated" for e in logs)
    assert peak < 8 * 1024 * 1024, f"peak {peak} bytes while reading {line_count * line_size}"


# -- exit codes ---------------------------------------------------------------------


@pytest.mark.parametrize(
    ("script", "outcome", "error", "exit_code"),
    [
        ("exit 0", "success", None, 0),
        ("exit 3", "fail", "exit status 3", 3),
        ("kill -KILL $$", "fail", "killed by signal SIGKILL", None),
        ("kill -SEGV $$", "fail", "killed by signal SIGSEGV", None),
    ],
)
async def test_the_exit_status_decides_the_outcome(
    script: str, outcome: str, error: str | None, exit_code: int | None
) -> None:
    result = await execute(make_request(ShellAction(script)), Cancellation())
    assert (outcome, error, exit_code) == (result.outcome, result.error, result.exit_code)


async def test_a_missing_program_is_a_failure_not_an_exception() -> None:
    action = CommandAction(("/nonexistent/report-sender",))
    result = await execute(make_request(action), Cancellation())
    assert "fail" == result.outcome
    assert result.error is not None
    assert result.error.startswith("cannot start: FileNotFoundError")


async def test_the_job_cwd_is_the_working_directory(tmp_path: Path) -> None:
    with capture_logs() as logs:
        await execute(make_request(ShellAction("pwd"), cwd=tmp_path), Cancellation())
    assert [str(tmp_path)] == output_lines(logs)


# -- stopping -------------------------------------------------------------------------

# The leader writes its pid (= process group = session) and its descendants'
# pids, then "ready"; a grandchild hides inside a nested shell.
FAMILY = """
echo $$ > "$DIR/session"
sleep 1000 &
echo $! >> "$DIR/pids"
sh -c 'sleep 1000 & echo $! >> "$DIR/pids"; wait' &
echo $! >> "$DIR/pids"
while [ "$(wc -l < "$DIR/pids")" -lt 3 ]; do sleep 0.01; done
touch "$DIR/ready"
wait
"""


async def test_timeout_kills_the_whole_process_group_including_grandchildren(
    tmp_path: Path,
) -> None:
    request = make_request(
        ShellAction(FAMILY), env={"DIR": str(tmp_path)}, timeout=timedelta(seconds=2)
    )
    cancellation = Cancellation()
    run = asyncio.create_task(execute(request, cancellation))
    await wait_for_path(tmp_path / "ready")
    pids = [int(p) for p in (tmp_path / "pids").read_text().split()]
    assert all(is_alive(pid) for pid in pids)
    result = await run
    assert ("timeout", "timeout after 2s") == (result.outcome, result.error)
    assert "timeout" == cancellation.reason
    session = int((tmp_path / "session").read_text())
    assert [] == await wait_until_session_gone(session)


async def test_background_children_do_not_outlive_a_successful_run(tmp_path: Path) -> None:
    script = 'echo $$ > "$DIR/session"; sleep 1000 & exit 0'
    request = make_request(ShellAction(script), env={"DIR": str(tmp_path)})
    result = await execute(request, Cancellation())
    assert "success" == result.outcome
    session = int((tmp_path / "session").read_text())
    assert [] == await wait_until_session_gone(session)


async def test_a_grandchild_ignoring_sigterm_dies_when_its_leader_exits_on_timeout(
    tmp_path: Path,
) -> None:
    # The leader stops politely on SIGTERM; its child ignores SIGTERM and would
    # be orphaned if the runner only waited for the leader.
    script = """
    echo $$ > "$DIR/session"
    trap 'exit 0' TERM
    sh -c 'trap "" TERM; touch "$DIR/ready"; sleep 1000' &
    wait
    """
    request = make_request(
        ShellAction(script),
        env={"DIR": str(tmp_path)},
        timeout=timedelta(seconds=1),
        stop_grace=timedelta(seconds=10),
    )
    with capture_logs() as logs:
        run = asyncio.create_task(execute(request, Cancellation()))
        await wait_for_path(tmp_path / "ready")
        result = await run
    assert "timeout" == result.outcome
    assert result.duration_s < 5, "the leader exited at SIGTERM; no need to wait the grace"
    assert [] == [e for e in logs if e["event"] == "job_killed"]
    session = int((tmp_path / "session").read_text())
    assert [] == await wait_until_session_gone(session)


async def test_a_child_ignoring_sigterm_is_killed_after_the_stop_grace(tmp_path: Path) -> None:
    script = 'trap "" TERM; touch "$DIR/ready"; sleep 1000'
    request = make_request(
        ShellAction(script), env={"DIR": str(tmp_path)}, stop_grace=timedelta(seconds=0.5)
    )
    cancellation = Cancellation()
    with capture_logs() as logs:
        run = asyncio.create_task(execute(request, cancellation))
        await wait_for_path(tmp_path / "ready")
        cancellation.cancel("shutdown")
        result = await run
    assert ("cancelled", "cancelled: shutdown") == (result.outcome, result.error)
    assert result.duration_s >= 0.5
    stops = [
        (e["event"], e["signal"]) for e in logs if e["event"] in ("job_stopping", "job_killed")
    ]
    assert [("job_stopping", "SIGTERM"), ("job_killed", "SIGKILL")] == stops


async def test_a_command_that_exits_0_when_stopped_is_still_cancelled(tmp_path: Path) -> None:
    script = 'trap "exit 0" TERM; touch "$DIR/ready"; sleep 1000 & wait'
    request = make_request(ShellAction(script), env={"DIR": str(tmp_path)})
    cancellation = Cancellation()
    run = asyncio.create_task(execute(request, cancellation))
    await wait_for_path(tmp_path / "ready")
    cancellation.cancel("lease_lost")
    result = await run
    assert ("cancelled", "cancelled: lease_lost", 0) == (
        result.outcome,
        result.error,
        result.exit_code,
    )


async def test_a_run_cancelled_before_it_starts_starts_nothing(tmp_path: Path) -> None:
    cancellation = Cancellation()
    cancellation.cancel("shutdown")
    marker = tmp_path / "started"
    result = await execute(make_request(ShellAction(f"touch {marker}")), cancellation)
    assert ("cancelled", "cancelled: shutdown") == (result.outcome, result.error)
    assert not marker.exists()


async def test_the_runner_being_cancelled_kills_the_group(tmp_path: Path) -> None:
    script = 'echo $$ > "$DIR/session"; sleep 1000'
    request = make_request(ShellAction(script), env={"DIR": str(tmp_path)})
    run = asyncio.create_task(execute(request, Cancellation()))
    session = int(await wait_for_line(tmp_path / "session"))
    run.cancel()
    with pytest.raises(asyncio.CancelledError):
        await run
    assert [] == await wait_until_session_gone(session)


async def test_a_run_cancelled_while_its_pipes_are_set_up_leaves_no_fd_open(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Cancelled at each step before (and around) its child's start, a run closes
    every fd it made, and leaves asyncio nothing to complain of: a stop may come
    at any instant."""
    request = make_request(CommandAction(("true",)))
    before = _open_fds()
    for steps in range(8):
        run = asyncio.create_task(execute(request, Cancellation()))
        for _ in range(steps):
            await asyncio.sleep(0)
        run.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await run
    # A cancelled reader's pipe is closed by its transport a loop turn or two later.
    for _ in range(200):
        if not _open_fds() - before:
            break
        await asyncio.sleep(0.01)
    # Only fds opened meanwhile count: others may close as earlier tests' objects go.
    assert set() == {_fd_target(fd) for fd in _open_fds() - before}
    gc.collect()  # an unread exception is logged when its future goes
    assert [] == [r.getMessage() for r in caplog.records if r.name == "asyncio"]


async def test_a_start_cancelled_after_the_fork_ends_with_its_child_killed_and_nothing_said(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """asyncio's own clean-up of a start cancelled after its fork reaps the child
    beside the child watcher, which then logs at WARNING (seen in CI under load):
    the start is let finish, its child killed, and only then is it cancelled."""
    started: asyncio.Future[asyncio.subprocess.Process] = asyncio.Future()

    async def spawn() -> asyncio.subprocess.Process:
        process = await asyncio.create_subprocess_exec(
            sys.executable, "-c", "import time; time.sleep(60)", start_new_session=True
        )
        started.set_result(process)
        await asyncio.sleep(0.3)  # the start's own wait, which the cancellation lands in
        return process

    start = asyncio.ensure_future(command._started(spawn))
    child = await asyncio.wait_for(started, 30)
    start.cancel()
    with pytest.raises(asyncio.CancelledError):
        await start
    assert -signal.SIGKILL == await asyncio.wait_for(child.wait(), 30)
    assert [] == [r.getMessage() for r in caplog.records if r.name == "asyncio"]


def _open_fds() -> set[int]:
    return {int(fd) for fd in os.listdir("/proc/self/fd")}


def _fd_target(fd: int) -> str:
    try:
        return f"{fd} -> {os.readlink(f'/proc/self/fd/{fd}')}"
    except OSError:
        return f"{fd} (closed meanwhile)"


# -- documentation --------------------------------------------------------------------


async def test_the_shell_example_in_the_docs_sends_once_per_idempotency_key(
    tmp_path: Path,
) -> None:
    action = ShellAction(docs_example("shell"))
    lines = []
    for attempt in (1, 2):
        request = make_request(action, attempt=attempt, env={"STATE_DIR": str(tmp_path)})
        with capture_logs() as logs:
            result = await execute(request, Cancellation())
        assert "success" == result.outcome
        lines += output_lines(logs)
    key = make_request(action).idempotency_key
    assert [
        f"sending report for {RUN_KEY} with key {key}",
        f"report already sent for {RUN_KEY} (attempt 2)",
    ] == lines


# -- retry backoff ----------------------------------------------------------------------


def test_retry_delay_doubles_with_each_attempt_within_equal_jitter() -> None:
    base = timedelta(seconds=10)
    rng = random.Random(7)
    for attempt in range(1, 8):
        full = base * 2 ** (attempt - 1)
        delay = retry_delay(attempt, base, rng=rng)
        assert full / 2 <= delay < full, attempt


def test_retry_delay_is_capped_even_for_huge_attempts() -> None:
    cap = timedelta(minutes=5)
    for attempt in (20, 10_000):
        delay = retry_delay(attempt, timedelta(seconds=1), cap=cap, rng=random.Random(1))
        assert cap / 2 <= delay <= cap


def test_retry_delay_is_never_zero() -> None:
    class Zero(random.Random):
        def random(self) -> float:
            return 0.0

    assert timedelta(seconds=5) == retry_delay(1, timedelta(seconds=10), rng=Zero())
    assert timedelta(0) < retry_delay(1, timedelta(microseconds=1), rng=Zero())


def test_retry_delays_of_simultaneous_failures_spread_out() -> None:
    delays = {retry_delay(3, timedelta(seconds=10), rng=random.Random(seed)) for seed in range(20)}
    assert len(delays) > 15


@pytest.mark.parametrize(
    ("attempt", "base"), [(0, timedelta(seconds=1)), (1, timedelta(0)), (1, timedelta(-1))]
)
def test_retry_delay_rejects_nonsense(attempt: int, base: timedelta) -> None:
    with pytest.raises(ValueError, match="must be"):
        retry_delay(attempt, base)


def test_a_naive_fire_time_is_refused() -> None:
    with pytest.raises(ValueError, match="timezone-aware"):
        make_request(ShellAction("true"), fire_time=datetime(2026, 3, 29, 1, 30))
