"""systemd's sd_notify protocol, without a dependency: one datagram per message.

Under ``Type=notify`` systemd waits for ``READY=1`` before it counts the unit
as started, and with ``WatchdogSec=`` it restarts a replica that stops sending
``WATCHDOG=1``. Under ``Type=notify-reload`` (systemd 253+) ``systemctl
reload`` sends SIGHUP and waits for ``RELOADING=1`` then ``READY=1``.
Outside systemd ``$NOTIFY_SOCKET`` is unset and every call is a no-op, so the
daemon can call these unconditionally.
"""

from __future__ import annotations

import os
import socket
import time
from collections.abc import Awaitable
from typing import TypeVar

import structlog

log = structlog.get_logger("pgcrond.daemon.notify")


def _address(value: str) -> str | bytes:
    # A leading '@' names a Linux abstract socket, whose address starts with NUL.
    if value.startswith("@"):
        return b"\0" + value[1:].encode()
    return value


def notify(message: str) -> bool:
    """Send ``message`` to ``$NOTIFY_SOCKET``; False when unset or it cannot be delivered."""
    target = os.environ.get("NOTIFY_SOCKET")
    if not target:
        return False
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC) as sock:
            sock.connect(_address(target))
            sock.sendall(message.encode())
    except OSError as exc:
        # systemd going away must never take the daemon down with it.
        log.warning("notify_failed", socket=target, error=str(exc))
        return False
    return True


def ready() -> bool:
    return notify("READY=1")


def reloading() -> bool:
    """``RELOADING=1`` with the ``MONOTONIC_USEC=`` that systemd 253+ requires beside it."""
    usec = time.clock_gettime_ns(time.CLOCK_MONOTONIC) // 1000
    return notify(f"RELOADING=1\nMONOTONIC_USEC={usec}")


T = TypeVar("T")


async def reloading_while(reload: Awaitable[T]) -> T:
    """Await ``reload`` between ``RELOADING=1`` and ``READY=1``.

    ``READY=1`` follows a rejected config too: the replica is ready again,
    with the old one; systemd would otherwise wait for the reload forever.
    """
    reloading()
    try:
        return await reload
    finally:
        ready()


def stopping() -> bool:
    return notify("STOPPING=1")


def watchdog() -> bool:
    return notify("WATCHDOG=1")


def status(text: str) -> bool:
    # The protocol is newline-separated assignments: a newline would end STATUS early.
    return notify("STATUS=" + " ".join(text.splitlines()))


def watchdog_interval() -> float | None:
    """Seconds between ``WATCHDOG=1`` pings: half of ``WatchdogSec``; None when off.

    ``WATCHDOG_PID`` set to another process means the watchdog is that
    process's (e.g. a wrapper that exec'd us after forking), not ours.
    """
    usec = os.environ.get("WATCHDOG_USEC")
    if not usec:
        return None
    pid = os.environ.get("WATCHDOG_PID")
    if pid and pid.strip() != str(os.getpid()):
        return None
    try:
        period = int(usec)
    except ValueError:
        log.warning("watchdog_usec_invalid", value=usec)
        return None
    if period <= 0:
        return None
    return period / 2_000_000
