"""A TCP proxy in front of PostgreSQL that injects network faults (stdlib only).

* pass-through: every accepted connection gets its own upstream connection and
  two pump threads (one per direction);
* :meth:`Proxy.cut`: every proxied connection is closed at once (both ends);
* :meth:`Proxy.partition`: bytes are **held** in both directions, neither
  delivered nor dropped; new connections are accepted but stalled (their
  upstream connection is only made at the heal); when it heals, everything
  held is delivered, in order, end-of-stream included. The fault that matters
  most: a statement sent before or during it is answered late;
* :meth:`Proxy.blackhole`: bytes are dropped in both directions and new
  connections refused; at the heal, every connection that lost bytes is closed
  (its protocol stream is broken), the others carry on.

The client side is a loopback TCP endpoint, so TCP keepalives never notice a
partition here: only the application's own deadlines do.
"""

from __future__ import annotations

import contextlib
import itertools
import select
import socket
import struct
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Literal
from urllib.parse import urlsplit, urlunsplit

Mode = Literal["pass", "hold", "drop"]
_POLL_S = 0.05
_CHUNK = 65536


@dataclass
class _Connection:
    number: int
    client: socket.socket
    upstream: socket.socket | None = None
    closed: bool = False
    # Lost bytes to a blackhole: the stream is broken, closed at the heal.
    tainted: bool = False
    lock: threading.Lock = field(default_factory=threading.Lock)

    def close(self) -> None:
        with self.lock:
            if self.closed:
                return
            self.closed = True
            for sock in (self.client, self.upstream):
                if sock is None:
                    continue
                # shutdown first: it wakes a pump blocked in select on this socket.
                with contextlib.suppress(OSError):
                    sock.shutdown(socket.SHUT_RDWR)
                sock.close()


@dataclass
class ProxyStats:
    accepted: int = 0
    refused: int = 0
    upstream_failed: int = 0
    cut: int = 0
    bytes_up: int = 0
    bytes_down: int = 0
    dropped_bytes: int = 0


