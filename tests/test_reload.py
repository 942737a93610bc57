"""A changed config file reloads a running daemon as SIGHUP does, and systemd hears of it.

No signal is sent in these tests: the daemon notices the edit itself (stat
polling, about once a second), including a Kubernetes ConfigMap's atomic
``..data`` symlink swap, rejects a bad new config while the old jobs keep
running, and wraps every reload in ``RELOADING=1`` ... ``READY=1`` for
systemd's ``Type=notify-reload``.
"""

from __future__ import annotations

import os
import signal
import socket
import time
from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from tests.helpers.daemon_harness import LEDGER, Cluster, Replica, cluster, wait_until

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("system_processes")]


def config(schema: str, *codes: str) -> str:
    jobs = "".join(f'  {code}: {{cron: "* * * * * *", entrypoint: {LEDGER}}}\n' for code in codes)
    return f"database:\n  url: ${{PGCROND_DATABASE_URL}}\n  schema: {schema}\njobs:\n{jobs}"


@pytest.fixture
def notify_socket(tmp_path: Path) -> Iterator[socket.socket]:
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    sock.bind(str(tmp_path / "notify.sock"))
    sock.settimeout(0.1)
    yield sock
    sock.close()


def start(running: Cluster, path: Path, notify: socket.socket | None = None) -> Replica:
    env = running.env()
    if notify is not None:
        env["NOTIFY_SOCKET"] = notify.getsockname()
    replica = Replica("replica-0", path, running.workdir / "replica-0.log", env).start()
    running.replicas.append(replica)
    replica.wait_event("daemon_ready", timeout=30)
    return replica


def received(sock: socket.socket) -> list[str]:
    messages = []
    while True:
        try:
            messages.append(sock.recv(4096).decode())
        except TimeoutError:
            return messages


def notifications_until(
    sock: socket.socket, done: Callable[[list[str]], bool], what: str
) -> list[str]:
    """Every datagram received until ``done(all so far)``; fails naming ``what`` after 20 s."""
    messages: list[str] = []

    def check() -> bool:
        messages.extend(received(sock))
        return done(messages)

    wait_until(check, 20, what)
    return messages


def reloaded_then_ready(messages: list[str]) -> bool:
    return any(m.startswith("RELOADING=1") for m in messages) and messages[-1] == "READY=1"


def runs_of(running: Cluster, job: str, after: datetime) -> list[dict[str, object]]:
    return running.rows("SELECT * FROM {ledger} WHERE job = %s AND at > %s", job, after)


def test_an_edited_file_is_reloaded_between_reloading_and_ready(
    pg_dsn: str, schema: str, tmp_path: Path, notify_socket: socket.socket
) -> None:
    with cluster(pg_dsn, schema, tmp_path) as running:
        path = running.write_config(config(schema, "old"))
        replica = start(running, path, notify_socket)
        notifications_until(notify_socket, lambda m: "READY=1" in m, "READY=1 at start")
        path.write_text(config(schema, "new"))
        edited_at = time.monotonic()
        reloaded = replica.wait_event("config_reloaded", timeout=15)
        messages = notifications_until(notify_socket, reloaded_then_ready, "READY=1 after reload")
        wait_until(lambda: runs_of(running, "new", datetime.min), 20, "the new job to run")
    assert (["new"], ["old"]) == (reloaded["added"], reloaded["removed"])
    assert replica.events("config_changed"), "reloaded by the watcher, not by a signal"
    reloading = [m for m in messages if m.startswith("RELOADING=1")]
    assert 1 <= len(reloading)
    assert messages.index(reloading[0]) < messages.index("READY=1")
    # MONOTONIC_USEC is CLOCK_MONOTONIC, the clock time.monotonic() reads on Linux.
    usec = int(reloading[0].split("\n")[1].removeprefix("MONOTONIC_USEC="))
    assert edited_at <= usec / 1e6 <= time.monotonic()


def test_a_configmap_symlink_swap_is_reloaded(pg_dsn: str, schema: str, tmp_path: Path) -> None:
    """kubelet's update: ``jobs.yaml -> ..data/jobs.yaml``, ``..data`` re-pointed atomically."""
    mount = tmp_path / "configmap"
    first = mount / "..2026_01_01_00_00_00.000000001"
    first.mkdir(parents=True)
    (first / "jobs.yaml").write_text(config(schema, "old"))
    (mount / "..data").symlink_to(first.name)
    (mount / "jobs.yaml").symlink_to("..data/jobs.yaml")
    with cluster(pg_dsn, schema, tmp_path) as running:
        replica = start(running, mount)  # -c DIR, as the Deployment mounts it
        second = mount / "..2026_01_01_00_01_00.000000002"
        second.mkdir()
        (second / "jobs.yaml").write_text(config(schema, "new"))
        # Same mtime as the old file: only the swap itself can give the change away.
        old = os.stat(first / "jobs.yaml")
        os.utime(second / "jobs.yaml", ns=(old.st_atime_ns, old.st_mtime_ns))
        (mount / "..data_tmp").symlink_to(second.name)
        os.rename(mount / "..data_tmp", mount / "..data")
        reloaded = replica.wait_event("config_reloaded", timeout=15)
        wait_until(lambda: runs_of(running, "new", datetime.min), 20, "the new job to run")
    assert (["new"], ["old"]) == (reloaded["added"], reloaded["removed"])


def test_a_bad_edit_is_rejected_and_the_old_job_keeps_firing(
    pg_dsn: str, schema: str, tmp_path: Path, notify_socket: socket.socket
) -> None:
    with cluster(pg_dsn, schema, tmp_path) as running:
        path = running.write_config(config(schema, "every"))
        replica = start(running, path, notify_socket)
        path.write_text('jobs:\n  every: {cron: "not a cron", command: []}\n')
        rejected = replica.wait_event("config_reload_rejected", timeout=15)
        rejected_at = datetime.now(UTC)
        later = wait_until(
            lambda: runs_of(running, "every", rejected_at + timedelta(seconds=1)),
            20,
            "a run of the old job after the rejected reload",
        )
        # systemd must not wait forever for a reload that was refused.
        notifications_until(notify_socket, reloaded_then_ready, "READY=1 after the rejection")
        # Rejected once, not every second while the file stays bad: by now the
        # watcher has polled the unchanged bad file more than once.
        rejections = len(replica.events("config_reload_rejected"))
        replica.signal(signal.SIGTERM)
        assert 0 == replica.wait_exit(60)
    assert any("cron" in error for error in rejected["errors"])
    assert "every" == later[0]["job"]
    assert 1 == rejections
