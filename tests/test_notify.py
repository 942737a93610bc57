"""sd_notify: datagrams reach systemd's socket (path or abstract); the watchdog period is read."""

from __future__ import annotations

import os
import socket
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from pgcrond.daemon import notify


@pytest.fixture
def path_socket(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[socket.socket]:
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    address = tmp_path / "notify.sock"
    sock.bind(str(address))
    sock.settimeout(2)
    monkeypatch.setenv("NOTIFY_SOCKET", str(address))
    yield sock
    sock.close()


def test_without_notify_socket_every_call_is_a_no_op(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("NOTIFY_SOCKET", raising=False)
    assert (False, False, False) == (notify.ready(), notify.watchdog(), notify.notify("X=1"))


def test_helpers_send_the_protocol_messages(path_socket: socket.socket) -> None:
    assert notify.ready()
    assert notify.watchdog()
    assert notify.status("running 3 jobs\nsecond line")
    assert notify.stopping()
    received = [path_socket.recv(4096) for _ in range(4)]
    assert [
        b"READY=1",
        b"WATCHDOG=1",
        b"STATUS=running 3 jobs second line",
        b"STOPPING=1",
    ] == received


def test_abstract_socket_is_addressed_with_a_leading_at(monkeypatch: pytest.MonkeyPatch) -> None:
    name = f"pgcrond-test-{uuid.uuid4().hex}"
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as sock:
        sock.bind(b"\0" + name.encode())
        sock.settimeout(2)
        monkeypatch.setenv("NOTIFY_SOCKET", "@" + name)
        assert notify.ready()
        assert b"READY=1" == sock.recv(4096)


def test_an_unreachable_socket_returns_false_instead_of_raising(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("NOTIFY_SOCKET", str(tmp_path / "nobody-listens.sock"))
    assert not notify.ready()


@pytest.mark.parametrize(
    ("usec", "pid", "expected"),
    [
        ("30000000", None, 15.0),
        ("30000000", "self", 15.0),
        ("30000000", "1", None),  # someone else's watchdog
        ("500000", None, 0.25),
        ("0", None, None),
        ("soon", None, None),
        (None, None, None),
    ],
)
def test_watchdog_interval_is_half_the_period_for_this_process(
    monkeypatch: pytest.MonkeyPatch, usec: str | None, pid: str | None, expected: float | None
) -> None:
    for name, value in (("WATCHDOG_USEC", usec), ("WATCHDOG_PID", pid)):
        if value is None:
            monkeypatch.delenv(name, raising=False)
        else:
            monkeypatch.setenv(name, str(os.getpid()) if value == "self" else value)
    assert expected == notify.watchdog_interval()


def test_reloading_carries_the_monotonic_clock_systemd_253_requires(
    path_socket: socket.socket,
) -> None:
    before = time.monotonic()
    assert notify.reloading()
    first, second = path_socket.recv(4096).decode().split("\n")
    assert "RELOADING=1" == first
    key, _, usec = second.partition("=")
    assert "MONOTONIC_USEC" == key
    assert before <= int(usec) / 1e6 <= time.monotonic()


async def test_a_reload_is_wrapped_in_reloading_and_ready_even_when_it_fails(
    path_socket: socket.socket,
) -> None:
    async def good() -> str:
        return "done"

    async def bad() -> None:
        raise RuntimeError("rejected")

    assert "done" == await notify.reloading_while(good())
    with pytest.raises(RuntimeError):
        await notify.reloading_while(bad())
    received = [path_socket.recv(4096).decode().split("\n")[0] for _ in range(4)]
    assert ["RELOADING=1", "READY=1", "RELOADING=1", "READY=1"] == received