class Proxy:
    """``with Proxy(host, port) as proxy:`` then connect to ``proxy.port``."""

    def __init__(self, upstream_host: str, upstream_port: int, listen_host: str = "127.0.0.1"):
        self.upstream = (upstream_host, upstream_port)
        self._listener = socket.create_server((listen_host, 0))
        self._listener.settimeout(_POLL_S * 4)
        self.host, self.port = self._listener.getsockname()[:2]
        self.stats = ProxyStats()
        self._mode: Mode = "pass"
        self._state = threading.Condition()
        self._generation = 0
        self._connections: dict[int, _Connection] = {}
        self._numbers = itertools.count(1)
        self._closing = threading.Event()
        self._threads: list[threading.Thread] = []
        self._accept_thread = threading.Thread(
            target=self._accept, name="proxy-accept", daemon=True
        )

    @classmethod
    def for_dsn(cls, dsn: str) -> Proxy:
        parts = urlsplit(dsn)
        assert parts.hostname is not None and parts.port is not None, dsn
        return cls(parts.hostname, parts.port)

    def dsn(self, upstream_dsn: str) -> str:
        """``upstream_dsn`` with host and port replaced by the proxy's."""
        parts = urlsplit(upstream_dsn)
        userinfo = parts.netloc.rpartition("@")[0]
        netloc = f"{userinfo}@{self.host}:{self.port}" if userinfo else f"{self.host}:{self.port}"
        return urlunsplit(parts._replace(netloc=netloc))

    # -- life cycle -----------------------------------------------------------

    def start(self) -> Proxy:
        self._accept_thread.start()
        return self

    def close(self) -> None:
        self._closing.set()
        self.heal()
        self._accept_thread.join(5)
        self._listener.close()
        self.cut()
        for thread in list(self._threads):
            thread.join(5)

    def __enter__(self) -> Proxy:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- faults -----------------------------------------------------------------

    @property
    def mode(self) -> Mode:
        return self._mode

    @property
    def open_connections(self) -> int:
        with self._state:
            return sum(1 for c in self._connections.values() if not c.closed)

    def cut(self) -> int:
        """Close every proxied connection at once; returns how many."""
        with self._state:
            victims = [c for c in self._connections.values() if not c.closed]
        for connection in victims:
            connection.close()
        self.stats.cut += len(victims)
        return len(victims)

    def partition(self, seconds: float) -> threading.Event:
        """Hold all bytes for ``seconds`` (returns at once); the event is set at the heal."""
        return self._fault("hold", seconds)

    def blackhole(self, seconds: float) -> threading.Event:
        """Drop all bytes and refuse connections for ``seconds`` (returns at once)."""
        return self._fault("drop", seconds)

    def heal(self) -> None:
        """End a partition or blackhole now (idempotent)."""
        with self._state:
            self._set_mode("pass")

    def _fault(self, mode: Mode, seconds: float) -> threading.Event:
        healed = threading.Event()
        with self._state:
            self._set_mode(mode)
            generation = self._generation

        def heal() -> None:
            with self._state:
                if self._generation == generation:
                    self._set_mode("pass")
            healed.set()

        timer = threading.Timer(seconds, heal)
        timer.daemon = True
        timer.start()
        return healed

    def _set_mode(self, mode: Mode) -> None:
        # Called with self._state held.
        previous, self._mode = self._mode, mode
        self._generation += 1
        if previous == "drop" and mode != "drop":
            for connection in self._connections.values():
                if connection.tainted:
                    connection.close()
        self._state.notify_all()

    def _wait_flowing(self, connection: _Connection) -> bool:
        """Block while bytes are held; False once the connection is closed."""
        with self._state:
            while self._mode == "hold" and not connection.closed:
                self._state.wait(_POLL_S)
        return not connection.closed

    # -- plumbing -------------------------------------------------------------------

    def _accept(self) -> None:
        while not self._closing.is_set():
            try:
                client, _ = self._listener.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            if self._mode == "drop":
                self.stats.refused += 1
                _reset(client)
                continue
            self.stats.accepted += 1
            client.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            connection = _Connection(next(self._numbers), client)
            with self._state:
                self._connections[connection.number] = connection
            self._spawn(self._connect, connection)

    def _spawn(self, target: object, *args: object) -> None:
        thread = threading.Thread(target=target, args=args, daemon=True)  # type: ignore[arg-type]
        self._threads = [t for t in self._threads if t.is_alive()]
        self._threads.append(thread)
        thread.start()

    def _connect(self, connection: _Connection) -> None:
        # A new connection during a partition is stalled until the heal.
        if not self._wait_flowing(connection):
            return
        try:
            upstream = socket.create_connection(self.upstream, timeout=5)
        except OSError:
            self.stats.upstream_failed += 1
            connection.close()
            return
        upstream.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        upstream.settimeout(None)
        with connection.lock:
            if connection.closed:
                upstream.close()
                return
            connection.upstream = upstream
        self._spawn(self._pump, connection, connection.client, upstream, "up")
        self._pump(connection, upstream, connection.client, "down")

    def _pump(
        self, connection: _Connection, source: socket.socket, target: socket.socket, way: str
    ) -> None:
        try:
            while self._wait_flowing(connection):
                try:
                    ready, _, _ = select.select([source], [], [], _POLL_S)
                except (OSError, ValueError):
                    break
                if not ready:
                    continue
                try:
                    data = source.recv(_CHUNK)
                except OSError:
                    break
                # Bytes read when a fault begins are held (or dropped) like the rest.
                if not self._wait_flowing(connection):
                    break
                if self._mode == "drop":
                    connection.tainted = True
                    self.stats.dropped_bytes += len(data)
                    if not data:
                        return  # the end of the stream is lost too; closed at the heal
                    continue
                if not data:
                    break
                try:
                    target.sendall(data)
                except OSError:
                    break
                if way == "up":
                    self.stats.bytes_up += len(data)
                else:
                    self.stats.bytes_down += len(data)
        finally:
            if not connection.tainted or self._mode != "drop":
                connection.close()


def _reset(sock: socket.socket) -> None:
    """Close with RST: the client sees 'connection refused/reset' at once."""
    with contextlib.suppress(OSError):
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    sock.close()


@contextlib.contextmanager
def proxied(dsn: str) -> Iterator[tuple[Proxy, str]]:
    """A started proxy in front of the server of ``dsn``, and the DSN through it."""
    with Proxy.for_dsn(dsn) as proxy:
        yield proxy, proxy.dsn(dsn)
