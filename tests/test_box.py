"""Each job in its own box, with real processes (as root on this machine).

A job's ``user:`` is the user its processes run as; ``limits:`` are enforced by
a cgroup per attempt where one can be made (here: the v1 hierarchies) and by
rlimits where none can (``cgroups: never``, or a user who may write no
cgroup); the whole cgroup is killed at the end of an attempt, so a grandchild
that left the process group with ``setsid`` is gone with it.
"""

from __future__ import annotations

import asyncio
import contextlib
import grp
import json
import os
import pwd
import signal
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from structlog.testing import capture_logs

from pgcrond.config.loader import load_config
from pgcrond.config.models import JobConfig
from pgcrond.core.box import Box
from pgcrond.core.cancel import Cancellation
from pgcrond.core.outcome import RunResult
from pgcrond.run import box
from pgcrond.run.runner import execute
from tests.helpers.as_nobody import HOG, ROOT_ONLY, nobody_python
from tests.jobs_fixture import logged_run, make_request

pytestmark = [pytest.mark.timeout(60), pytest.mark.usefixtures("subprocesses")]

NOBODY = 65534


@pytest.fixture
def by_rlimits() -> Iterator[box.Host]:
    """This process boxes jobs as a host without cgroups would (``cgroups: never``)."""
    try:
        yield box.configure("never")
    finally:
        box.configure("auto")


@pytest.fixture
def by_cgroups() -> box.Host:
    found = box.configure("auto")
    if found.mode == "rlimits":
        pytest.skip(f"no cgroup can be made here: {found.reason}")
    return found


def load_job(tmp_path: Path, job: str, *, top: str = "") -> JobConfig:
    path = tmp_path / "jobs.yaml"
    path.write_text(
        "database: {url: 'postgresql://app@db/jobs'}\n"
        + top
        + "jobs:\n  job:\n    once: true\n"
        + textwrap.indent(textwrap.dedent(job), "    ")
    )
    return load_config([path]).jobs["job"]


async def run_job(job: JobConfig, **overrides: Any) -> tuple[RunResult, list[str]]:
    """Run ``job``'s action with its box and environment; its stdout lines as logged."""
    request = make_request(job.action, env=job.env, box=job.box, **overrides)
    with capture_logs() as logs:
        result = await execute(request, Cancellation())
    return result, [e["line"] for e in logs if e["event"] == "job_output"]


