"""``/healthz``, ``/readyz``, ``/metrics`` and the status page on a tiny asyncio HTTP/1.1 server.

Three fixed endpoints for probes and Prometheus and one small page do not need
a framework: one request per connection, ``Connection: close``, a body only for
the status page's form POSTs (at most :data:`MAX_BODY` bytes, with a
``Content-Length``). The server lives on the daemon's event loop, so a wedged
loop fails the probes too, which is the point. No header is ever logged: the
``Authorization`` header carries a password.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import functools
import gzip
import threading
import time
from collections.abc import Awaitable, Callable, Coroutine, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypeVar

import structlog
from prometheus_client import CollectorRegistry

from pgcrond.config.listen import parse_listen as read_listen
from pgcrond.daemon.exchange import Request, Response
from pgcrond.daemon.metrics import exposition
from pgcrond.errors import ValidationError

if TYPE_CHECKING:
    from pgcrond.daemon.status_page import StatusPage

log = structlog.get_logger("pgcrond.daemon.http")

# A probe that takes longer than this is a failed probe: better a 503 now than
# a kubelet timeout that says nothing.
READY_TIMEOUT_S = 2.0
# How long stop() waits for the HTTP thread to end.
CLOSE_WAIT_S = 5.0
T = TypeVar("T")
# Slow or silent clients must not pin connections open.
REQUEST_TIMEOUT_S = 5.0
MAX_HEADER_LINES = 100
# A status page form (a job code, a reason, a token) is a few hundred bytes.
MAX_BODY = 16 * 1024
REASONS = {
    200: "OK",
    303: "See Other",
    400: "Bad Request",
    401: "Unauthorized",
    403: "Forbidden",
    404: "Not Found",
    405: "Method Not Allowed",
    413: "Content Too Large",
    500: "Internal Server Error",
    503: "Service Unavailable",
}
TEXT = "text/plain; charset=utf-8"
# What a slow, truncated, oversized or non-HTTP request raises while it is read.
_UNREADABLE = (TimeoutError, ValueError, asyncio.IncompleteReadError, asyncio.LimitOverrunError)
# After refusing a request it did not read to its end, the server reads on
# (and drops) up to this much for up to this long before it closes: a socket
# closed with unread input is reset, and the reset can destroy the 400 before
# the client reads it.
DISCARD_BYTES = 1024 * 1024
DISCARD_S = 1.0


# /metrics: a render slower than this (thousands of jobs) makes scrapes take
# the last render and refresh it behind; never one older than the limit.
FRESH_RENDER_S = 0.05
STALE_LIMIT_S = 60.0


@dataclass(frozen=True)
class _Rendered:
    body: bytes
    at: float  # monotonic, when the render began: the values are of then
    took: float


def _run_loop(running: concurrent.futures.Future[asyncio.AbstractEventLoop]) -> None:
    """The HTTP thread: an event loop of its own until stopped."""
    loop = asyncio.new_event_loop()
    asyncio.set_event_loop(loop)
    loop.call_soon(running.set_result, loop)
    try:
        loop.run_forever()
    finally:
        loop.run_until_complete(loop.shutdown_default_executor())
        loop.close()


def accepts_gzip(accept_encoding: str) -> bool:
    """Whether an ``Accept-Encoding`` value allows gzip (RFC 9110: a q of 0 refuses it)."""
    for item in accept_encoding.split(","):
        coding, *params = (part.strip().lower() for part in item.split(";"))
        if coding not in ("gzip", "x-gzip"):
            continue
        for param in params:
            name, _, value = param.partition("=")
            if name.strip() == "q":
                try:
                    return float(value) > 0
                except ValueError:
                    return False
        return True
    return False


def _gzip(render: Callable[[], bytes]) -> bytes:
    # Level 1: a tenth of the size of the text format, at a fraction of level 9's CPU.
    return gzip.compress(render(), compresslevel=1, mtime=0)


class _TooLarge(Exception):
    """A body over :data:`MAX_BODY`: answered 413, not read."""


def parse_listen(listen: str) -> tuple[str | None, int]:
    """``host:port``, ``[::1]:port`` or ``:port`` -> (host, port); host None = all interfaces.

    The one reading is :func:`pgcrond.config.listen.parse_listen`; here "" (off) is an error.
    """
    address = read_listen(listen)
    if address is None:
        raise ValidationError("http.listen", "'' turns HTTP off; there is no address to serve on")
    return address.host, address.port


class HealthServer:
    """Serves liveness from ``health()``, readiness from ``await ready()``, and ``registry``."""

    def __init__(
        self,
        listen: str,
        *,
        health: Callable[[], bool],
        ready: Callable[[], Awaitable[bool]],
        registry: CollectorRegistry,
        ready_timeout: float = READY_TIMEOUT_S,
        status_page: StatusPage | None = None,
        ready_detail: Callable[[], list[str]] | None = None,
        busy: Callable[[], bool] = lambda: False,
    ) -> None:
        """``busy``: whether a big tick is in flight (called on the HTTP thread):
        meanwhile a scrape is answered with the last render, if there is one."""
        self.host, self._port = parse_listen(listen)
        self._status_page = status_page
        self._health = health
        self._ready = ready
        self._registry = registry
        self._ready_timeout = ready_timeout
        self._ready_detail = ready_detail
        self._busy = busy
        self._server: asyncio.Server | None = None
        # The /metrics render in progress, per content type.
        self._renders: dict[str, asyncio.Future[bytes]] = {}
        # The last finished render, per content type.
        self._rendered: dict[str, _Rendered] = {}

    @property
    def port(self) -> int:
        """The bound port: the real one when ``listen`` asked for port 0."""
        if self._server is None:
            return self._port
        port: int = self._server.sockets[0].getsockname()[1]
        return port

    async def start(self) -> None:
        """Listen, on a thread of its own with its own event loop.

        A scrape, a liveness probe or a page must be answered while the
        daemon's loop is busy (10,000 co-firing runs keep it busy for
        seconds): connections, ``/healthz`` and ``/metrics`` are served on
        that thread; ``/readyz`` and the status page run their handlers on
        the daemon's loop, which owns the database pools they read with.
        """
        self._main = asyncio.get_running_loop()
        running: concurrent.futures.Future[asyncio.AbstractEventLoop] = concurrent.futures.Future()
        self._thread = threading.Thread(
            target=_run_loop, args=(running,), name="pgcrond-http", daemon=True
        )
        self._thread.start()
        self._loop = await asyncio.wrap_future(running)
        try:
            self._server = await self._on(
                self._loop, asyncio.start_server(self._serve, self.host, self._port)
            )
        except BaseException:
            await self._end_loop()
            raise
        log.info("http_listening", host=self.host or "*", port=self.port)

    async def stop(self) -> None:
        if self._server is None:
            return
        server, self._server = self._server, None

        async def close() -> None:
            server.close()
            await server.wait_closed()

        await self._on(self._loop, close())
        await self._end_loop()

    async def _end_loop(self) -> None:
        self._loop.call_soon_threadsafe(self._loop.stop)
        await asyncio.to_thread(self._thread.join, CLOSE_WAIT_S)

    @staticmethod
    async def _on(loop: asyncio.AbstractEventLoop, work: Coroutine[Any, Any, T]) -> T:
        """``work`` run on ``loop``, awaited from the running one."""
        return await asyncio.wrap_future(asyncio.run_coroutine_threadsafe(work, loop))

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            try:
                request = await asyncio.wait_for(
                    _read_request(reader, _peer(writer)), REQUEST_TIMEOUT_S
                )
            except _TooLarge:
                await _respond(writer, 413, TEXT, f"a body is at most {MAX_BODY} bytes\n".encode())
                await _discard_input(reader, writer)
                return
            except _UNREADABLE:
                await _respond(writer, 400, TEXT, b"bad request\n")
                await _discard_input(reader, writer)
                return
            try:
                answer = await self._route(request)
            except Exception as exc:
                # A bug must cost one answer, not the connection unanswered.
                log.error("http_request_failed", path=request.path[:200], error=repr(exc)[:500])
                answer = Response(500, TEXT, b"internal error\n")
            extra = {"Allow": "GET, HEAD"} if answer.status == 405 else {}
            await _respond(
                writer,
                answer.status,
                answer.content_type,
                b"" if request.method == "HEAD" else answer.body,
                length=len(answer.body),
                extra={**extra, **answer.headers},
            )
        except ConnectionError:
            pass  # the client went away; nothing to tell it
        finally:
            writer.close()
            with contextlib.suppress(ConnectionError):
                await writer.wait_closed()

    async def _route(self, request: Request) -> Response:
        if self._status_page is not None and self._status_page.serves(request.path):
            return await self._on(self._main, self._status_page.handle(request))
        if request.path == "/metrics" and request.method in ("GET", "HEAD"):
            gzipped = accepts_gzip(request.header("accept-encoding"))
            content_type, body = await self._metrics(request.header("accept"), gzipped)
            headers = {"Vary": "Accept-Encoding"}
            if gzipped:
                headers["Content-Encoding"] = "gzip"
            return Response(200, content_type, body, headers)
        return Response(*await self._probe(request.method, request.path))

    async def _probe(self, method: str, path: str) -> tuple[int, str, bytes]:
        if path not in ("/healthz", "/readyz", "/metrics"):
            return 404, TEXT, b"not found\n"
        if method not in ("GET", "HEAD"):
            return 405, TEXT, b"method not allowed\n"
        if path == "/healthz":
            healthy = _safely(self._health)
            return (200, TEXT, b"ok\n") if healthy else (503, TEXT, b"unhealthy\n")
        # /readyz (/metrics is _route's)
        ready = await self._is_ready()
        # Details (stale jobs) follow the first line; they never change the status.
        body = "ok\n" if ready else "not ready\n"
        if self._ready_detail is not None:
            body += "".join(f"{line}\n" for line in _safe_detail(self._ready_detail))
        return (200 if ready else 503), TEXT, body.encode()

    async def _metrics(self, accept: str, gzipped: bool) -> tuple[str, bytes]:
        """The registry, rendered on a worker thread; concurrent scrapes share one render.

        ``gzipped``: compressed on the same thread (as Prometheus asks): 8 MB
        at 10,000 jobs is a few hundred KB to send, which the HTTP thread does
        beside a busy loop. Each encoding has its own render and cache.

        A render walks every series (a second and 8 MB at 10,000 jobs): on the
        loop, heartbeats and stop deadlines would wait for it. prometheus_client
        collects under its own locks, so a render may run beside the loop's
        updates. Once a render takes longer than ``FRESH_RENDER_S`` (thousands
        of jobs), a scrape is answered at once with the last render, at most
        ``STALE_LIMIT_S`` old, and starts the next one: the values lag by one
        scrape interval, the scrape never waits. While a big tick is in flight
        (``busy``) the last render is the answer however fast it was, and none
        starts: a render then takes the CPU the tick's runs need (8 MB at
        10,000 jobs, 100-150 ms beside the loop), and the first scrape after
        the tick renders its values.
        """
        plain, content_type = exposition(self._registry, accept)
        encoder = functools.partial(_gzip, plain) if gzipped else plain
        key = f"{content_type}; gzip" if gzipped else content_type
        last = self._rendered.get(key)
        if last is not None and time.monotonic() - last.at >= STALE_LIMIT_S:
            last = None  # too old to answer with
        if last is not None and self._busy():
            return content_type, last.body
        render = self._render(key, encoder)
        if last is not None and last.took > FRESH_RENDER_S:
            return content_type, last.body
        # A client that goes away must not cancel the render others wait on.
        return content_type, await asyncio.shield(render)

    def _render(self, key: str, encoder: Callable[[], bytes]) -> asyncio.Future[bytes]:
        """The render of ``key`` (a content type and encoding) in progress, or a new one."""
        render = self._renders.get(key)
        if render is not None:
            return render
        started = time.monotonic()
        render = asyncio.ensure_future(asyncio.to_thread(encoder))
        self._renders[key] = render

        def done(finished: asyncio.Future[bytes]) -> None:
            self._renders.pop(key, None)
            if not finished.cancelled() and finished.exception() is None:
                took = time.monotonic() - started
                self._rendered[key] = _Rendered(finished.result(), started, took)

        render.add_done_callback(done)
        return render

    async def _is_ready(self) -> bool:
        try:

            async def ask() -> bool:
                return bool(await self._ready())

            return await asyncio.wait_for(self._on(self._main, ask()), self._ready_timeout)
        except TimeoutError:
            log.warning("ready_check_timed_out", timeout_s=self._ready_timeout)
            return False
        except Exception as exc:
            # An exception is an answer too: not ready. The probe must not 500.
            log.warning("ready_check_failed", error=str(exc) or type(exc).__name__)
            return False


def _safe_detail(detail: Callable[[], list[str]]) -> list[str]:
    try:
        return detail()
    except Exception as exc:
        log.warning("ready_detail_failed", error=str(exc) or type(exc).__name__)
        return []


def _safely(check: Callable[[], bool]) -> bool:
    try:
        return bool(check())
    except Exception as exc:
        log.warning("health_check_failed", error=str(exc) or type(exc).__name__)
        return False


async def _read_request(reader: asyncio.StreamReader, peer: str | None) -> Request:
    """One request: its line, headers and (up to :data:`MAX_BODY`) body."""
    request_line = (await reader.readuntil(b"\r\n")).decode("latin-1").split()
    if len(request_line) != 3 or not request_line[2].startswith("HTTP/"):
        raise ValueError("malformed request line")
    headers: dict[str, tuple[str, ...]] = {}
    for _ in range(MAX_HEADER_LINES):
        line = await reader.readuntil(b"\r\n")
        if line == b"\r\n":
            method, target, _version = request_line
            body = await _read_body(reader, headers)
            return Request(method, target.split("?", 1)[0], headers, body, peer)
        name, _, value = line.decode("latin-1").partition(":")
        key = name.strip().lower()
        headers[key] = (*headers.get(key, ()), value.strip())
    raise ValueError("too many header lines")


async def _read_body(reader: asyncio.StreamReader, headers: Mapping[str, tuple[str, ...]]) -> bytes:
    if "transfer-encoding" in headers:
        raise ValueError("a chunked body; send Content-Length")
    lengths = set(headers.get("content-length", ("0",)))
    if len(lengths) != 1 or not (length := lengths.pop()).isascii() or not length.isdigit():
        raise ValueError("a malformed Content-Length")
    if len(length) > 9 or int(length) > MAX_BODY:
        raise _TooLarge
    return await reader.readexactly(int(length))


def _peer(writer: asyncio.StreamWriter) -> str | None:
    address = writer.get_extra_info("peername")
    return str(address[0]) if isinstance(address, tuple) and address else None


async def _discard_input(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    with contextlib.suppress(OSError, RuntimeError):
        writer.write_eof()
    left = DISCARD_BYTES
    with contextlib.suppress(TimeoutError, ConnectionError):
        async with asyncio.timeout(DISCARD_S):
            while left > 0 and (chunk := await reader.read(min(left, 65536))):
                left -= len(chunk)


async def _respond(
    writer: asyncio.StreamWriter,
    status: int,
    content_type: str,
    body: bytes,
    *,
    length: int | None = None,
    extra: dict[str, str] | None = None,
) -> None:
    headers = {
        "Content-Type": content_type,
        "Content-Length": str(len(body) if length is None else length),
        "Connection": "close",
        **(extra or {}),
    }
    head = f"HTTP/1.1 {status} {REASONS[status]}\r\n" + "".join(
        f"{name}: {value}\r\n" for name, value in headers.items()
    )
    writer.write(head.encode("latin-1") + b"\r\n" + body)
    await writer.drain()
