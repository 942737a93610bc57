"""A status page on the daemon's HTTP port: the cluster's truth, from the database.

Views (each also as JSON, at the same path with ``.json`` or with
``Accept: application/json``; field names are those of ``pgcrond status
--json`` and ``pgcrond history --json``, plus a few of the page's own):

* ``/status`` (and ``/``): every job of this replica's config, what runs now,
  and the live replicas (the registry);
* ``/status/jobs/<code>``: one job's recent ticks and a duration chart;
* ``/status/running`` and ``/status/replicas``.

Who may see it and act (:mod:`pgcrond.daemon.page_auth`): with no
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
"""

from __future__ import annotations

import asyncio
import json
import re
import time
from collections.abc import Callable, Container, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from functools import lru_cache
from html import escape
from importlib import resources
from typing import Any, Literal
from urllib.parse import parse_qsl, quote, unquote

import structlog

from pgcrond import __version__, report
from pgcrond.config.models import Config, JobConfig
from pgcrond.core.durations import format_duration
from pgcrond.core.schedule import Schedule, manual_run_key, tick_of
from pgcrond.daemon import page_auth
from pgcrond.daemon.exchange import Request, Response
from pgcrond.errors import PgcrondError
from pgcrond.storage import attempts, jobstate, registry
from pgcrond.storage import status as reads
from pgcrond.storage.leases import LeaseStore
from pgcrond.storage.requests import request_run

log = structlog.get_logger("pgcrond.daemon.status_page")

PREFIX = "/status"
STYLESHEET = f"{PREFIX}/status.css"
HTML = "text/html; charset=utf-8"
JSON = "application/json; charset=utf-8"
CSS = "text/css; charset=utf-8"
TEXT = "text/plain; charset=utf-8"
# A page that cannot be answered in this long is a 503, not a hung connection.
QUERY_TIMEOUT_S = 5.0
# Jobs per page of the jobs view: the page's cost grows with the jobs it draws.
PAGE_SIZE = 100
FAILING_SHOWN = 20
# Next fire instants: one in the jobs view, this many on a job's page.
NEXT_FIRES = 5
ERROR_WIDTH = 120
# No script, no frame, nothing from elsewhere; the stylesheet and inline SVG
# are the page's only resources, and forms (shown to a signed-in operator
# only) post back here. In a <meta>, so the HTTP layer stays generic.
CSP = (
    "default-src 'none'; style-src 'self'; img-src 'self' data:; "
    "base-uri 'none'; form-action {forms}"
)
# What a job's page can do for a signed-in operator: the last path segment of its POST.
ACTIONS = ("pause", "resume", "run")
MAX_REASON = 500
# The form fields a POST may carry; more is not a form of this page.
MAX_FIELDS = 4
# Every answer of the page: no framing (clickjacking a form), no type sniffing.
PAGE_HEADERS = {"X-Frame-Options": "DENY", "X-Content-Type-Options": "nosniff"}
# Outcome -> CSS class of a strip cell and a chart bar.
OUTCOME_CLASSES = {
    "SUCCESS": "ok",
    "FAIL": "fail",
    "SKIPPED": "skip",
    "MISSED": "miss",
    "RUNNING": "run",
    "NO_ROW": "miss",
}

# An attempt record's status -> the badge colour of the tick outcome it matches.
ATTEMPT_CLASSES = {
    "success": "ok",
    "fail": "fail",
    "timeout": "fail",
    "lost": "fail",
    "released": "skip",
    "running": "run",
}
# The newest attempts a job's page shows with their output (up to 36 KiB each).
ATTEMPTS_SHOWN = 10

Answer = tuple[int, str, bytes]
# ASCII digits only, and few of them: str.isdigit() also takes '²', which
# int() refuses, and int() refuses more than 4300 digits; no page is that far.
_PAGE_NUMBER = re.compile(r"[0-9]{1,9}")


def esc(value: object) -> str:
    """Text and attribute values alike: ``<``, ``>``, ``&`` and both quotes escaped."""
    return escape("" if value is None else str(value), quote=True)


def job_path(code: str, suffix: str = "") -> str:
    """The path of a job's page; a code may hold any printable character, '/' too."""
    return f"{PREFIX}/jobs/{quote(code, safe='')}{suffix}"


@dataclass(frozen=True)
class Route:
    """What a path under ``/status`` asks for (see :func:`route`)."""

    view: Literal["overview", "running", "replicas", "job", "stylesheet"]
    as_json: bool = False
    page: int = 1
    code: str = ""


def route(path: str, jobs: Container[str]) -> Route | None:
    """The view ``path`` names, or None (a 404); ``jobs`` holds the job codes.

    Total: any text, whatever bytes the request carried, is a route or None,
    never an exception (one would drop the connection unanswered).
    """
    if path == STYLESHEET:
        return Route("stylesheet")
    job_prefix = f"{PREFIX}/jobs/"
    if path.startswith(job_prefix):
        code = unquote(path[len(job_prefix) :])
        # A job's code may itself end in ".json": the longest match wins.
        if code in jobs:
            return Route("job", code=code)
        if code.endswith(".json") and code[: -len(".json")] in jobs:
            return Route("job", as_json=True, code=code[: -len(".json")])
        return None
    as_json = path.endswith(".json")
    view = path[: -len(".json")] if as_json else path
    if view in ("/", PREFIX):
        return Route("overview", as_json)
    if view == f"{PREFIX}/running":
        return Route("running", as_json)
    if view == f"{PREFIX}/replicas":
        return Route("replicas", as_json)
    page_prefix = f"{PREFIX}/page/"
    if view.startswith(page_prefix) and _PAGE_NUMBER.fullmatch(view[len(page_prefix) :]):
        return Route("overview", as_json, page=int(view[len(page_prefix) :]))
    return None