def processes_with(marker: str) -> list[int]:
    """Every live process whose command line holds ``marker``, found by scanning /proc."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode()
            state = (entry / "stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue  # ended while we looked
        if marker in cmdline and state != "Z":
            found.append(int(entry.name))
    return found


def check_as_nobody(config: str, *flags: str) -> subprocess.CompletedProcess[str]:
    """`pgcrond check` run as nobody, the config on its standard input."""
    python, environ = nobody_python()
    return subprocess.run(
        [*python, "-m", "pgcrond", "check", *flags, "-"],
        input=config,
        env=environ,
        check=False,
        capture_output=True,
        text=True,
        timeout=30,
        cwd="/",
    )


def escaping(pidfile: Path, marker: str) -> str:
    """A script whose grandchild leaves the process group (setsid), writes its pid and
    sleeps; the script waits until it has, then sleeps past its timeout."""
    grandchild = (
        f"setsid sh -c 'echo $$ > {pidfile}.tmp; mv {pidfile}.tmp {pidfile}; exec sleep {marker}'"
    )
    return f"{grandchild} & while [ ! -e {pidfile} ]; do sleep 0.01; done; sleep 300"


def escapee(pidfile: Path, marker: str) -> tuple[int, list[int]]:
    """The pid the grandchild wrote, and the live processes running its command."""
    assert pidfile.exists(), "the grandchild never started: the test proves nothing"
    return int(pidfile.read_text()), processes_with(marker)


# -- user and group --------------------------------------------------------------------


@ROOT_ONLY
async def test_a_job_with_user_nobody_runs_as_nobody(tmp_path: Path) -> None:
    job = load_job(tmp_path, 'user: nobody\nshell: "id -u; id -g; id -G; echo $USER $HOME"\n')
    result, lines = await run_job(job)
    nobody_home = pwd.getpwnam("nobody").pw_dir
    assert "success" == result.outcome, result.error
    assert [str(NOBODY), str(NOBODY), str(NOBODY), f"nobody {nobody_home}"] == lines


def in_a_supplementary_group() -> tuple[str, int, int] | None:
    """A user of this machine that is a member of a group besides its own: (name, its
    own gid, the other gid)."""
    for group in grp.getgrall():
        for member in group.gr_mem:
            with contextlib.suppress(KeyError):
                entry = pwd.getpwnam(member)
                if entry.pw_gid != group.gr_gid:
                    return member, entry.pw_gid, group.gr_gid
    return None


@ROOT_ONLY
async def test_a_job_with_a_user_runs_with_the_user_s_supplementary_groups(
    tmp_path: Path,
) -> None:
    found = in_a_supplementary_group()
    if found is None:
        pytest.skip("no user of this machine is a member of another group")
    user, own, other = found
    job = load_job(tmp_path, f'user: {user}\nshell: "id -g; id -G"\n')
    given = load_job(tmp_path, f'user: {user}\ngroup: {own}\nshell: "id -g; id -G"\n')
    result, lines = await run_job(job)
    assert "success" == result.outcome, result.error
    assert (str(own), {own, other}) == (lines[0], {int(g) for g in lines[1].split()} & {own, other})
    # With group: given, that group alone.
    result, lines = await run_job(given)
    assert [str(own), str(own)] == lines


@ROOT_ONLY
async def test_a_job_with_a_group_runs_with_that_group_and_no_other(tmp_path: Path) -> None:
    job = load_job(tmp_path, 'user: nobody\ngroup: 0\nshell: "id -u; id -g; id -G"\n')
    result, lines = await run_job(job)
    assert "success" == result.outcome, result.error
    assert [str(NOBODY), "0", "0"] == lines


def test_switching_user_when_pgcrond_is_not_root_is_a_config_error() -> None:
    """Run as nobody, `pgcrond check --strict` refuses a job that names another user."""
    if os.geteuid() != 0:
        pytest.skip("needs root to start pgcrond as nobody")
    config = (
        "database: {url: 'postgresql://app@db/jobs'}\n"
        "jobs:\n  backup:\n    once: true\n    command: [id]\n    user: root\n"
    )
    problem = (
        "<stdin>:6: job 'backup': field 'user': switching to user 'root' needs pgcrond to run "
        f"as root (it runs as uid {NOBODY}); run it as root, or leave user: out"
    )
    strict = check_as_nobody(config, "--strict")
    assert (2, f"{problem}\n1 problem: fix these and run pgcrond check again\n") == (
        strict.returncode,
        strict.stderr,
    )
    # Linting on a machine that is not the one it runs on: said, not refused.
    lint = check_as_nobody(config)
    assert (0, f"warning: {problem}\n") == (lint.returncode, lint.stderr)


# -- the cgroup: its kill, its limits ---------------------------------------------------


async def test_a_grandchild_that_calls_setsid_is_gone_after_the_timeout(
    tmp_path: Path, by_cgroups: box.Host
) -> None:
    marker = f"{3000 + os.getpid() % 1000}.25"
    pidfile = tmp_path / "escaped.pid"
    job = load_job(tmp_path, f'shell: "{escaping(pidfile, marker)}"\ntimeout: 2s\n')
    result, _ = await run_job(job, timeout=job.timeout)
    assert "timeout" == result.outcome
    pid, alive = escapee(pidfile, f"sleep {marker}")
    assert pid > 0
    assert [] == alive


async def test_without_a_cgroup_the_setsid_grandchild_escapes_as_documented(
    tmp_path: Path, by_rlimits: box.Host
) -> None:
    """The control: the process-group kill alone does not reach it (docs/jobs.md says so)."""
    marker = f"{4000 + os.getpid() % 1000}.25"
    pidfile = tmp_path / "escaped.pid"
    job = load_job(tmp_path, f'shell: "{escaping(pidfile, marker)}"\ntimeout: 2s\n')
    result, _ = await run_job(job, timeout=job.timeout)
    pid, alive = escapee(pidfile, f"sleep {marker}")
    try:
        assert "timeout" == result.outcome
        assert [pid] == alive
    finally:
        for leftover in alive:
            os.kill(leftover, signal.SIGKILL)


async def test_a_job_over_its_memory_limit_is_killed_and_says_why(
    tmp_path: Path, by_cgroups: box.Host
) -> None:
    job = load_job(
        tmp_path, f'limits: {{memory: 64MiB}}\ncommand: ["{sys.executable}", -c, "{HOG}"]\n'
    )
    result, lines = await run_job(job)
    assert ("fail", "killed: memory limit 64MiB exceeded (oom)") == (result.outcome, result.error)
    assert "survived" not in lines


async def test_the_same_job_under_a_larger_limit_survives(
    tmp_path: Path, by_cgroups: box.Host
) -> None:
    """The control of the one above: it is the limit that killed it, not the program."""
    job = load_job(
        tmp_path, f'limits: {{memory: 1GiB}}\ncommand: ["{sys.executable}", -c, "{HOG}"]\n'
    )
    result, lines = await run_job(job)
    assert ("success", ["survived"]) == (result.outcome, lines)


async def test_a_cpu_limit_holds_a_busy_job_to_its_share(
    tmp_path: Path, by_cgroups: box.Host
) -> None:
    if "cpu" not in by_cgroups.parents and "v2" not in by_cgroups.parents:
        pytest.skip("no cpu controller here")
    busy = (
        "import time; end = time.monotonic() + 1.5\\n"
        "while time.monotonic() < end: pass\\n"
        "print(round(time.process_time(), 2))"
    )
    job = load_job(tmp_path, f'limits: {{cpu: 20%}}\ncommand: ["{sys.executable}", -c, "{busy}"]\n')
    result, lines = await run_job(job)
    assert "success" == result.outcome, result.error
    # 20% of 1.5 s is 0.3 s of CPU (plus the interpreter's start); unlimited, ~1.5 s.
    assert float(lines[0]) < 0.6, lines


async def test_a_process_limit_refuses_the_fork_past_it(
    tmp_path: Path, by_cgroups: box.Host
) -> None:
    script = "for i in 1 2 3 4 5 6 7 8; do sleep 5 & done; echo all-forked"
    job = load_job(tmp_path, f'limits: {{processes: 4}}\nshell: "{script}"\n')
    result, lines = await run_job(job)
    assert "all-forked" not in lines
    assert "fail" == result.outcome


def attempt_cgroups(host: box.Host, job: str) -> set[Path]:
    """The attempt cgroups of ``job`` in this process's directories."""
    return {p for parent in host.parents.values() for p in parent.glob(f"{job}.*")}


