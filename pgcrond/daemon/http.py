"""``/healthz``, ``/readyz``, ``/metrics`` and the status page, served by aiohttp.

aiohttp's server rather than uvicorn and an ASGI app: it runs on an event loop
we create and own (the HTTP thread's, below) without installing signal
handlers or owning the process, it reloads a TLS certificate into the same
:class:`ssl.SSLContext` for the connections that follow, and it brings the
request, header, cookie and form parsing the page needs, where an ASGI app
would parse those itself. The request parsing, keep-alive and HTTP/1.1 framing
are aiohttp's; here are the routes, the limits and the thread.

Limits (:class:`Limits`; docs/operations.md lists them): at most
``max_connections`` open connections, the oldest idle one closed to admit a
new one once full (an idle flood cannot lock out a probe) and a new one
refused when every one is busy; a connection that has not sent a whole
request within ``idle_timeout`` (or sends nothing more after an answer) is
closed; request lines and header fields of at most 8 KiB, at most 64 headers,
a body of at most 16 KiB read within ``idle_timeout``. No header is ever
logged: the ``Authorization`` header carries a password.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import functools
import gzip
import logging
import ssl
import threading
import time
from collections.abc import Awaitable, Callable, Coroutine
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypeVar

import structlog
from aiohttp import http_exceptions, web
from aiohttp.web_protocol import RequestHandler
from prometheus_client import CollectorRegistry

from pgcrond.config.listen import parse_listen as read_listen
from pgcrond.config.models import HttpLimits
from pgcrond.core.access import TlsFiles
from pgcrond.daemon.exchange import Request, Response
from pgcrond.daemon.metrics import exposition
from pgcrond.errors import ValidationError

if TYPE_CHECKING:
    from pgcrond.daemon.status_page import StatusPage

log = structlog.get_logger("pgcrond.daemon.http")

# A probe that takes longer than this is a failed probe: better a 503 now than
# a kubelet timeout that says nothing.
READY_TIMEOUT_S = 2.0
# How long stop() waits for the HTTP thread and its open connections to end.
CLOSE_WAIT_S = 5.0
T = TypeVar("T")
# A status page form (a job code, a reason, a token) is a few hundred bytes.
MAX_BODY = 16 * 1024
# aiohttp's own defaults for a line and a header field; fewer headers than its
# 128: no browser, proxy or scraper sends more than a few dozen.
MAX_LINE = 8190
MAX_HEADERS = 64
# Connections the kernel queues while the server is busy accepting: they hold
# no descriptor of ours until accepted.
BACKLOG = 128
# A refusal at the connection limit is logged at most this often.
REFUSAL_LOG_S = 60.0
TEXT = "text/plain; charset=utf-8"
PROBES = ("/healthz", "/readyz", "/metrics")

# /metrics: a render slower than this (thousands of jobs) makes scrapes take
# the last render and refresh it behind; never one older than the limit.
FRESH_RENDER_S = 0.05
STALE_LIMIT_S = 60.0


class _ClientGarbage(logging.Filter):
    """Drops aiohttp's ERROR line (with traceback) for a request it could not parse.

    That is a client's garbage, answered 400 already, not a fault of ours;
    an exception from a handler is still logged.
    """

    def filter(self, record: logging.LogRecord) -> bool:
        error = record.exc_info[1] if record.exc_info else None
        return not isinstance(error, http_exceptions.HttpProcessingError)


_server_log = logging.getLogger("pgcrond.daemon.http.server")
_server_log.addFilter(_ClientGarbage())


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


def parse_listen(listen: str) -> tuple[str | None, int]:
    """``host:port``, ``[::1]:port`` or ``:port`` -> (host, port); host None = all interfaces.

    The one reading is :func:`pgcrond.config.listen.parse_listen`; here "" (off) is an error.
    """
    address = read_listen(listen)
    if address is None:
        raise ValidationError("http.listen", "'' turns HTTP off; there is no address to serve on")
    return address.host, address.port


def tls_context(files: TlsFiles) -> ssl.SSLContext:
    """A server context holding ``files``' certificate chain and key."""
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.load_cert_chain(files.cert, files.key)
    return context


class _Refused(asyncio.Protocol):
    """A connection over the limit while every open one is busy: closed at once."""

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        transport.close()