class ScheduleMemo:
    """Schedule answers the page asks for on every request, kept while they hold.

    ``next_after`` is pure but not free (tens of microseconds); a thousand jobs
    asked afresh on every request would cost more than the page's queries.
    Entries are keyed by job code and dropped when the job's schedule object
    changes (a reload) or, for next fires, once the first has passed.
    """

    MAX_TICKS = 1 << 16

    def __init__(self) -> None:
        self._fires: dict[str, tuple[Schedule, list[datetime]]] = {}
        self._after: dict[tuple[str, str], tuple[Schedule, datetime | None]] = {}
        self._ticks: dict[str, datetime | None] = {}

    def next_fires(self, job: JobConfig, now: datetime, count: int) -> list[datetime]:
        cached = self._fires.get(job.code)
        fires = cached[1] if cached is not None and cached[0] is job.schedule else []
        fires = [fire for fire in fires if fire > now]
        after = fires[-1] if fires else now
        while len(fires) < count:
            fire = job.schedule.next_after(after)
            if fire is None:
                break
            fires.append(fire)
            after = fire
        self._fires[job.code] = (job.schedule, fires)
        return fires[:count]

    def tick(self, run_key: str | None) -> datetime | None:
        """The tick a run key names (None: a manual run or run-once), parsed once."""
        if run_key is None:
            return None
        if run_key not in self._ticks:
            if len(self._ticks) >= self.MAX_TICKS:
                self._ticks.clear()
            self._ticks[run_key] = tick_of(run_key)
        return self._ticks[run_key]

    def tick_after(self, job: JobConfig, run_key: str) -> datetime | None:
        """The tick after the one ``run_key`` names; None for a run key that is no tick."""
        cached = self._after.get((job.code, run_key))
        if cached is not None and cached[0] is job.schedule:
            return cached[1]
        tick = self.tick(run_key)
        after = None if tick is None else job.schedule.next_after(tick)
        if len(self._after) >= self.MAX_TICKS:
            self._after.clear()  # crude, and enough: it refills from the next request
        self._after[(job.code, run_key)] = (job.schedule, after)
        return after


def action_route(path: str, jobs: Container[str]) -> tuple[str, str] | None:
    """(job code, action) a POST's path names, or None (a 404); total, like :func:`route`."""
    job_prefix = f"{PREFIX}/jobs/"
    if not path.startswith(job_prefix):
        return None
    # The code is percent-encoded (job_path), so its own '/' never splits here.
    quoted, _, action = path[len(job_prefix) :].rpartition("/")
    code = unquote(quoted)
    if action not in ACTIONS or code not in jobs:
        return None
    return code, action


@dataclass(frozen=True)
class SignedIn:
    """The operator a page is drawn for, and the CSRF token its forms carry."""

    operator: str
    csrf: str


