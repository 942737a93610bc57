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
import contextlib
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

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
    ) -> None:
        self.host, self._port = parse_listen(listen)
        self._status_page = status_page
        self._health = health
        self._ready = ready
        self._registry = registry
        self._ready_timeout = ready_timeout
        self._ready_detail = ready_detail
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
        self._server = await asyncio.start_server(self._serve, self.host, self._port)
        log.info("http_listening", host=self.host or "*", port=self.port)

    async def stop(self) -> None:
        if self._server is None:
            return
        self._server.close()
        await self._server.wait_closed()
        self._server = None

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
            return await self._status_page.handle(request)
        return Response(*await self._probe(request.method, request.path, request.header("accept")))

    async def _probe(self, method: str, path: str, accept: str) -> tuple[int, str, bytes]:
        if path not in ("/healthz", "/readyz", "/metrics"):
            return 404, TEXT, b"not found\n"
        if method not in ("GET", "HEAD"):
            return 405, TEXT, b"method not allowed\n"
        if path == "/healthz":
            healthy = _safely(self._health)
            return (200, TEXT, b"ok\n") if healthy else (503, TEXT, b"unhealthy\n")
        if path == "/readyz":
            ready = await self._is_ready()
            # Details (stale jobs) follow the first line; they never change the status.
            body = "ok\n" if ready else "not ready\n"
            if self._ready_detail is not None:
                body += "".join(f"{line}\n" for line in _safe_detail(self._ready_detail))
            return (200 if ready else 503), TEXT, body.encode()
        return 200, *await self._metrics(accept)

    async def _metrics(self, accept: str) -> tuple[str, bytes]:
        """The registry, rendered on a worker thread; concurrent scrapes share one render.

        A render walks every series (a second and 8 MB at 10,000 jobs): on the
        loop, heartbeats and stop deadlines would wait for it. prometheus_client
        collects under its own locks, so a render may run beside the loop's
        updates. Once a render takes longer than ``FRESH_RENDER_S`` (thousands
        of jobs), a scrape is answered at once with the last render, at most
        ``STALE_LIMIT_S`` old, and starts the next one: the values lag by one
        scrape interval, the scrape never waits.
        """
        encoder, content_type = exposition(self._registry, accept)
        last = self._rendered.get(content_type)
        render = self._render(content_type, encoder)
        if (
            last is not None
            and last.took > FRESH_RENDER_S
            and time.monotonic() - last.at < STALE_LIMIT_S
        ):
            return content_type, last.body
        # A client that goes away must not cancel the render others wait on.
        return content_type, await asyncio.shield(render)

    def _render(self, content_type: str, encoder: Callable[[], bytes]) -> asyncio.Future[bytes]:
        """The render of ``content_type`` in progress, or a new one."""
        render = self._renders.get(content_type)
        if render is not None:
            return render
        started = time.monotonic()
        render = asyncio.ensure_future(asyncio.to_thread(encoder))
        self._renders[content_type] = render

        def done(finished: asyncio.Future[bytes]) -> None:
            self._renders.pop(content_type, None)
            if not finished.cancelled() and finished.exception() is None:
                took = time.monotonic() - started
                self._rendered[content_type] = _Rendered(finished.result(), started, took)

        render.add_done_callback(done)
        return render

    async def _is_ready(self) -> bool:
        try:
            return bool(await asyncio.wait_for(self._ready(), self._ready_timeout))
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
