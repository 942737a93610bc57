"""No job of a dead replica starts: a child whose replica died before it armed its
death signal exits instead of running the job.

A replica spawns each job through a wrapper that arms the death signal
(``setpriv --pdeathsig KILL``) and then execs the job. The replica can die
between the fork and the arming; the signal is then armed against the
orphan's new parent and never fires. Here the wrapper is held in exactly that
window (a ``setpriv`` first on the replica's PATH that waits, then execs the
real one) while the replica is killed -9.
"""

from __future__ import annotations

import shutil
import signal
import time
from pathlib import Path

import pytest

from tests.helpers.daemon_harness import Cluster, Replica, config, wait_until

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("system_processes")]


def gone(pid: int) -> bool:
    """The process has exited (reaped, or a zombie of its new parent)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().split(") ")[1].startswith("Z")
    except (FileNotFoundError, IndexError):
        return True


def test_a_child_held_before_its_death_signal_does_not_start_the_job_of_a_dead_replica(
    pg_dsn: str, schema: str, tmp_path: Path
) -> None:
    real = shutil.which("setpriv")
    if real is None:
        pytest.skip("util-linux setpriv is not installed")
    held, release, effect = tmp_path / "held", tmp_path / "release", tmp_path / "effect"
    fake = tmp_path / "bin"
    fake.mkdir()
    (fake / "setpriv").write_text(
        "#!/bin/sh\n"
        f'echo $$ > "{held}"\n'
        f'while [ ! -e "{release}" ]; do sleep 0.02; done\n'
        f'exec "{real}" "$@"\n'
    )
    (fake / "setpriv").chmod(0o755)
    cluster = Cluster(pg_dsn, schema, tmp_path)
    cluster.prepare()
    path = cluster.write_config(
        config(schema, f"  seed: {{once: true, shell: 'touch {effect}'}}\n")
    )
    env = cluster.env()
    env["PATH"] = f"{fake}:{env['PATH']}"
    replica = Replica("replica-0", path, tmp_path / "replica-0.log", env).start()
    try:
        wait_until(lambda: held.exists() and held.read_text().strip(), 30, "the job's wrapper")
        child = int(held.read_text())
        replica.signal(signal.SIGKILL)
        replica.wait_exit(10)
        release.touch()
        wait_until(lambda: gone(child), 10, "the orphaned wrapper to exit")
        time.sleep(0.2)  # a job started by it would have touched the file by now
    finally:
        release.touch()
        replica.stop()
    assert not effect.exists()