@dataclass(frozen=True)
class View:
    """What one request shows: its data (the JSON) and how to draw it (the HTML)."""

    title: str
    json_path: str
    data: dict[str, Any]
    body: str


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
        self.page_size = page_size
        self._store = store
        self.replica = replica
        self.version = version
        self._query_timeout = query_timeout
        # One request at a time: the page shares the daemon's small pool with
        # claims and heartbeats, and must never take more than one connection.
        self._one_at_a_time = asyncio.Semaphore(1)
        self._password_checks = asyncio.Semaphore(page_auth.CONCURRENT_CHECKS)
        self._memo = ScheduleMemo()

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
            who = await page_auth.operator(access, request, self._password_checks)
        except page_auth.Denied as denied:
            # Plain text: a stranger learns nothing of the page (replica name, version).
            message = f"{denied.message}\n".encode()
            # A POST is not retried after a login prompt: refused, with nothing done.
            if request.method == "POST" or not denied.challenge:
                return Response(403, TEXT, message, private)
            return Response(401, TEXT, message, {**private, **page_auth.challenge_header()})
        if request.method == "POST":
            return await self._act(request, who, as_json, private)
        token = page_auth.csrf_cookie(request)
        headers = dict(private)
        if token is None:
            token = page_auth.new_csrf_token()
            headers["Set-Cookie"] = page_auth.set_csrf_cookie(token)
        answer = await self.answer(request.path, accept, signed_in=SignedIn(who, token))
        return Response(*answer, headers)

    async def _act(
        self, request: Request, who: str, as_json: bool, headers: dict[str, str]
    ) -> Response:
        """One POST: checked whole before anything is written; 303 to the job's page."""
        found = action_route(request.path, self._config().jobs)
        if found is None:
            return self._refusal(404, "Not found", _not_found(request.path), as_json, headers)
        code, action = found
        form = _form(request)
        if form is None:
            return self._refusal(
                400, "Bad request", "expected a form (application/x-www-form-urlencoded)",
                as_json, headers,
            )  # fmt: skip
        if not page_auth.csrf_ok(request, form.get(page_auth.CSRF_FIELD)):
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
            return self._error(404, "Not found", _not_found(path), as_json)
        started = time.perf_counter()
        try:
            view = await asyncio.wait_for(self._view(found, signed_in), self._query_timeout)
        except _NotFound as exc:
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
        page = self._page(view.title, view.body, view.json_path, took_ms, signed_in)
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
                    return await self._overview(store, config, now, found.page)
                case "running":
                    return await self._running_view(store, config, now)
                case "replicas":
                    return await self._replicas_view(store, now)
                case "job" if found.code in config.jobs:
                    return await self._job_view(store, config.jobs[found.code], now, signed_in)
        # A reload between routing and here removed the job.
        raise _NotFound(f"no job {found.code!r} in this replica's config")

    # -- views ------------------------------------------------------------------------------

    async def _overview(self, store: LeaseStore, config: Config, now: datetime, page: int) -> View:
        every = list(config.jobs.values())
        pages = max(1, -(-len(every) // self.page_size))
        if not 1 <= page <= pages:
            raise _NotFound(f"no page {page}: the jobs view has {pages}")
        jobs = every[(page - 1) * self.page_size : page * self.page_size]
        entries = await self._job_entries(store, jobs, now, next_fires=1)
        # Failing jobs across every page: one bounded probe per job, nothing drawn.
        failing = await reads.failing(store, [job.code for job in every])
        running = [running_entry(row) for row in await reads.running(store)]
        replicas, _ = await self._replica_entries(store)
        data = {
            "generated_at": now,
            "replica": self.replica,
            "version": self.version,
            "page": page,
            "pages": pages,
            "jobs": entries,
            "failing": failing,
            "running": running,
            "replicas": replicas,
        }
        cards = (
            _card("jobs", str(len(every)), f"{PREFIX}#jobs")
            + _card("running now", str(len(running)), f"{PREFIX}/running", "run" if running else "")
            + _card("last run failed", str(len(failing)), "#failing", "fail" if failing else "")
            + _card("live replicas", str(len(replicas)), f"{PREFIX}/replicas")
        )
        failing_html = ""
        if failing:
            shown = ", ".join(
                f'<a class="code" href="{esc(job_path(code))}">{esc(code)}</a>'
                for code in failing[:FAILING_SHOWN]
            )
            more = (
                f" and {len(failing) - FAILING_SHOWN} more" if len(failing) > FAILING_SHOWN else ""
            )
            failing_html = f'<p id="failing" class="failing">Last run failed: {shown}{more}</p>'
        first = (page - 1) * self.page_size + 1
        pager = _pager(page, pages, f"jobs {first}–{first + len(jobs) - 1} of {len(every)}")
        json_path = f"{PREFIX}.json" if page == 1 else f"{PREFIX}/page/{page}.json"
        body = (
            f'<section class="cards">{cards}</section>{failing_html}'
            f"<h2>Running now</h2>{_running_table(running, now)}"
            f'<h2 id="jobs">Jobs</h2>{_legend()}{pager if pages > 1 else ""}'
            f"{self._jobs_table(entries, jobs, now)}{pager if pages > 1 else ''}"
        )
        return View("Status", json_path, data, body)

    async def _running_view(self, store: LeaseStore, config: Config, now: datetime) -> View:
        running = [running_entry(row) for row in await reads.running(store)]
        data = {"generated_at": now, "replica": self.replica, "running": running}
        body = f"<h2>Running now</h2>{_running_table(running, now)}"
        return View("Running now", f"{PREFIX}/running.json", data, body)

    async def _replicas_view(self, store: LeaseStore, now: datetime) -> View:
        replicas, drift = await self._replica_entries(store)
        data = {
            "generated_at": now,
            "replica": self.replica,
            "replicas": replicas,
            "drift": report.drift_entry(drift),
        }
        window = format_duration(reads.REPLICAS_WITHIN)
        body = (
            "<h2>Live replicas</h2>"
            f'<p class="note">From the registry: each replica writes its row at start and '
            f"once a minute, and deletes it when it stops. Runs count the rows each replica "
            f"claimed in the last {esc(window)}.</p>"
            f"{_drift_note(drift)}{_replicas_table(replicas, now)}"
        )
        return View("Replicas", f"{PREFIX}/replicas.json", data, body)

    async def _job_view(
        self, store: LeaseStore, job: JobConfig, now: datetime, signed_in: SignedIn | None
    ) -> View:
        [entry] = await self._job_entries(store, [job], now, next_fires=NEXT_FIRES)
        rows = [tick_entry(row) for row in await reads.ticks(store, job.code)]
        asked = [request_entry(row) for row in await reads.requests(store, job.code)]
        kept = [
            attempt_entry(row)
            for row in await attempts.of_job(store, job.code, limit=ATTEMPTS_SHOWN)
        ]
        data = {
            "generated_at": now,
            "replica": self.replica,
            "job": entry,
            "ticks": rows,
            "requests": asked,
            "attempts": kept,
        }
        actions = "" if signed_in is None else _actions(job, entry["paused"], signed_in)
        body = (
            actions
            + _job_body(job, entry, rows, now)
            + _attempts_section(kept, now)
            + _requests_table(asked, now)
        )
        return View(f"Job {job.code}", job_path(job.code, ".json"), data, body)

    # -- data -------------------------------------------------------------------------------

    async def _job_entries(
        self, store: LeaseStore, jobs: Sequence[JobConfig], now: datetime, *, next_fires: int
    ) -> list[dict[str, Any]]:
        codes = [job.code for job in jobs]
        statuses = await reads.job_status(store, codes)
        ticks = await reads.job_ticks(store, codes)
        pauses = await jobstate.paused(store)
        entries = []
        for job, row, job_ticks in zip(jobs, statuses, ticks, strict=True):
            entry = self._job_entry(job, row, job_ticks, now, next_fires)
            entry["paused"] = report.pause_entry(job, jobstate.pause_of(pauses, job.code))
            entries.append(entry)
        return entries

    def _job_entry(
        self,
        job: JobConfig,
        row: Mapping[str, Any],
        ticks: reads.JobTicks,
        now: datetime,
        next_fires: int,
    ) -> dict[str, Any]:
        entry = report.status_entry(job, row, now)
        fires = self._memo.next_fires(job, now, next_fires)
        entry.update(
            {
                "description": job.description,
                "timezone": job.timezone.key,
                "next_fires": [
                    {"at": fire, "local": _local(fire, job)} for fire in fires[:next_fires]
                ],
                "last_success": ticks.last_success,
                "last_failure": ticks.last_failure,
                "stale": _stale(job, ticks.last_success, now),
                "ticks": strip_cells(job, ticks.strip, now, self._memo),
            }
        )
        return entry

    async def _replica_entries(
        self, store: LeaseStore
    ) -> tuple[list[dict[str, Any]], registry.Drift | None]:
        """The registry's live replicas, each with what its rows of the last hour say."""
        live = await registry.live(store)
        activity = {seen.owner: seen for seen in await reads.replicas(store)}
        entries = []
        for replica in live:
            seen = activity.get(replica.name)
            entries.append(
                {
                    **report.replica_entry(replica),
                    "owner": replica.name,
                    "this_replica": replica.name == self.replica,
                    "runs": seen.runs if seen else 0,
                    "running": seen.running if seen else 0,
                    "successes": seen.successes if seen else 0,
                    "failures": seen.failures if seen else 0,
                }
            )
        return entries, registry.drift(live)

    # -- HTML -------------------------------------------------------------------------------

    def _jobs_table(
        self, entries: list[dict[str, Any]], jobs: list[JobConfig], now: datetime
    ) -> str:
        if not entries:
            return '<p class="empty">This replica\'s config has no jobs.</p>'
        rows = "".join(_job_row(entry, now) for entry in entries)
        return (
            '<div class="scroll"><table class="jobs cards-on-phone"><thead><tr>'
            "<th>Job</th><th>Schedule</th><th>Next fire</th><th>Last success</th>"
            "<th>Last failure</th><th>Recent ticks (oldest → newest)</th><th>Fails</th>"
            f"</tr></thead><tbody>{rows}</tbody></table></div>"
        )

    def _page(
        self,
        title: str,
        body: str,
        json_path: str,
        took_ms: float,
        signed_in: SignedIn | None = None,
    ) -> str:
        nav = "".join(
            f'<a href="{href}">{label}</a>'
            for href, label in (
                (PREFIX, "Jobs"),
                (f"{PREFIX}/running", "Running"),
                (f"{PREFIX}/replicas", "Replicas"),
            )
        )
        csp = CSP.format(forms="'none'" if signed_in is None else "'self'")
        who = (
            "Read-only."
            if signed_in is None
            else f"Signed in as <b>{esc(signed_in.operator)}</b>: actions are recorded under "
            "this name."
        )
        return (
            "<!doctype html>\n"
            '<html lang="en"><head><meta charset="utf-8">'
            '<meta name="viewport" content="width=device-width, initial-scale=1">'
            f'<meta http-equiv="Content-Security-Policy" content="{csp}">'
            '<meta name="referrer" content="no-referrer">'
            '<meta name="robots" content="noindex">'
            f"<title>{esc(title)} · pgcrond</title>"
            '<link rel="icon" href="data:,">'
            f'<link rel="stylesheet" href="{STYLESHEET}?v={esc(self.version)}">'
            "</head><body>"
            f'<header class="top"><a class="brand" href="{PREFIX}">pgcrond</a>'
            f'<nav>{nav}</nav><span class="who">answered by <b>{esc(self.replica)}</b>'
            f" · v{esc(self.version)}</span></header>"
            f"<main><h1>{esc(title)}</h1>{body}</main>"
            f'<footer>{who} <a href="{esc(json_path)}">This view as JSON</a> '
            "(or <code>Accept: application/json</code>). "
            f"Answered in {took_ms:.0f} ms at {esc(report.when(datetime.now(UTC)))}; "
            "reload to refresh.</footer>"
            "</body></html>\n"
        )

    def _error(self, status: int, title: str, message: str, as_json: bool) -> Answer:
        if as_json:
            body = json.dumps({"error": message}, ensure_ascii=False) + "\n"
            return status, JSON, body.encode()
        page = self._page(title, f'<p class="error">{esc(message)}</p>', PREFIX + ".json", 0)
        return status, HTML, page.encode()


class _NotFound(Exception):
    pass


def _not_found(path: str) -> str:
    job_prefix = f"{PREFIX}/jobs/"
    if path.startswith(job_prefix):
        code = unquote(path[len(job_prefix) :])
        return f"no job {code.removesuffix('.json')!r} in this replica's config"
    return f"nothing at {path}; the status page is at {PREFIX}"


def _pager(page: int, pages: int, label: str) -> str:
    def link(n: int, text: str) -> str:
        href = PREFIX if n == 1 else f"{PREFIX}/page/{n}"
        return f'<a href="{href}">{esc(text)}</a>'

    previous = link(page - 1, "← previous") if page > 1 else ""
    following = link(page + 1, "next →") if page < pages else ""
    return (
        f'<nav class="pager">{previous}<span>{esc(label)}, page {page} of {pages}</span>'
        f"{following}</nav>"
    )


def records_unavailable() -> PgcrondError:
    return PgcrondError("the daemon is still starting: connecting to and migrating its database")


def to_json(value: Mapping[str, Any]) -> str:
    """The JSON of a view: instants as ``report.iso`` spells them (UTC, ``Z``)."""
    return json.dumps(value, ensure_ascii=False, default=_json_default) + "\n"


def _json_default(value: object) -> object:
    if isinstance(value, datetime):
        return report.iso(value)
    raise TypeError(f"{type(value).__name__} is not JSON serialisable")


def _form(request: Request) -> dict[str, str] | None:
    """The fields of a form POST, or None when the body is not a small urlencoded form."""
    content_type = request.header("content-type").split(";", 1)[0].strip().lower()
    if content_type != "application/x-www-form-urlencoded":
        return None
    try:
        pairs = parse_qsl(
            request.body.decode("utf-8"),
            keep_blank_values=True,
            strict_parsing=bool(request.body),
            max_num_fields=MAX_FIELDS,
        )
    except (UnicodeDecodeError, ValueError):
        return None
    return dict(pairs)


def _prefers_json(accept: str) -> bool:
    """JSON when asked for and HTML is not: a browser's ``text/html,…,*/*`` gets HTML."""
    kinds = [part.split(";", 1)[0].strip().lower() for part in accept.split(",")]
    return "application/json" in kinds and "text/html" not in kinds


@lru_cache(maxsize=1)
def _stylesheet() -> bytes:
    return resources.files(__package__).joinpath("static/status.css").read_bytes()


# -- entries: the JSON, with `pgcrond status --json` / `history --json` field names ---------


def running_entry(row: Mapping[str, Any]) -> dict[str, Any]:
    """A RUNNING row: the ``running`` fields of ``status --json``, and the job's own."""
    return {
        "job": row["code"],
        "type": row["type"],
        "run_key": row["run_key"],
        "owner": row["owner"],
        "attempt": row["attempt"],
        "since": row["acquired_at"],
        "heartbeat_at": row["heartbeat_at"],
        "expires_at": row["expires_at"],
        "stale": row["stale"],
        "fencing_token": row["fencing_token"],
        "idempotency_key": row["lock_key"],
    }


def request_entry(row: Mapping[str, Any]) -> dict[str, Any]:
    """A request: who asked for which run key, when, who took it and how it ended."""
    return {
        "run_key": row["run_key"],
        "requested_by": row["requested_by"],
        "requested_at": row["requested_at"],
        "taken_by": row["taken_by"],
        "taken_at": row["taken_at"],
        "done_at": row["done_at"],
        "outcome": row["outcome"],
    }


def attempt_entry(row: Mapping[str, Any]) -> dict[str, Any]:
    """An attempt record with its output: ``pgcrond logs --json``'s fields."""
    return {"run_key": row["run_key"], **report.attempt_entry(row, output=True)}


def tick_entry(row: Mapping[str, Any]) -> dict[str, Any]:
    """A row as ``pgcrond history --json`` prints it, with its idempotency key."""
    return {**report.history_entry(row), "idempotency_key": row["lock_key"], "stale": row["stale"]}


def strip_cells(
    job: JobConfig, strip: list[reads.StripTick], now: datetime, memo: ScheduleMemo
) -> list[dict[str, Any]]:
    """The strip in tick order, oldest first, with a ``NO_ROW`` cell where ticks left no row.

    A tick that no replica claimed leaves no row: by the schedule, the tick
    after one row's should be the next row's. Ticks after the newest row count
    once their ``misfire_grace`` is over (until then a replica may still claim
    them). A manual run (``manual:…``) sits where it was claimed.
    """
    # Run keys of ticks spell UTC instants in one fixed width, so they sort as
    # strings; a manual run sorts by when it was claimed, in the same spelling.
    placed = sorted(
        ((memo.tick(t.run_key), t) for t in strip),
        key=lambda pair: (
            pair[1].run_key
            if pair[0] is not None and pair[1].run_key is not None
            else report.iso(pair[1].acquired_at) or ""
        ),
    )
    ticks = [at for at, _ in placed if at is not None]
    cells: list[dict[str, Any]] = []
    seen = 0
    for at, row in placed:
        cells.append({"run_key": row.run_key, "status": row.status, "reason": row.reason})
        if at is None or row.run_key is None:
            continue
        seen += 1
        expected = memo.tick_after(job, row.run_key)
        if expected is None:
            continue
        following = ticks[seen] if seen < len(ticks) else None
        if following is not None and expected < following:
            cells.append(_no_row(expected, following))
        elif following is None and expected + job.misfire_grace < now:
            cells.append(_no_row(expected, None))
    return cells[-reads.STRIP_TICKS :]


def _no_row(first: datetime, until: datetime | None) -> dict[str, Any]:
    return {
        "run_key": report.iso(first, precise=False),
        "status": "NO_ROW",
        "reason": "missed",
        "until": report.iso(until, precise=False),
    }


# -- HTML pieces ----------------------------------------------------------------------------


def _stale(job: JobConfig, last_success: Mapping[str, Any] | None, now: datetime) -> bool | None:
    """Whether the job has not succeeded for its ``alert_after``; None without one.

    Judged from the newest SUCCESS the page scans; a job with none in view is
    stale once it has an ``alert_after`` (the daemon's gauge counts from its
    own start instead: the page has no start to count from).
    """
    if job.alert_after is None:
        return None
    if last_success is None or last_success.get("finished_at") is None:
        return True
    finished: datetime = last_success["finished_at"]
    return now - finished > job.alert_after


def _local(fire: datetime, job: JobConfig) -> str:
    return fire.astimezone(job.timezone).strftime("%Y-%m-%d %H:%M:%S %Z")


def _time(value: datetime | None, now: datetime) -> str:
    """``<time>`` with the UTC instant and, beneath, how long ago / until."""
    if value is None:
        return '<span class="none">–</span>'
    return (
        f'<time datetime="{esc(report.iso(value))}">{esc(report.when(value))}</time>'
        f"<small>{esc(report.relative(value - now))}</small>"
    )


def _outcome(status: str, reason: str | None) -> str:
    css = OUTCOME_CLASSES.get(status, "other")
    label = "NO ROW" if status == "NO_ROW" else status
    text = label + (f"/{reason}" if reason and status != "NO_ROW" else "")
    return f'<span class="badge {css}">{esc(text)}</span>'


def _card(label: str, value: str, href: str, css: str = "") -> str:
    return (
        f'<a class="card {css}" href="{esc(href)}"><b>{esc(value)}</b><span>{esc(label)}</span></a>'
    )


def _legend() -> str:
    items = [
        ("ok", "success"),
        ("fail", "failed"),
        ("skip", "skipped"),
        ("miss", "missed / no row"),
        ("run", "running"),
    ]
    return (
        '<p class="legend">'
        + "".join(f'<span><i class="cell {css}"></i>{esc(label)}</span>' for css, label in items)
        + "</p>"
    )


def _strip(cells: list[dict[str, Any]]) -> str:
    if not cells:
        return '<span class="none">no ticks yet</span>'
    out = []
    for cell in cells:
        status, reason = cell["status"], cell["reason"]
        if status == "NO_ROW":
            until = f" until {cell['until']}" if cell["until"] else " until now"
            title = f"{cell['run_key']}{until}: no replica ran these ticks (no row)"
        else:
            title = f"{cell['run_key'] or '(initial)'}: {status}" + (f"/{reason}" if reason else "")
        css = OUTCOME_CLASSES.get(status, "other")
        out.append(f'<i class="cell {css}" title="{esc(title)}"></i>')
    return f'<span class="strip">{"".join(out)}</span>'


def _job_row(entry: dict[str, Any], now: datetime) -> str:
    code = entry["job"]
    description = entry["description"]
    desc_html = f'<small class="desc">{esc(description)}</small>' if description else ""
    if entry["runs_at_start"]:
        next_html = '<span class="none">at the next start</span>'
    elif entry["next_fires"]:
        fire = entry["next_fires"][0]
        next_html = f'{_time(fire["at"], now)}<small class="local">{esc(fire["local"])}</small>'
    else:
        next_html = '<span class="none">never</span>'
    ok = entry["last_success"]
    ok_html = (
        f"{_time(ok['finished_at'], now)}<small>on {esc(ok['owner'])}</small>"
        if ok
        else '<span class="none">none recently</span>'
    )
    bad = entry["last_failure"]
    bad_html = '<span class="none">none recently</span>'
    if bad:
        bad_html = (
            f"{_time(bad['finished_at'] or bad['acquired_at'], now)}"
            f"{_outcome('FAIL', bad['reason'])}"
            f'<small class="err">{esc(report.first_line(bad["error"], ERROR_WIDTH))}</small>'
        )
    fails = entry["consecutive_failures"]
    paused = entry.get("paused")
    paused_html = ""
    if paused is not None:
        why = paused.get("detail") or f"by {paused['by']}" + (
            f": {paused['reason']}" if paused.get("reason") else ""
        )
        paused_html = f'<small class="paused">paused — {esc(why)}</small>'
    if entry.get("stale"):
        paused_html += '<small class="stale">stale: no success within alert_after</small>'
    return (
        "<tr>"
        f'<td data-label="Job"><div><a class="code" href="{esc(job_path(code))}">{esc(code)}</a>'
        f"{desc_html}{paused_html}</div></td>"
        f'<td data-label="Schedule"><div>{esc(entry["schedule"])}'
        f'<small><span class="guard">{esc(entry["guard"])}</span></small></div></td>'
        f'<td data-label="Next fire"><div>{next_html}</div></td>'
        f'<td data-label="Last success"><div>{ok_html}</div></td>'
        f'<td data-label="Last failure"><div>{bad_html}</div></td>'
        f'<td data-label="Recent ticks"><div>{_strip(entry["ticks"])}</div></td>'
        f'<td data-label="Fails" class="num{" bad" if fails else ""}"><div>{esc(fails)}</div></td>'
        "</tr>"
    )


def _running_table(running: list[dict[str, Any]], now: datetime) -> str:
    if not running:
        return '<p class="empty">Nothing is running.</p>'
    rows = "".join(
        "<tr>"
        f'<td data-label="Job"><div><a class="code" href="{esc(job_path(r["job"]))}">'
        f"{esc(r['job'])}</a></div></td>"
        f'<td data-label="Run key"><div><code>{esc(r["run_key"] or "(initial)")}</code></div></td>'
        f'<td data-label="Replica"><div>{esc(r["owner"])}</div></td>'
        f'<td data-label="Attempt" class="num"><div>{esc(r["attempt"])}</div></td>'
        f'<td data-label="Since"><div>{_time(r["since"], now)}</div></td>'
        f'<td data-label="Lease expiry"><div>{_time(r["expires_at"], now)}'
        + ('<span class="badge fail">STALE</span>' if r["stale"] else "")
        + "</div></td>"
        f'<td data-label="Fencing token" class="num"><div><code>{esc(r["fencing_token"])}'
        "</code></div></td>"
        "</tr>"
        for r in running
    )
    return (
        '<div class="scroll"><table class="cards-on-phone"><thead><tr><th>Job</th>'
        "<th>Run key</th><th>Replica</th><th>Attempt</th><th>Since</th><th>Lease expiry</th>"
        f"<th>Fencing token</th></tr></thead><tbody>{rows}</tbody></table></div>"
    )


def _drift_note(drift: registry.Drift | None) -> str:
    if drift is None:
        return ""
    differ = ", ".join(drift.jobs) or "none (settings only)"
    return (
        f'<p class="failing">Config drift since {esc(report.when(drift.since))}: '
        f"{len(drift.configs)} configs among the live replicas; jobs that differ: "
        f"{esc(differ)}</p>"
    )


def _replicas_table(replicas: list[dict[str, Any]], now: datetime) -> str:
    if not replicas:
        return '<p class="empty">No live replica in the registry.</p>'
    rows = "".join(
        "<tr>"
        f'<td data-label="Replica"><div>{esc(r["owner"])}'
        + (' <span class="badge run">this one</span>' if r["this_replica"] else "")
        + "</div></td>"
        f'<td data-label="Version"><div>{esc(r["version"])}</div></td>'
        f'<td data-label="Config" class="code"><div>'
        f"{esc(r['config_hash'][: report.CONFIG_HASH_SHOWN])}</div></td>"
        f'<td data-label="Last seen"><div>{_time(r["last_seen"], now)}</div></td>'
        f'<td data-label="Running" class="num"><div>{esc(r["running"])}</div></td>'
        f'<td data-label="Runs" class="num"><div>{esc(r["runs"])}</div></td>'
        f'<td data-label="Failures" class="num{" bad" if r["failures"] else ""}"><div>'
        f"{esc(r['failures'])}</div></td>"
        "</tr>"
        for r in replicas
    )
    return (
        '<div class="scroll"><table class="cards-on-phone"><thead><tr><th>Replica</th>'
        "<th>Version</th><th>Config</th><th>Last seen</th><th>Running</th><th>Runs (finished)</th>"
        f"<th>Failures</th></tr></thead><tbody>{rows}</tbody></table></div>"
    )


def _job_body(
    job: JobConfig, entry: dict[str, Any], rows: list[dict[str, Any]], now: datetime
) -> str:
    facts = [
        ("Schedule", esc(entry["schedule"])),
        ("Guard", esc(job.guard)),
        ("Time zone", esc(job.timezone.key)),
        ("Timeout", esc(format_duration(job.timeout)) if job.timeout else "none"),
        ("Retries", esc(job.retries)),
        ("Concurrency", esc(job.concurrency)),
        ("Misfire grace", esc(format_duration(job.misfire_grace))),
        ("Consecutive failures", esc(entry["consecutive_failures"])),
    ]
    description = f'<p class="description">{esc(job.description)}</p>' if job.description else ""
    facts_html = "".join(f"<dt>{name}</dt><dd>{value}</dd>" for name, value in facts)
    if entry["runs_at_start"]:
        fires_html = '<p class="empty">Runs at the next start of a replica.</p>'
    elif entry["next_fires"]:
        fires_html = (
            '<table class="fires"><thead><tr><th>UTC</th><th>'
            f"{esc(job.timezone.key)}</th><th>In</th></tr></thead><tbody>"
            + "".join(
                f"<tr><td><div><code>{esc(report.when(f['at']))}</code></div></td>"
                f"<td><div>{esc(f['local'])}</div></td>"
                f"<td><div>{esc(report.relative(f['at'] - now))}</div></td></tr>"
                for f in entry["next_fires"]
            )
            + "</tbody></table>"
        )
    else:
        fires_html = '<p class="empty">No more ticks.</p>'
    return (
        f"{description}"
        f'<div class="split"><dl class="facts">{facts_html}</dl>'
        f"<div><h2>Next fires</h2>{fires_html}</div></div>"
        f"<h2>Recent ticks</h2>{_legend()}{_strip(entry['ticks'])}"
        f"<h2>Duration of recent runs</h2>{duration_chart(rows, now)}"
        f"<h2>History (newest first, {len(rows)} rows)</h2>{_ticks_table(rows, now)}"
    )


def _actions(job: JobConfig, paused: dict[str, Any] | None, signed_in: SignedIn) -> str:
    """The forms of a job's page: pause (with a reason) or resume, and run now."""

    def form(action: str, fields: str, button: str) -> str:
        target = job_path(job.code, "/" + action)
        return (
            f'<form method="post" class="act {action}" action="{esc(target)}">'
            f'<input type="hidden" name="{page_auth.CSRF_FIELD}" value="{esc(signed_in.csrf)}">'
            f'{fields}<button type="submit">{esc(button)}</button></form>'
        )

    if paused is None:
        state = '<p class="state">Not paused: its ticks run.</p>'
        pause_form = form(
            "pause",
            '<label>Reason <input type="text" name="reason" maxlength="'
            f'{MAX_REASON}" placeholder="why, shown with every skip"></label>',
            "Pause",
        )
    elif paused["source"] == "config":
        state = (
            f'<p class="state paused">{esc(paused["detail"])}: remove it and reload the '
            "replicas to let the job run.</p>"
        )
        pause_form = ""
    else:
        why = f": {paused['reason']}" if paused.get("reason") else ""
        held = (
            f"Paused by {paused['by']} at {report.when(paused['at'])}{why}"
            if paused["code"] != jobstate.ALL_JOBS
            else f"Every job is paused by {paused['by']}{why} (pgcrond resume --all lifts it)"
        )
        state = f'<p class="state paused">{esc(held)}</p>'
        pause_form = form("resume", "", "Resume") if paused["code"] != jobstate.ALL_JOBS else ""
    run_form = form("run", "", "Run now")
    return (
        f'<section class="actions"><h2>Act on this job</h2>{state}'
        f'<div class="forms">{pause_form}{run_form}</div>'
        '<p class="note">Run now asks the replicas to run it once (as <code>pgcrond trigger '
        "--detach</code> does), under the run key <code>manual:&lt;UTC minute&gt;</code>.</p>"
        "</section>"
    )


def _requests_table(asked: list[dict[str, Any]], now: datetime) -> str:
    if not asked:
        return ""
    rows = "".join(
        "<tr>"
        f'<td data-label="Run key"><div><code>{esc(r["run_key"])}</code></div></td>'
        f'<td data-label="Requested by"><div>{esc(r["requested_by"])}</div></td>'
        f'<td data-label="Requested"><div>{_time(r["requested_at"], now)}</div></td>'
        f'<td data-label="Taken by"><div>{esc(r["taken_by"] or "–")}</div></td>'
        f'<td data-label="Outcome"><div>{esc(_request_state(r))}</div></td>'
        "</tr>"
        for r in asked
    )
    return (
        '<h2>Manual runs requested</h2><div class="scroll"><table class="requests cards-on-phone">'
        "<thead><tr><th>Run key</th><th>Requested by</th><th>Requested</th><th>Taken by</th>"
        f"<th>Outcome</th></tr></thead><tbody>{rows}</tbody></table></div>"
    )


def _attempts_section(kept: list[dict[str, Any]], now: datetime) -> str:
    """Each recent attempt and what it printed: streams collapsed, the failing one first.

    The text is already safe (control characters and invalid UTF-8 escaped,
    pgcrond.run.output.shown); esc() makes it safe in HTML too.
    """
    if not kept:
        return (
            '<h2>Attempts</h2><p class="empty">No attempt records yet (kept for runs under '
            "the lease guard).</p>"
        )
    out = []
    for a in kept:
        failed = a["status"] not in ("success", "running")
        exit_code = "" if a["exit_code"] is None else f" · exit {a['exit_code']}"
        error = f'<p class="err">{esc(a["error"])}</p>' if a["error"] else ""
        streams = []
        order = ("stderr", "stdout") if failed else ("stdout", "stderr")
        for name in order:
            stream = a["output"][name]
            dropped = stream["dropped_bytes"]
            if not stream["text"]:
                streams.append(f'<p class="stream empty">{name}: empty</p>')
                continue
            note = f" · {dropped} bytes in the middle not kept" if dropped else ""
            streams.append(
                f'<details class="stream {name}"><summary>{name}{esc(note)}</summary>'
                f"<pre>{esc(stream['text'])}</pre></details>"
            )
        out.append(
            f'<article class="attempt"><header><code>{esc(a["run_key"] or "(initial)")}</code> '
            f'attempt {esc(a["attempt"])} <span class="badge {ATTEMPT_CLASSES[a["status"]]}">'
            f"{esc(a['status'])}</span><small>on {esc(a['replica'])} · started "
            f"{esc(report.when(a['started_at']))} ({esc(report.relative(a['started_at'] - now))})"
            f" · took {esc(report.took(a['duration_s']))}{esc(exit_code)}</small></header>"
            f"{error}{''.join(streams)}</article>"
        )
    return (
        f"<h2>Attempts (newest first, {len(kept)})</h2>"
        f'<p class="note">What each attempt printed, as its record keeps it: the first 2 KiB '
        f"and last 16 KiB of each stream, redacted (also <code>pgcrond logs CODE</code>).</p>"
        f'<div class="attempts">{"".join(out)}</div>'
    )


def _request_state(asked: dict[str, Any]) -> str:
    if asked["outcome"]:
        return str(asked["outcome"])
    return "taken, running" if asked["taken_by"] else "pending: no replica took it yet"


def _ticks_table(rows: list[dict[str, Any]], now: datetime) -> str:
    if not rows:
        return '<p class="empty">No ticks recorded yet.</p>'
    out = []
    for r in rows:
        error = r["error"]
        if error and ("\n" in error.strip() or len(error) > ERROR_WIDTH):
            error_html = (
                f"<details><summary>{esc(report.first_line(error, ERROR_WIDTH))}</summary>"
                f"<pre>{esc(error)}</pre></details>"
            )
        elif error:
            error_html = f'<span class="err">{esc(error)}</span>'
        else:
            error_html = '<span class="none">–</span>'
        stale = ' <span class="badge fail">STALE</span>' if r["stale"] else ""
        out.append(
            "<tr>"
            f'<td data-label="Run key"><div><code>{esc(r["run_key"] or "(initial)")}</code>'
            "</div></td>"
            f'<td data-label="Outcome"><div>{_outcome(r["status"], r["reason"])}{stale}</div></td>'
            f'<td data-label="Duration" class="num"><div>{esc(report.took(r["duration_s"]))}'
            "</div></td>"
            f'<td data-label="Replica"><div>{esc(r["owner"])}</div></td>'
            f'<td data-label="Attempt" class="num"><div>{esc(r["attempt"])}</div></td>'
            f'<td data-label="Claimed"><div>{_time(r["acquired_at"], now)}</div></td>'
            f'<td data-label="Error"><div>{error_html}</div></td>'
            f'<td data-label="Idempotency key"><div><code class="key">{esc(r["idempotency_key"])}'
            "</code></div></td>"
            "</tr>"
        )
    return (
        '<div class="scroll"><table class="ticks cards-on-phone"><thead><tr><th>Run key</th>'
        "<th>Outcome</th><th>Duration</th><th>Replica</th><th>Attempt</th><th>Claimed</th>"
        f"<th>Error</th><th>Idempotency key</th></tr></thead><tbody>{''.join(out)}</tbody>"
        "</table></div>"
    )


CHART_W, CHART_H = 720, 200
CHART_LEFT, CHART_BOTTOM, CHART_TOP = 56, 28, 12


def duration_chart(rows: list[dict[str, Any]], now: datetime) -> str:
    """An SVG bar per run (oldest left), its height the run's duration, coloured by outcome.

    A running row's bar is its time so far; a row without a run (SKIPPED) has no bar.
    """
    bars: list[tuple[dict[str, Any], float]] = []
    for row in reversed(rows):
        if row["status"] == "RUNNING":
            bars.append((row, max(0.0, (now - row["acquired_at"]).total_seconds())))
        elif row["duration_s"] is not None and row["status"] not in ("SKIPPED", "MISSED"):
            bars.append((row, float(row["duration_s"])))
    if not bars:
        return '<p class="empty">No finished runs to chart yet.</p>'
    top = _nice_ceiling(max(seconds for _, seconds in bars))
    plot_w = CHART_W - CHART_LEFT - 8
    plot_h = CHART_H - CHART_BOTTOM - CHART_TOP
    # At least 20 slots: a handful of runs draws narrow bars from the left, not slabs.
    step = plot_w / max(len(bars), 20)
    width = max(1.0, step * 0.8)
    parts = [
        f'<svg class="chart" viewBox="0 0 {CHART_W} {CHART_H}" role="img" '
        f'aria-label="Duration of the last {len(bars)} runs, up to {esc(report.took(top))}" '
        'xmlns="http://www.w3.org/2000/svg">'
    ]
    for fraction in (0.0, 0.5, 1.0):
        y = CHART_TOP + plot_h * (1 - fraction)
        parts.append(
            f'<line class="grid" x1="{CHART_LEFT}" x2="{CHART_W - 8}" y1="{y:.1f}" y2="{y:.1f}"/>'
            f'<text class="axis" x="{CHART_LEFT - 6}" y="{y + 4:.1f}" text-anchor="end">'
            f"{esc(report.took(top * fraction))}</text>"
        )
    for index, (row, seconds) in enumerate(bars):
        height = max(1.5, plot_h * seconds / top) if top else 1.5
        x = CHART_LEFT + index * step + (step - width) / 2
        y = CHART_TOP + plot_h - height
        css = OUTCOME_CLASSES.get(row["status"], "other")
        label = (
            f"{row['run_key'] or '(initial)'}: {row['status']}"
            + (f"/{row['reason']}" if row["reason"] else "")
            + f", {report.took(seconds)}, attempt {row['attempt']} on {row['owner']}"
        )
        parts.append(
            f'<rect class="bar {css}" x="{x:.1f}" y="{y:.1f}" width="{width:.1f}" '
            f'height="{height:.1f}"><title>{esc(label)}</title></rect>'
        )
    first, last = bars[0][0], bars[-1][0]
    baseline = CHART_H - 8
    last_x = CHART_LEFT + len(bars) * step
    parts.append(
        f'<text class="axis" x="{CHART_LEFT}" y="{baseline}">'
        f"{esc(first['run_key'] or '(initial)')}</text>"
    )
    if len(bars) > 1:
        parts.append(
            f'<text class="axis" x="{max(last_x, CHART_LEFT + 300):.1f}" y="{baseline}" '
            f'text-anchor="end">{esc(last["run_key"] or "(initial)")}</text>'
        )
    parts.append("</svg>")
    return "".join(parts)


def _nice_ceiling(value: float) -> float:
    """The smallest 1, 2 or 5 times a power of ten at or above ``value`` (0 stays 0)."""
    if value <= 0:
        return 0.0
    scale = 10 ** _floor_log10(value)
    for factor in (1, 2, 5, 10):
        if value <= factor * scale:
            return float(factor * scale)
    return float(10 * scale)


def _floor_log10(value: float) -> int:
    exponent = 0
    while value >= 10:
        value /= 10
        exponent += 1
    while value < 1:
        value *= 10
        exponent -= 1
    return exponent