class _Watched(asyncio.Protocol):
    """One connection's aiohttp handler, and whether its client has sent a byte yet.

    Full, the server closes a connection that has sent nothing before one
    that has sent its request: a flood of silent connections, however fast it
    reconnects, cannot push out a probe that has spoken.
    """

    def __init__(self, handler: RequestHandler, gone: Callable[[_Watched], None]) -> None:
        self.handler = handler
        self.spoke = False
        self._gone = gone

    @property
    def open(self) -> bool:
        return self.handler.transport is not None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.handler.connection_made(transport)

    def data_received(self, data: bytes) -> None:
        self.spoke = True
        self.handler.data_received(data)

    def eof_received(self) -> None:
        # aiohttp's answer is always None: the transport closes on the client's EOF.
        self.handler.eof_received()

    def pause_writing(self) -> None:
        self.handler.pause_writing()

    def resume_writing(self) -> None:
        self.handler.resume_writing()

    def connection_lost(self, exc: Exception | None) -> None:
        self._gone(self)
        self.handler.connection_lost(exc)


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
        limits: HttpLimits | None = None,
        tls: TlsFiles | None = None,
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
        self._limits = limits or HttpLimits()
        self._tls = tls
        self._context = None if tls is None else tls_context(tls)
        self._server: asyncio.Server | None = None
        self._runner: web.AppRunner | None = None
        # Connections answering a request now: never closed to admit another.
        self._working: set[RequestHandler] = set()
        # Every open connection, oldest first (a dict keeps the order).
        self._open: dict[_Watched, None] = {}
        self._refused_logged = 0.0
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

    @property
    def scheme(self) -> str:
        return "http" if self._context is None else "https"

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
            self._server = await self._on(self._loop, self._listen())
        except BaseException:
            await self._end_loop()
            raise
        log.info("http_listening", host=self.host or "*", port=self.port, scheme=self.scheme)

    async def _listen(self) -> asyncio.Server:
        app = web.Application(client_max_size=MAX_BODY, middlewares=[self._in_flight])
        app.router.add_get("/healthz", self._healthz)
        app.router.add_get("/readyz", self._readyz)
        app.router.add_get("/metrics", self._metrics_route)
        app.router.add_route("*", "/{path:.*}", self._other)
        idle = self._limits.idle_timeout.total_seconds()
        self._runner = web.AppRunner(
            app,
            handle_signals=False,
            access_log=None,
            logger=_server_log,
            keepalive_timeout=idle,
            max_line_size=MAX_LINE,
            max_field_size=MAX_LINE,
            max_headers=MAX_HEADERS,
            shutdown_timeout=CLOSE_WAIT_S,
        )
        await self._runner.setup()
        return await asyncio.get_running_loop().create_server(
            self._admit,
            self.host,
            self._port,
            ssl=self._context,
            ssl_handshake_timeout=idle if self._context is not None else None,
            backlog=BACKLOG,
            reuse_address=True,
        )

    def _admit(self) -> asyncio.BaseProtocol:
        """The protocol of a new connection, within ``max_connections``.

        Full, a connection is closed for it: the oldest that has sent nothing
        yet, else the oldest idle keep-alive one (as nginx reuses idle
        keep-alive connections when it runs out), never one answering a
        request. So idle connections, however many and however fast they
        come back, cannot keep out a probe, and the descriptors held stay
        bounded beside the jobs' pipes and the database's connections. With
        every connection busy, the new one is closed at once.
        """
        assert self._runner is not None
        server = self._runner.server
        assert server is not None
        # Oldest first; one whose handler closed it holds no descriptor already.
        open_now = [c for c in self._open if c.open]
        if len(open_now) >= self._limits.max_connections:
            silent = (c for c in open_now if not c.spoke)
            idle = (c for c in open_now if c.handler not in self._working)
            evicted = next(silent, None) or next(idle, None)
            if evicted is None:
                now = time.monotonic()
                if now - self._refused_logged >= REFUSAL_LOG_S:
                    self._refused_logged = now
                    log.warning("http_connections_full", limit=self._limits.max_connections)
                return _Refused()
            evicted.handler.force_close()
        watched = _Watched(server(), lambda gone: self._open.pop(gone, None))
        self._open[watched] = None
        return watched

    @web.middleware
    async def _in_flight(
        self, request: web.Request, handler: Callable[[web.Request], Awaitable[web.StreamResponse]]
    ) -> web.StreamResponse:
        protocol = request.protocol
        self._working.add(protocol)
        try:
            return await handler(request)
        finally:
            self._working.discard(protocol)

    def reload_tls(self) -> None:
        """Read the certificate and key again (SIGHUP): the connections that follow use them.

        Called on the daemon's loop; the context is shared with the HTTP thread,
        and OpenSSL swaps the chain under its own lock. A file that cannot be
        read keeps the chain already loaded.
        """
        if self._context is None or self._tls is None:
            return
        try:
            self._context.load_cert_chain(self._tls.cert, self._tls.key)
        except (OSError, ssl.SSLError) as exc:
            log.error("http_tls_reload_failed", cert=str(self._tls.cert), error=str(exc))
            return
        log.info("http_tls_reloaded", cert=str(self._tls.cert))

    async def stop(self) -> None:
        if self._server is None:
            return
        server, self._server = self._server, None
        runner = self._runner

        async def close() -> None:
            server.close()
            if runner is not None:
                await runner.cleanup()

        await self._on(self._loop, close())
        await self._end_loop()

    async def _end_loop(self) -> None:
        self._loop.call_soon_threadsafe(self._loop.stop)
        await asyncio.to_thread(self._thread.join, CLOSE_WAIT_S)

    @staticmethod
    async def _on(loop: asyncio.AbstractEventLoop, work: Coroutine[Any, Any, T]) -> T:
        """``work`` run on ``loop``, awaited from the running one."""
        return await asyncio.wrap_future(asyncio.run_coroutine_threadsafe(work, loop))

    async def _healthz(self, request: web.Request) -> web.Response:
        if _safely(self._health):
            return _text(200, "ok\n")
        return _text(503, "unhealthy\n")

    async def _readyz(self, request: web.Request) -> web.Response:
        ready = await self._is_ready()
        # Details (stale jobs) follow the first line; they never change the status.
        body = "ok\n" if ready else "not ready\n"
        if self._ready_detail is not None:
            body += "".join(f"{line}\n" for line in _safe_detail(self._ready_detail))
        return _text(200 if ready else 503, body)

    async def _metrics_route(self, request: web.Request) -> web.Response:
        gzipped = accepts_gzip(request.headers.get("Accept-Encoding", ""))
        content_type, body = await self._metrics(request.headers.get("Accept", ""), gzipped)
        headers = {"Content-Type": content_type, "Vary": "Accept-Encoding"}
        if gzipped:
            headers["Content-Encoding"] = "gzip"
        return web.Response(status=200, body=body, headers=headers)

    async def _other(self, request: web.Request) -> web.Response:
        """The status page's paths, a probe asked with another method (405), or a 404."""
        path = request.rel_url.raw_path
        if self._status_page is not None and self._status_page.serves(path):
            return await self._page(request, path)
        if path in PROBES:
            return _text(405, "method not allowed\n", {"Allow": "GET, HEAD"})
        return _text(404, "not found\n")

    async def _page(self, request: web.Request, path: str) -> web.Response:
        assert self._status_page is not None
        body = b""
        if request.method == "POST":
            try:
                async with asyncio.timeout(self._limits.idle_timeout.total_seconds()):
                    body = await request.read()
            except TimeoutError:
                return _text(408, "the body did not arrive in time\n")
        asked = Request(
            method=request.method,
            path=path,
            headers={name.lower(): tuple(request.headers.getall(name)) for name in request.headers},
            body=body,
            peer=request.remote,
            secure=request.secure,
            query={name: request.query[name] for name in request.query},
        )
        try:
            answer = await self._on(self._main, self._status_page.handle(asked))
        except Exception as exc:
            # A bug must cost one answer, not the connection unanswered.
            log.error("http_request_failed", path=path[:200], error=repr(exc)[:500])
            return _text(500, "internal error\n")
        return _response(answer)

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


def _text(status: int, body: str, headers: dict[str, str] | None = None) -> web.Response:
    return web.Response(
        status=status, body=body.encode(), headers={"Content-Type": TEXT, **(headers or {})}
    )


def _response(answer: Response) -> web.Response:
    return web.Response(
        status=answer.status,
        body=answer.body,
        headers={"Content-Type": answer.content_type, **answer.headers},
    )


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
