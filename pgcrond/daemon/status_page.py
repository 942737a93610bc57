"""A status page on the daemon's HTTP port: the cluster's truth, from the database.

Views (each also as JSON, at the same path with ``.json`` or with
``Accept: application/json``; field names are those of ``pgcrond status
--json`` and ``pgcrond history --json``, plus a few of the page's own):

* ``/status`` (and ``/``): every job of this replica's config, what runs now,
  and the live replicas (the registry);
* ``/status/jobs/<code>``: one job's recent ticks and a duration chart;
* ``/status/running`` and ``/status/replicas``.

Who may see it and act (:mod:`pgcrond.daemon.page.auth`): with no
``http.users`` and no ``http.trusted_proxies`` the page is open, read-only and
has no forms (a POST is refused 403). With either, every request must name an
operator; a job's page then has forms (``POST /status/jobs/<code>/pause``,
``/resume``, ``/run``) that pause it with a reason, resume it, or request a
detached run (as ``pgcrond trigger --detach`` does), recorded under the
operator's name, then redirect back to the job's page (POST/redirect/GET).
Authenticated answers are ``Cache-Control: no-store``. ``http.status_page:
false`` takes the whole page away (404); ``/metrics`` and the probes stay.

Rules the code keeps: a GET changes nothing; a POST changes something only
with a signed-in operator and a matching CSRF token; the database is asked
only while a request is answered (no polling), with the bounded, indexed
statements of :mod:`pgcrond.storage.status`, one request at a time, so the
page never holds more than one of the daemon's pooled connections; every
job-provided string is HTML-escaped; the HTML loads nothing from elsewhere and
runs no script (a Content-Security-Policy says so to the browser); the server
renders the SVG chart.

Here: who asks, which view or action, and the answer; the views and their
pieces live in :mod:`pgcrond.daemon.page`.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable, Mapping
from datetime import UTC, datetime
from functools import lru_cache
from importlib import resources

import structlog

from pgcrond import __version__
from pgcrond.config.models import Config
from pgcrond.core.schedule import manual_run_key
from pgcrond.daemon.exchange import Request, Response
from pgcrond.daemon.page import auth
from pgcrond.daemon.page.entries import to_json
from pgcrond.daemon.page.forms import MAX_REASON, read_form
from pgcrond.daemon.page.html import SignedIn, document, esc
from pgcrond.daemon.page.routes import PREFIX, Route, action_route, job_path, not_found, route
from pgcrond.daemon.page.views import PAGE_SIZE, NotFound, View, Views
from pgcrond.errors import PgcrondError
from pgcrond.storage import jobstate
from pgcrond.storage.leases import LeaseStore
from pgcrond.storage.requests import request_run

log = structlog.get_logger("pgcrond.daemon.status_page")

HTML = "text/html; charset=utf-8"
JSON = "application/json; charset=utf-8"
CSS = "text/css; charset=utf-8"
TEXT = "text/plain; charset=utf-8"
# A page that cannot be answered in this long is a 503, not a hung connection.
QUERY_TIMEOUT_S = 5.0
# Every answer of the page: no framing (clickjacking a form), no type sniffing.
PAGE_HEADERS = {"X-Frame-Options": "DENY", "X-Content-Type-Options": "nosniff"}
Answer = tuple[int, str, bytes]


class StatusPage:
    """Answers ``GET`` under ``/status`` from the config and the lease table.

    ``config`` and ``store`` are callables: the daemon reloads its config and
    opens its store after the HTTP server starts.
    """

    def __init__(
        self,
        *,
        config: Callable[[], Config],
        store: Callable[[], LeaseStore | None],
        replica: str,
        version: str = __version__,
        query_timeout: float = QUERY_TIMEOUT_S,
        page_size: int = PAGE_SIZE,
    ) -> None:
        self._config = config
        self._store = store
        self.replica = replica
        self.version = version
        self._query_timeout = query_timeout
        # One request at a time: the page shares the daemon's small pool with
        # claims and heartbeats, and must never take more than one connection.
        self._one_at_a_time = asyncio.Semaphore(1)
        self._password_checks = asyncio.Semaphore(auth.CONCURRENT_CHECKS)
        self._views = Views(replica=replica, version=version, page_size=page_size)

    def serves(self, path: str) -> bool:
        """Whether ``path`` is the page's; nothing is while ``http.status_page`` is false."""
        if not self._config().page_access.enabled:
            return False
        return path in ("/", PREFIX, f"{PREFIX}.json") or path.startswith(f"{PREFIX}/")

    async def handle(self, request: Request) -> Response:
        """Any request under ``/status``: who asks, then a view (GET, HEAD) or an action (POST)."""
        access = self._config().page_access
        if request.method not in ("GET", "HEAD", "POST"):
            allow = "GET, HEAD, POST" if access.authenticated else "GET, HEAD"
            return Response(405, TEXT, b"method not allowed\n", {"Allow": allow})
        accept = request.header("accept")
        as_json = request.path.endswith(".json") or _prefers_json(accept)
        if not access.authenticated:
            if request.method == "POST":
                return self._refusal(
                    403,
                    "Read-only",
                    "this status page is read-only: no one can sign in to act. Set http.users "
                    "or http.trusted_proxies to pause, resume and run jobs from here",
                    as_json,
                )
            return Response(*await self.answer(request.path, accept), PAGE_HEADERS)
        private = {**PAGE_HEADERS, "Cache-Control": "no-store"}
        try:
            who = await auth.operator(access, request, self._password_checks)
        except auth.Denied as denied:
            # Plain text: a stranger learns nothing of the page (replica name, version).
            message = f"{denied.message}\n".encode()
            # A POST is not retried after a login prompt: refused, with nothing done.
            if request.method == "POST" or not denied.challenge:
                return Response(403, TEXT, message, private)
            return Response(401, TEXT, message, {**private, **auth.challenge_header()})
        if request.method == "POST":
            return await self._act(request, who, as_json, private)
        token = auth.csrf_cookie(request)
        headers = dict(private)
        if token is None:
            token = auth.new_csrf_token()
            headers["Set-Cookie"] = auth.set_csrf_cookie(token)
        answer = await self.answer(request.path, accept, signed_in=SignedIn(who, token))
        return Response(*answer, headers)

    async def _act(
        self, request: Request, who: str, as_json: bool, headers: dict[str, str]
    ) -> Response:
        """One POST: checked whole before anything is written; 303 to the job's page."""
        found = action_route(request.path, self._config().jobs)
        if found is None:
            return self._refusal(404, "Not found", not_found(request.path), as_json, headers)
        code, action = found
        form = read_form(request)
        if form is None:
            return self._refusal(
                400, "Bad request", "expected a form (application/x-www-form-urlencoded)",
                as_json, headers,
            )  # fmt: skip
        if not auth.csrf_ok(request, form.get(auth.CSRF_FIELD)):
            log.warning("status_page_denied", peer=request.peer, user=who, why="csrf", job=code)
            return self._refusal(
                403,
                "Forbidden",
                "the form's token is missing or stale: reload the job's page and try again",
                as_json,
                headers,
            )
        reason = form.get("reason", "").strip() or None
        # `pgcrond status` prints the reason to terminals: no control characters.
        if reason is not None and (len(reason) > MAX_REASON or not reason.isprintable()):
            return self._refusal(
                400,
                "Bad request",
                f"a reason is one line of at most {MAX_REASON} printable characters",
                as_json,
                headers,
            )
        try:
            done = await asyncio.wait_for(
                self._apply(action, code, who, reason), self._query_timeout
            )
        except TimeoutError:
            return self._refusal(
                503, "Database too slow", f"not done within {self._query_timeout:g}s; "
                "check the job's page before trying again", as_json, headers,
            )  # fmt: skip
        except PgcrondError as exc:
            log.warning("status_page_failed", path=request.path, error=str(exc))
            return self._refusal(503, "Database unavailable", str(exc), as_json, headers)
        log.info(
            "status_page_action", action=action, job=code, by=who, peer=request.peer, done=done
        )
        location = job_path(code)
        return Response(
            303, TEXT, f"{done}; see {location}\n".encode(), {**headers, "Location": location}
        )

    async def _apply(self, action: str, code: str, who: str, reason: str | None) -> str:
        """Pause, resume or request a run of ``code`` as ``who``; what was done, in words."""
        async with self._one_at_a_time:
            store = self._store()
            if store is None:
                raise records_unavailable()
            if action == "pause":
                await jobstate.pause(store, [code], by=who, reason=reason)
                return "paused"
            if action == "resume":
                resumed = await jobstate.resume(store, [code])
                return "resumed" if resumed else "not paused"
            # The CLI's run key: a double click, or a shell in the same minute, asks once.
            requested = await request_run(store, code, manual_run_key(datetime.now(UTC)), by=who)
            return "requested" if requested.opened else "already requested"

    def _refusal(
        self,
        status: int,
        title: str,
        message: str,
        as_json: bool,
        headers: Mapping[str, str] = PAGE_HEADERS,
    ) -> Response:
        return Response(*self._error(status, title, message, as_json), headers)

    async def answer(self, path: str, accept: str, *, signed_in: SignedIn | None = None) -> Answer:
        """(status, content type, body) of a GET (the HTTP layer drops the body for HEAD).

        ``signed_in``: the operator the page is drawn for (a job's page gets its
        forms); None draws the read-only page.
        """
        found = route(path, self._config().jobs)
        if found is not None and found.view == "stylesheet":
            return 200, CSS, _stylesheet()
        as_json = (path.endswith(".json") if found is None else found.as_json) or _prefers_json(
            accept
        )
        if found is None:
            return self._error(404, "Not found", not_found(path), as_json)
        started = time.perf_counter()
        try:
            view = await asyncio.wait_for(self._view(found, signed_in), self._query_timeout)
        except NotFound as exc:
            return self._error(404, "Not found", str(exc), as_json)
        except TimeoutError:
            return self._error(
                503, "Database too slow", f"no answer within {self._query_timeout:g}s", as_json
            )
        except PgcrondError as exc:
            # Database errors are translated and redacted at the storage boundary.
            log.warning("status_page_failed", path=path, error=str(exc))
            return self._error(503, "Database unavailable", str(exc), as_json)
        if as_json:
            return 200, JSON, to_json(view.data).encode()
        took_ms = (time.perf_counter() - started) * 1000
        page = document(
            view.title,
            view.body,
            view.json_path,
            took_ms,
            signed_in,
            replica=self.replica,
            version=self.version,
        )
        return 200, HTML, page.encode()

    async def _view(self, found: Route, signed_in: SignedIn | None) -> View:
        async with self._one_at_a_time:
            store = self._store()
            if store is None:
                raise records_unavailable()
            config = self._config()
            now = datetime.now(UTC)
            match found.view:
                case "overview":
                    return await self._views.overview(store, config, now, found.page)
                case "running":
                    return await self._views.running(store, config, now)
                case "replicas":
                    return await self._views.replicas(store, now)
                case "job" if found.code in config.jobs:
                    return await self._views.job(store, config.jobs[found.code], now, signed_in)
        # A reload between routing and here removed the job.
        raise NotFound(f"no job {found.code!r} in this replica's config")

    def _error(self, status: int, title: str, message: str, as_json: bool) -> Answer:
        if as_json:
            body = json.dumps({"error": message}, ensure_ascii=False) + "\n"
            return status, JSON, body.encode()
        page = document(
            title,
            f'<p class="error">{esc(message)}</p>',
            PREFIX + ".json",
            0,
            replica=self.replica,
            version=self.version,
        )
        return status, HTML, page.encode()


def records_unavailable() -> PgcrondError:
    return PgcrondError("the daemon is still starting: connecting to and migrating its database")


def _prefers_json(accept: str) -> bool:
    """JSON when asked for and HTML is not: a browser's ``text/html,…,*/*`` gets HTML."""
    kinds = [part.split(";", 1)[0].strip().lower() for part in accept.split(",")]
    return "application/json" in kinds and "text/html" not in kinds


@lru_cache(maxsize=1)
def _stylesheet() -> bytes:
    return resources.files(__package__).joinpath("static/status.css").read_bytes()