async def test_each_attempt_leaves_no_cgroup_behind(tmp_path: Path, by_cgroups: box.Host) -> None:
    job = load_job(tmp_path, 'limits: {memory: 64MiB}\nshell: "sleep 0.1 & true"\n')
    # Only this attempt's: another test of this worker may have run the same job code.
    before = attempt_cgroups(by_cgroups, job.code)
    result, _ = await run_job(job)
    assert "success" == result.outcome
    assert set() == attempt_cgroups(by_cgroups, job.code) - before


async def test_a_cgroup_busy_for_a_moment_is_removed_once_it_is_not(by_cgroups: box.Host) -> None:
    # The kernel refuses to remove a cgroup while it is busy (EBUSY: here a
    # child cgroup; after a kill, a process not yet gone): removed once it is
    # not, within the stop's bound, and nothing said.
    cell = box.Cell("busy", Box())
    cell.enter(["true"])
    made = list(cell.dirs.values())
    blockers = [directory / "blocker" for directory in made]
    for blocker in blockers:
        blocker.mkdir()
    with capture_logs() as said:
        closing = asyncio.ensure_future(cell.close())
        await asyncio.sleep(0.3)
        assert not closing.done()
        for blocker in blockers:
            blocker.rmdir()
        await asyncio.wait_for(closing, 10)
    assert [] == [directory for directory in made if directory.exists()]
    assert [] == [e for e in said if e["event"] == "job_cgroup_left"]


def test_a_starting_replica_removes_the_cgroups_a_killed_one_left(by_cgroups: box.Host) -> None:
    """A SIGKILLed replica cannot remove its attempts' cgroups; the next one to start does."""
    gone = subprocess.Popen(["true"])
    gone.wait()  # a pid no longer alive, as a killed replica's is
    left = [
        parent.parent / str(gone.pid) / "job.0badcafe" for parent in by_cgroups.parents.values()
    ]
    for cell in left:
        cell.mkdir(parents=True)
    box.configure("auto")
    assert [] == [cell.parent for cell in left if cell.parent.exists()]
    assert all(parent.parent.exists() for parent in by_cgroups.parents.values())


# -- rlimits, where no cgroup can be made ----------------------------------------------


async def test_without_cgroups_the_limits_are_rlimits_of_each_process(
    tmp_path: Path, by_rlimits: box.Host
) -> None:
    job = load_job(tmp_path, 'limits: {nofile: 77, memory: 64MiB}\nshell: "ulimit -n; ulimit -v"\n')
    result, lines = await run_job(job)
    assert "success" == result.outcome, result.error
    assert ["77", str(64 * 1024)] == lines  # ulimit -v is in KiB


