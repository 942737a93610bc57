"""A status page on the daemon's HTTP port: the cluster's truth, from the database.

Views (each also as JSON, at the same path with ``.json`` or with
``Accept: application/json``; field names are those of ``pgcrond status
--json`` and ``pgcrond history --json``, plus a few of the page's own):

* ``/status`` (and ``/``): every job of this replica's config (filtered by
  ``?q=CODE-OR-GLOB&show=failing|paused|active``), what runs now, and the live
  replicas (the registry);
* ``/status/jobs/<code>``: one job's recent ticks (``?since=&until=``, ISO-8601
  UTC, for a range) and a duration chart;
* ``/status/running`` and ``/status/replicas``.

Where it is served: on a loopback listener, or anywhere once ``http.users``
or ``http.trusted_proxies`` asks who you are, or ``http.status_page: public``
opens it (:meth:`PageAccess.served_on`); otherwise a listener answers only
``/healthz``, ``/readyz`` and ``/metrics``. ``http.status_page: false`` takes
the page away everywhere (404).

Who may act (:mod:`pgcrond.daemon.page.auth`): without users and trusted
proxies the page is read-only and has no forms (a POST is refused 403). With
either, every request must name a user; a ``viewer`` reads, an ``operator``
(within its job globs) gets forms on a job's page (``POST
/status/jobs/<code>/pause``, ``/resume``, ``/run``) that pause it with a
reason, resume it, or request a detached run (as ``pgcrond trigger
--detach`` does), recorded under their name, then redirect back to the job's
page (POST/redirect/GET). A POST without credentials is 401; from another
origin, by a viewer, or without a token this server issued to that user, 403.
Authenticated answers are ``Cache-Control: no-store``.

Rules the code keeps: a GET changes nothing; the database is asked only while
a request is answered, with the bounded, indexed statements of
:mod:`pgcrond.storage.status`, one request at a time, so the page never holds
more than one of the daemon's pooled connections; every page is a Jinja2
template with autoescape; the HTML loads nothing from elsewhere and runs no
script (a Content-Security-Policy says so to the browser); it refreshes
itself with a ``meta`` refresh the viewer can switch off (``?refresh=off``).
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable, Mapping
from datetime import UTC, datetime
from functools import lru_cache
from importlib import resources
from typing import Any
from urllib.parse import urlencode

import structlog

from pgcrond import __version__
from pgcrond.config.models import Config
from pgcrond.core.schedule import manual_run_key
from pgcrond.daemon.exchange import Request, Response
from pgcrond.daemon.page import auth
from pgcrond.daemon.page.entries import to_json
from pgcrond.daemon.page.forms import MAX_REASON, read_form
from pgcrond.daemon.page.render import render
from pgcrond.daemon.page.routes import (
    PREFIX,
    STYLESHEET,
    Route,
    action_route,
    job_path,
    not_found,
    route,
)
from pgcrond.daemon.page.views import (
    PAGE_SIZE,
    SHOWS,
    HistoryRange,
    JobFilter,
    NotFound,
    SignedIn,
    View,
    Views,
)
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
# How often an open page reloads itself: fresher than a scrape interval would
# be wasted on a human, and one request per viewer per half minute costs the
# database nothing it notices. ?refresh=N picks another, within the bounds.
REFRESH_S = 30
REFRESH_BOUNDS_S = (5, 3600)
# Every answer of the page: no framing (clickjacking a form), no type sniffing.
PAGE_HEADERS = {"X-Frame-Options": "DENY", "X-Content-Type-Options": "nosniff"}
NAV = ((PREFIX, "Jobs"), (f"{PREFIX}/running", "Running"), (f"{PREFIX}/replicas", "Replicas"))
Answer = tuple[int, str, bytes]


class BadQuery(Exception):
    """A query parameter the page cannot read: a 400 saying which and why."""


class StatusPage:
    """Answers requests under ``/status`` from the config and the lease table.

    ``config`` and ``store`` are callables: the daemon reloads its config and
    opens its store after the HTTP server starts. ``host``: the listener's
    address (None: every interface), which decides whether the page is served.
    """

    def __init__(
        self,
        *,
        config: Callable[[], Config],
        store: Callable[[], LeaseStore | None],
        replica: str,
        host: str | None = "127.0.0.1",
        version: str = __version__,
        query_timeout: float = QUERY_TIMEOUT_S,
        page_size: int = PAGE_SIZE,
    ) -> None:
        self._config = config
        self._store = store
        self._host = host
        self.replica = replica
        self.version = version
        self._query_timeout = query_timeout
        # One request at a time: the page shares the daemon's small pool with
        # claims and heartbeats, and must never take more than one connection.
        self._one_at_a_time = asyncio.Semaphore(1)
        self._password_checks = asyncio.Semaphore(auth.CONCURRENT_CHECKS)
        self._views = Views(replica=replica, version=version, page_size=page_size)

    def serves(self, path: str) -> bool:
        """Whether ``path`` is the page's here (see :meth:`PageAccess.served_on`)."""
        if not self._config().page_access.served_on(self._host):
            return False
        return path in ("/", PREFIX, f"{PREFIX}.json") or path.startswith(f"{PREFIX}/")

    async def handle(self, request: Request) -> Response:
        """Any request under ``/status``: who asks, then a view (GET, HEAD) or an action (POST)."""
        access = self._config().page_access
        if request.method not in ("GET", "HEAD", "POST"):
            allow = "GET, HEAD, POST" if access.authenticated else "GET, HEAD"
            return Response(405, TEXT, b"method not allowed\n", {"Allow": allow})
        as_json = request.path.endswith(".json") or _prefers_json(request.header("accept"))
        if not access.authenticated:
            if request.method == "POST":
                return self._refusal(
                    403,
                    "Read-only",
                    "this status page is read-only: no one can sign in to act. Set http.users "
                    "or http.trusted_proxies to pause, resume and run jobs from here",
                    as_json,
                )
            answer = await self.answer(request.path, request.header("accept"), request.query)
            return Response(*answer, PAGE_HEADERS)
        private = {**PAGE_HEADERS, "Cache-Control": "no-store"}
        try:
            who = await auth.signed_in(access, request, self._password_checks)
        except auth.Denied as denied:
            # Plain text: a stranger learns nothing of the page (replica name, version).
            message = f"{denied.message}\n".encode()
            if not denied.challenge:
                return Response(403, TEXT, message, private)
            return Response(401, TEXT, message, {**private, **auth.challenge_header()})
        if request.method == "POST":
            return await self._act(request, who, as_json, private)
        signed = SignedIn(who.name, who.user.role, auth.issue_token(access, who.name))
        answer = await self.answer(
            request.path, request.header("accept"), request.query, signed=signed, who=who
        )
        return Response(*answer, private)

    async def _act(
        self, request: Request, who: auth.Who, as_json: bool, headers: dict[str, str]
    ) -> Response:
        """One POST: checked whole before anything is written; 303 to the job's page."""
        found = action_route(request.path, self._config().jobs)
        if found is None:
            return self._refusal(404, "Not found", not_found(request.path), as_json, headers)
        code, action = found
        elsewhere = auth.same_origin(request)
        if elsewhere is not None:
            log.warning(
                "status_page_denied", peer=request.peer, user=who.name, why="origin", job=code,
                sent=elsewhere,
            )  # fmt: skip
            return self._refusal(
                403, "Forbidden", "this form was not sent from this page", as_json, headers
            )
        if not who.user.may_act(code):
            log.warning(
                "status_page_denied", peer=request.peer, user=who.name, why="role", job=code
            )
            return self._refusal(
                403,
                "Forbidden",
                f"{who.name} is a {who.user.role} and may not {action} {code}",
                as_json,
                headers,
            )
        form = read_form(request)
        if form is None:
            return self._refusal(
                400, "Bad request", "expected a form (application/x-www-form-urlencoded)",
                as_json, headers,
            )  # fmt: skip
        access = self._config().page_access
        if not auth.token_ok(access, who.name, form.get(auth.CSRF_FIELD)):
            log.warning(
                "status_page_denied", peer=request.peer, user=who.name, why="csrf", job=code
            )
            return self._refusal(
                403,
                "Forbidden",
                "the form's token is missing, stale or not this server's: reload the job's page "
                "and try again",
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
                self._apply(action, code, who.name, reason), self._query_timeout
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
            "status_page_action", action=action, job=code, by=who.name, peer=request.peer, done=done
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

    async def answer(
        self,
        path: str,
        accept: str,
        query: Mapping[str, str] | None = None,
        *,
        signed: SignedIn | None = None,
        who: auth.Who | None = None,
    ) -> Answer:
        """(status, content type, body) of a GET (the HTTP layer drops the body for HEAD).

        ``signed``/``who``: the user the page is drawn for (an operator's job
        page gets its forms); None draws the read-only page.
        """
        query = query or {}
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
            view = await asyncio.wait_for(self._view(found, query), self._query_timeout)
        except BadQuery as exc:
            return self._error(400, "Bad request", str(exc), as_json)
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
        may_act = who is not None and found.view == "job" and who.user.may_act(found.code)
        # A form being filled in must not be reloaded away: an operator's job
        # page refreshes only when asked to.
        refresh_default = not may_act
        refresh = _refresh(query, refresh_default)
        page = render(
            view.template,
            {
                **view.context,
                **self._frame(view.title, view.json_path, signed),
                "took_ms": (time.perf_counter() - started) * 1000,
                "refresh": refresh,
                "refresh_link": _refresh_links(path, query, refresh_default),
                "may_act": may_act,
                "csrf_field": auth.CSRF_FIELD,
                "max_reason": MAX_REASON,
                "page_link": lambda n: _page_link(n, query),
            },
        )
        return 200, HTML, page.encode()

    def _frame(self, title: str, json_path: str, signed: SignedIn | None) -> dict[str, Any]:
        """What the document around every view shows."""
        return {
            "title": title,
            "json_path": json_path,
            "signed_in": signed,
            "prefix": PREFIX,
            "nav": NAV,
            "stylesheet": STYLESHEET,
            "replica": self.replica,
            "version": self.version,
            "now": datetime.now(UTC),
        }

    async def _view(self, found: Route, query: Mapping[str, str]) -> View:
        async with self._one_at_a_time:
            store = self._store()
            if store is None:
                raise records_unavailable()
            config = self._config()
            now = datetime.now(UTC)
            match found.view:
                case "overview":
                    chosen = _job_filter(query)
                    return await self._views.overview(store, config, now, found.page, chosen)
                case "running":
                    return await self._views.running(store, config, now)
                case "replicas":
                    return await self._views.replicas(store, now)
                case "job" if found.code in config.jobs:
                    history = _history_range(query)
                    return await self._views.job(store, config.jobs[found.code], now, history)
        # A reload between routing and here removed the job.
        raise NotFound(f"no job {found.code!r} in this replica's config")

    def _error(self, status: int, title: str, message: str, as_json: bool) -> Answer:
        if as_json:
            body = json.dumps({"error": message}, ensure_ascii=False) + "\n"
            return status, JSON, body.encode()
        context = {
            **self._frame(title, PREFIX + ".json", None),
            "message": message,
            "took_ms": 0,
            "refresh": None,
            "refresh_link": None,
        }
        return status, HTML, render("error.html", context).encode()


def records_unavailable() -> PgcrondError:
    return PgcrondError("the daemon is still starting: connecting to and migrating its database")


def _prefers_json(accept: str) -> bool:
    """JSON when asked for and HTML is not: a browser's ``text/html,…,*/*`` gets HTML."""
    kinds = [part.split(";", 1)[0].strip().lower() for part in accept.split(",")]
    return "application/json" in kinds and "text/html" not in kinds


def _job_filter(query: Mapping[str, str]) -> JobFilter:
    show = query.get("show", "all") or "all"
    if show not in SHOWS:
        raise BadQuery(f"show={show[:40]!r}: one of {', '.join(SHOWS)}")
    return JobFilter(q=query.get("q", "").strip()[:200], show=show)


def _history_range(query: Mapping[str, str]) -> HistoryRange:
    since_text = query.get("since", "").strip()
    until_text = query.get("until", "").strip()
    return HistoryRange(
        _instant("since", since_text), _instant("until", until_text), since_text, until_text
    )


def _instant(name: str, text: str) -> datetime | None:
    """An ISO-8601 instant; without an offset it is UTC."""
    if not text:
        return None
    try:
        value = datetime.fromisoformat(text[:64])
    except ValueError:
        raise BadQuery(
            f"{name}={text[:64]!r} is not an ISO-8601 instant like 2026-03-29T00:00:00Z"
        ) from None
    return value if value.tzinfo is not None else value.replace(tzinfo=UTC)


def _refresh(query: Mapping[str, str], default: bool) -> int | None:
    """Seconds between reloads (``?refresh=off``, ``on`` or a number of seconds), or None."""
    asked = query.get("refresh", "")
    if asked == "off":
        return None
    if asked.isascii() and asked.isdigit() and len(asked) < 6:
        low, high = REFRESH_BOUNDS_S
        return min(max(int(asked), low), high)
    return REFRESH_S if default or asked == "on" else None


def _refresh_links(path: str, query: Mapping[str, str], default: bool) -> dict[str, Any]:
    """Links to this same view with refreshing switched off and on."""
    kept = {k: v for k, v in query.items() if k != "refresh"}
    on = {**kept} if default else {**kept, "refresh": "on"}
    off = {**kept, "refresh": "off"}
    return {
        "on": path + (f"?{urlencode(on)}" if on else ""),
        "off": f"{path}?{urlencode(off)}",
        "every": REFRESH_S,
    }


def _page_link(page: int, query: Mapping[str, str]) -> str:
    base = PREFIX if page == 1 else f"{PREFIX}/page/{page}"
    return base + (f"?{urlencode(query)}" if query else "")


@lru_cache(maxsize=1)
def _stylesheet() -> bytes:
    return resources.files(__package__).joinpath("static/status.css").read_bytes()
