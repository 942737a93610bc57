"""The README's first command works from any clone, as root or not.

Under root the embedded PostgreSQL runs as 'nobody', which cannot enter a clone
in root's home or in a ``mktemp -d`` (both 0700): the server's state then lives
under /var/tmp, one directory per state directory, said in one log line.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import signal
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

import pytest

from pgcrond.errors import EmbeddedServerError
from pgcrond.storage.embedded import state_home
from tests.helpers.daemon_harness import ROOT, wait_until

# Installing into a fresh .venv (the README's "first use") on a loaded machine.
INSTALL_TIMEOUT_S = 600
# The 10-second job's first success, from the command's start: the server's
# initdb and start, the migration, then at most 10 s to the first tick.
FIRST_SUCCESS_WITHIN_S = 30


def needs_root() -> None:
    if os.geteuid() != 0:
        pytest.skip("needs root: as another user PostgreSQL runs as that user, in place")


def test_root_keeps_a_state_dir_nobody_cannot_enter_under_the_shared_directory(
    tmp_path: Path,
) -> None:
    needs_root()
    private = tmp_path / "clone"
    private.mkdir(mode=0o700)
    shared = tmp_path / "shared"
    shared.mkdir(mode=0o1777)
    home, blocked = state_home(private / ".pgcrond", shared=shared)
    assert private == blocked or blocked in private.parents
    assert home.parent == shared / "pgcrond-0"
    assert home.name.startswith("pgcrond-")
    assert 0o711 == home.parent.stat().st_mode & 0o777
    # Every command with the same config finds the same server: the same answer again.
    assert (home, blocked) == state_home(private / ".pgcrond", shared=shared)
    # Another state directory gets a directory of its own.
    assert home != state_home(private / "other", shared=shared)[0]


def test_a_state_dir_nobody_can_enter_stays_where_it_is(tmp_path: Path) -> None:
    open_dir = Path(tempfile.mkdtemp(prefix="pgcrond-open-"))
    try:
        open_dir.chmod(0o755)
        assert (open_dir / "state", None) == state_home(open_dir / "state", shared=tmp_path)
    finally:
        shutil.rmtree(open_dir)


def test_a_shared_directory_another_user_owns_is_refused(tmp_path: Path) -> None:
    """Someone who made /var/tmp/pgcrond-0 first could read or swap our server's state."""
    needs_root()
    private = tmp_path / "clone"
    private.mkdir(mode=0o700)
    planted = tmp_path / "pgcrond-0"
    planted.mkdir(mode=0o777)
    planted.chmod(0o777)
    with pytest.raises(EmbeddedServerError, match="is not this user's own directory"):
        state_home(private / ".pgcrond", shared=tmp_path)


def readme_first_command() -> list[str]:
    readme = (ROOT / "README.md").read_text("utf-8")
    first_block = re.search(r"```sh\n(.*?)```", readme, re.S)
    assert first_block is not None
    return shlex.split(first_block.group(1).strip().splitlines()[0])


def events(log: Path) -> list[dict[str, Any]]:
    found = []
    for line in log.read_text(errors="replace").splitlines():
        if line.startswith("{"):
            found.append(json.loads(line))
    return found


@pytest.mark.usefixtures("system_processes")
def test_the_readme_first_command_runs_the_ten_second_job_from_a_private_clone_as_root() -> None:
    needs_root()
    command = readme_first_command()
    assert ["scripts/pgcrond", "run", "-c", "config/example.yaml"] == command
    private = Path(tempfile.mkdtemp())  # 0700, as `mktemp -d` makes it
    assert 0o700 == private.stat().st_mode & 0o777
    clone = private / "pgcrond"
    environ = {
        name: value
        for name, value in os.environ.items()
        if not name.startswith(("PGCROND_", "VIRTUAL_ENV", "PG"))
    }
    daemon: subprocess.Popen[bytes] | None = None
    try:
        subprocess.run(["git", "clone", "--quiet", str(ROOT), str(clone)], check=True)
        # First use installs into the clone's .venv (untimed: pip's work, not pgcrond's).
        subprocess.run(
            ["scripts/pgcrond", "--version"],
            cwd=clone,
            env=environ,
            check=True,
            capture_output=True,
            timeout=INSTALL_TIMEOUT_S,
        )
        log = private / "run.log"
        started = time.monotonic()
        with log.open("wb") as out:
            # The README's command; its status page on a free port, as other tests run too.
            daemon = subprocess.Popen(
                [*command, "--http", "127.0.0.1:0"],
                cwd=clone,
                env=environ,
                stdout=out,
                stderr=subprocess.STDOUT,
            )

        def first_success() -> dict[str, Any] | None:
            if daemon is not None and daemon.poll() is not None:
                raise AssertionError(f"pgcrond exited {daemon.returncode}:\n{log.read_text()}")
            return next(
                (
                    event
                    for event in events(log)
                    if event["event"] == "run_finished"
                    and event.get("job") == "hello"
                    and event.get("outcome") == "success"
                ),
                None,
            )

        wait_until(first_success, FIRST_SUCCESS_WITHIN_S, "the hello job's first success")
        took = time.monotonic() - started
        assert took < FIRST_SUCCESS_WITHIN_S
        print(f"\nthe 10-second job's first success {took:.1f} s after the README's command")
        (moved,) = [event for event in events(log) if event["event"] == "embedded_state_moved"]
        home, blocked = state_home(clone / ".pgcrond")
        assert (str(home), ".pgcrond") == (moved["moved_to"], moved["state_dir"])
        assert str(blocked) in moved["why"]
        # The README's second terminal, from the same clone: the same server, found by
        # the config that PGCROND_CONFIG names.
        second = {**environ, "PGCROND_CONFIG": "config/example.yaml"}

        def cli(*args: str) -> subprocess.CompletedProcess[str]:
            return subprocess.run(
                ["scripts/pgcrond", *args],
                cwd=clone,
                env=second,
                capture_output=True,
                text=True,
                timeout=60,
                check=False,
            )

        triggered = cli("trigger", "hello")
        assert 0 == triggered.returncode, triggered.stdout + triggered.stderr
        assert triggered.stdout.splitlines()[-1].endswith(": success")
        history = cli("history", "--limit", "3")
        assert 0 == history.returncode, history.stderr
        assert "manual:" in history.stdout  # the triggered run, among the newest three
        status = cli("status", "-o", "json")
        assert 0 == status.returncode, status.stderr
        jobs = {job["job"]: job for job in json.loads(status.stdout)["jobs"]}
        assert "SUCCESS" == jobs["hello"]["last_run"]["status"]
        daemon.send_signal(signal.SIGTERM)
        assert 0 == daemon.wait(60)
    finally:
        if daemon is not None and daemon.poll() is None:
            daemon.kill()
            daemon.wait()
        moved_to = state_home(clone / ".pgcrond")[0]
        shutil.rmtree(private, ignore_errors=True)
        if moved_to.parent.name == f"pgcrond-{os.geteuid()}":
            shutil.rmtree(moved_to, ignore_errors=True)