async def test_without_cgroups_the_memory_limit_fails_the_allocation_not_the_kernel(
    tmp_path: Path, by_rlimits: box.Host
) -> None:
    job = load_job(
        tmp_path, f'limits: {{memory: 64MiB}}\ncommand: ["{sys.executable}", -c, "{HOG}"]\n'
    )
    result, lines = await run_job(job)
    # Python's MemoryError: the process ends itself, no oom kill to record.
    assert ("fail", "exit status 1") == (result.outcome, result.error)
    assert "survived" not in lines


def test_a_user_who_may_write_no_cgroup_is_told_so_by_check_explain() -> None:
    """The real fallback: as nobody, no cgroup is writable, and `check --explain` says rlimits."""
    if os.geteuid() != 0:
        pytest.skip("needs root to start pgcrond as nobody")
    done = check_as_nobody(
        "database: {url: 'postgresql://app@db/jobs'}\n"
        "jobs:\n  job:\n    once: true\n    command: [id]\n    limits: {cpu: 50%, nofile: 64}\n",
        "--explain",
    )
    assert 0 == done.returncode, done.stderr
    lines = done.stdout.splitlines()
    boxed = next(line for line in lines if line.startswith("jobs are boxed here by"))
    assert boxed.startswith("jobs are boxed here by rlimits: no cgroup to make:"), boxed
    assert "  cpu        not enforced (no cgroup)" in lines
    assert "  nofile     rlimit RLIMIT_NOFILE (each process)" in lines
    assert "  limits   cpu 50%, nofile 64" in lines


# -- what a job inherits ---------------------------------------------------------------


async def test_a_job_inherits_the_base_set_and_what_it_names_only(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("LANG", "C.UTF-8")
    monkeypatch.setenv("AWS_REGION", "eu-west-1")
    monkeypatch.setenv("INTERNAL_ONLY", "daemon's")
    monkeypatch.setenv("PGCROND_ENV_PASSTHROUGH", "EXTRA_*")
    monkeypatch.setenv("EXTRA_FLAG", "on")
    shown = ("PATH", "LANG", "AWS_REGION", "INTERNAL_ONLY", "EXTRA_FLAG")
    show = 'shell: "' + "; ".join(f"echo ${{{name}:-unset}}" for name in shown) + '"\n'
    plain = load_job(tmp_path, show)
    named = load_job(tmp_path, show + "env_passthrough: [AWS_*]\n")
    everything = load_job(tmp_path, show + 'env_passthrough: ["*"]\n')
    _, lines = await run_job(plain)
    assert [os.environ["PATH"], "C.UTF-8", "unset", "unset", "on"] == lines
    _, lines = await run_job(named)
    assert [os.environ["PATH"], "C.UTF-8", "eu-west-1", "unset", "on"] == lines
    _, lines = await run_job(everything)
    assert [os.environ["PATH"], "C.UTF-8", "eu-west-1", "daemon's", "on"] == lines


def test_env_file_and_file_secrets_reach_the_job_and_no_log_line(
    tmp_path: Path,
) -> None:
    secret = tmp_path / "token"
    secret.write_text("tok-3f9a1c77e2\n")
    dotenv = tmp_path / "job.env"
    dotenv.write_text('# comment\nexport API_KEY="key-5d8e0b12"\nREGION=north\nOVERRIDDEN=file\n')
    job = load_job(
        tmp_path,
        f"env_file: {dotenv}\n"
        f'env: {{TOKEN: "${{file:{secret}}}", OVERRIDDEN: env}}\n'
        'shell: "echo $TOKEN $API_KEY $REGION $OVERRIDDEN"\n',
    )
    assert {"TOKEN": "tok-3f9a1c77e2", "API_KEY": "key-5d8e0b12"}.items() <= job.env.items()
    done = logged_run(tmp_path / "jobs.yaml")
    # The log as pgcrond writes it (JSON on stderr): the values of secrets are ***,
    # the region is no secret, and env: wins over the file.
    lines = [json.loads(line) for line in done.stderr.splitlines()]
    assert ["*** *** north env"] == [e["line"] for e in lines if e["event"] == "job_output"]
    assert "tok-3f9a1c77e2" not in done.stdout + done.stderr
    assert "key-5d8e0b12" not in done.stdout + done.stderr
