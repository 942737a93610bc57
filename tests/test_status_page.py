"""The status page, every view, rendered from a real PostgreSQL holding a known history.

The history is written with SQL (past ticks at known instants) and with the
lease store itself (a live claim, a failure with a hostile error text). The
page is fetched over HTTP from the daemon's real HTTP server.
"""

from __future__ import annotations

import asyncio
import io
import json
import re
import time
import uuid
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from html.parser import HTMLParser
from pathlib import Path
from typing import Any
from urllib.parse import quote, urlencode

import httpx
import psycopg
import pytest
import yaml
from structlog.testing import capture_logs

import pgcrond
from pgcrond.cli import main
from pgcrond.config.loader import load_config
from pgcrond.config.models import Config
from pgcrond.core.passwords import hash_password, parse_hash
from pgcrond.core.schedule import run_key_for
from pgcrond.daemon.http import MAX_BODY, HealthServer
from pgcrond.daemon.http import parse_listen as http_parse_listen
from pgcrond.daemon.metrics import Metrics
from pgcrond.daemon.page import auth
from pgcrond.daemon.page.entries import _stale
from pgcrond.daemon.page.routes import action_route, job_path
from pgcrond.daemon.registry import entry_of
from pgcrond.daemon.status_page import StatusPage
from pgcrond.errors import ConfigError
from pgcrond.storage import jobstate, registry
from pgcrond.storage.leases import LeaseStore
from tests.helpers.daemon_harness import clear_of_a_minute_edge
from tests.helpers.http import fetch
from tests.helpers.status_page import (
    HOSTILE_DESCRIPTION,
    HOSTILE_ERROR,
    ODD_CODE,
    OPERATOR,
    OPERATOR_PASSWORD,
    OTHER_REPLICA,
    THIS_REPLICA,
    History,
    basic,
    operator_hash,
    seed,
    users_section,
    write_config,
)
from tests.helpers.store import open_store

STATUS_ONLY_FIELDS = {"paused", "suspended", "stale", "misses_24h", "last_tick"}


@dataclass
class Site:
    port: int
    config: Config
    config_path: Path
    history: History
    dsn: str
    schema: str
    store: LeaseStore


async def fetch_text(
    port: int, path: str, accept: str = "text/html"
) -> tuple[int, httpx.Headers, str]:
    return await send(port, "GET", path, {"Accept": accept})


async def fetch_json(port: int, path: str) -> Any:
    status, headers, body = await fetch_text(port, path, accept="application/json")
    assert (200, "application/json; charset=utf-8") == (status, headers["Content-Type"])
    return json.loads(body)


@asynccontextmanager
async def site(pg_dsn: str, schema: str, directory: Path, http: str = "") -> AsyncIterator[Site]:
    config_path = write_config(directory, schema, http)
    config = load_config([str(config_path)], database_url=pg_dsn)
    async with (
        open_store(pg_dsn, schema, owner=THIS_REPLICA) as store,
        open_store(pg_dsn, schema, owner=OTHER_REPLICA, migrate=False) as other,
    ):
        history = await seed(pg_dsn, schema, store, other)
        for name in (THIS_REPLICA, OTHER_REPLICA):
            await registry.join(store, entry_of(name, uuid.uuid4(), config))
        page = StatusPage(config=lambda: config, store=lambda: store, replica=THIS_REPLICA)
        server = HealthServer(
            "127.0.0.1:0",
            health=lambda: True,
            ready=lambda: asyncio.sleep(0, True),
            registry=Metrics().registry,
            status_page=page,
        )
        await server.start()
        try:
            yield Site(server.port, config, config_path, history, pg_dsn, schema, store)
        finally:
            await server.stop()


@pytest.fixture
async def served(pg_dsn: str, schema: str, tmp_path: Path) -> AsyncIterator[Site]:
    async with site(pg_dsn, schema, tmp_path) as s:
        yield s


def served_store(served: Site) -> Callable[[], LeaseStore | None]:
    return lambda: served.store


class Page(HTMLParser):
    """Parses a page: its text, tags, attribute values and the elements a test looks for."""

    def __init__(self, html: str) -> None:
        super().__init__(convert_charrefs=True)
        self.tags: list[str] = []
        self.attrs: list[tuple[str, str, str]] = []
        self.text: list[str] = []
        self.cells: list[str] = []
        self.bars: list[dict[str, str]] = []
        self._in_title = False
        self.feed(html)

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.tags.append(tag)
        values = {name: value or "" for name, value in attrs}
        for name, value in values.items():
            self.attrs.append((tag, name, value))
        css = values.get("class", "").split()
        if tag == "i" and "cell" in css and "title" in values:
            self.cells.append(css[1] + " " + values["title"])
        if tag == "rect" and "bar" in css:
            self.bars.append(values)

    def handle_data(self, data: str) -> None:
        self.text.append(data)

    @property
    def all_text(self) -> str:
        return " ".join(" ".join(self.text).split())


def assert_self_contained(html: str) -> None:
    """No script, no form that posts (a filter is a GET), nothing from elsewhere; a CSP says so."""
    page = Page(html)
    assert "script" not in page.tags
    assert [] == [
        value
        for tag, name, value in page.attrs
        if (tag, name) == ("form", "method") and value != "get"
    ]
    assert "iframe" not in page.tags
    for tag, name, value in page.attrs:
        if name in ("href", "src", "action"):
            assert value.startswith(("/", "#", "data:")), (tag, name, value)
        assert not name.startswith("on"), (tag, name)
        assert name != "style", tag
    assert '<meta http-equiv="Content-Security-Policy" content="default-src \'none\'' in html


async def test_the_overview_shows_every_job_running_now_and_replicas_with_job_text_escaped(
    served: Site,
) -> None:
    status, headers, html = await fetch_text(served.port, "/status")
    assert (200, "text/html; charset=utf-8") == (status, headers["Content-Type"])
    assert_self_contained(html)
    page = Page(html)
    text = page.all_text
    for code in served.config.jobs:
        assert code in text
    # The hostile description is shown as text: escaped in the HTML, intact as text.
    assert HOSTILE_DESCRIPTION in text
    assert "&lt;script&gt;alert(&#34;description&#34;)&lt;/script&gt; &amp; it&#39;s" in html
    assert "<script>" not in html
    # The odd code's link is URL-quoted, its text escaped.
    assert f'href="/status/jobs/{quote(ODD_CODE, safe="")}"' in html
    assert "odd/&lt;b&gt;&#34;code&#34;" in html
    # Schedules in words and the next fire in the job's zone and in UTC.
    nightly = served.config.jobs["nightly-report"]
    assert "cron '30 2 * * *': at 02:30 every day (Europe/Berlin)" in text
    fire = nightly.schedule.next_after(datetime.now(UTC))
    assert fire is not None
    assert fire.astimezone(nightly.timezone).strftime("%Y-%m-%d %H:%M:%S %Z") in text
    assert fire.strftime("%Y-%m-%dT%H:%M:%SZ") in text
    assert "at the next start" not in text  # the run-once job is done
    # Running now: job, run key, replica, attempt, lease expiry, fencing token.
    running = served.history.running
    assert run_key_for(served.history.minute) in text
    assert OTHER_REPLICA in text
    assert str(running.fencing_token) in text
    # Last failure of nightly-report: its first line, escaped.
    assert "Traceback (most recent call last):" in text
    # The summary cards: 5 jobs, 1 running, 1 whose last run failed, 2 replicas.
    cards = re.findall(r'<a class="card[^"]*" href="[^"]*"><b>(\d+)</b><span>([^<]+)</span>', html)
    assert [
        ("5", "jobs"),
        ("1", "running now"),
        ("1", "last run failed"),
        ("2", "live replicas"),
    ] == cards


async def test_the_tick_strip_is_in_tick_order_and_shows_the_gap_the_failure_and_the_skip(
    served: Site,
) -> None:
    data = await fetch_json(served.port, "/status.json")
    [sync] = [job for job in data["jobs"] if job["job"] == "sync-invoices"]
    h = served.history
    expected: list[tuple[str, str | None, str | None]] = []
    for k in range(12, -1, -1):
        tick = h.minute - timedelta(minutes=k)
        key = run_key_for(tick)
        if tick == h.gap:
            expected.append(("NO_ROW", "missed", key))
        elif tick == h.failed:
            expected.append(("FAIL", "error", key))
        elif tick == h.skipped:
            expected.append(("SKIPPED", "overlap", key))
        elif k == 0:
            expected.append(("RUNNING", None, key))
        else:
            expected.append(("SUCCESS", None, key))
    assert expected == [(t["status"], t["reason"], t["run_key"]) for t in sync["ticks"]]
    # The HTML strip says the same, one cell per entry, coloured by outcome.
    _, _, html = await fetch_text(served.port, "/status")
    cells = Page(html).cells  # the legend's cells have no title, so are not counted
    # (An hourly job's trailing gap appears at hh:05 exactly: count before and after.)
    after = await fetch_json(served.port, "/status.json")
    counts = {sum(len(job["ticks"]) for job in d["jobs"]) for d in (data, after)}
    assert len(cells) in counts
    gap_key = run_key_for(h.gap)
    assert (
        f"miss {gap_key} until {run_key_for(h.gap + timedelta(minutes=1))}: "
        "no replica ran these ticks (no row)"
    ) in cells
    assert f"fail {run_key_for(h.failed)}: FAIL/error" in cells
    assert f"skip {run_key_for(h.skipped)}: SKIPPED/overlap" in cells
    assert f"run {run_key_for(h.minute)}: RUNNING" in cells


async def test_the_jobs_json_has_the_field_names_and_values_of_pgcrond_status_json(
    served: Site, capsys: pytest.CaptureFixture[str]
) -> None:
    data = await fetch_json(served.port, "/status.json")
    # The CLI runs its own event loop: in a thread, next to the page's server.
    argv = ["status", "-c", str(served.config_path), "--json", "--database-url", served.dsn]
    assert 0 == await asyncio.to_thread(main, argv)
    cli = json.loads(capsys.readouterr().out)["jobs"]
    assert [e["job"] for e in cli] == [e["job"] for e in data["jobs"]]
    for from_cli, from_page in zip(cli, data["jobs"], strict=True):
        # `status --json` may carry pause, misses and staleness fields the page's
        # entries leave out; every field they share holds the same value.
        assert set(from_cli) - set(from_page) <= STATUS_ONLY_FIELDS
        # next_fire moves on with the clock; everything else is the same row.
        shared = {
            k: v for k, v in from_cli.items() if k != "next_fire" and k not in STATUS_ONLY_FIELDS
        }
        for key, value in shared.items():
            if isinstance(value, dict) and from_page[key] is None:
                assert not any(value.values()), key  # "none": all-null there, null here
            elif isinstance(value, dict) and isinstance(from_page[key], dict):
                # The page may say more about a run than the table's one line.
                assert value == {k: from_page[key].get(k) for k in value}, key
            else:
                assert value == from_page[key], key
    [nightly] = [e for e in data["jobs"] if e["job"] == "nightly-report"]
    assert HOSTILE_DESCRIPTION == nightly["description"]
    assert HOSTILE_ERROR == nightly["last_run"]["error"]
    assert HOSTILE_ERROR == nightly["last_failure"]["error"]
    assert "Europe/Berlin" == nightly["timezone"]
    assert 1 == len(nightly["next_fires"])
    assert {"SCHEDULE"} == {r["type"] for r in data["running"]}
    # The same view at /status with Accept: application/json and at /status.json.
    again = await fetch_json(served.port, "/status")
    assert [e["job"] for e in again["jobs"]] == [e["job"] for e in data["jobs"]]
    assert pgcrond.__version__ == data["version"]


async def test_a_jobs_page_lists_recent_ticks_with_keys_and_errors_and_charts_durations(
    served: Site,
) -> None:
    status, _, html = await fetch_text(served.port, job_path("nightly-report"))
    assert 200 == status
    assert_self_contained(html)
    page = Page(html)
    text = page.all_text
    # The hostile error text and description, shown as text and never as markup.
    assert "<script>" not in html
    assert HOSTILE_DESCRIPTION in text
    assert "alert('error')" in text
    assert "&lt;script&gt;alert(&#39;error&#39;)&lt;/script&gt; &#34;double&#34;" in html
    # Every tick: outcome, duration, replica, attempt and its idempotency key.
    failed = served.history.nightly_failed
    assert failed.identity.idempotency_key in text
    assert "FAIL/error" in text
    assert "4m10s" in text  # the successful nights' duration
    assert THIS_REPLICA in text
    # Next fires: five, in Berlin time and UTC.
    job = served.config.jobs["nightly-report"]
    fire = job.schedule.next_after(datetime.now(UTC))
    assert fire is not None
    for _ in range(5):
        assert fire.astimezone(job.timezone).strftime("%Y-%m-%d %H:%M:%S %Z") in text
        assert fire.strftime("%Y-%m-%dT%H:%M:%SZ") in text
        fire = job.schedule.next_after(fire)
        assert fire is not None
    # The chart: one bar per finished run, oldest first, coloured by outcome.
    assert ["ok", "ok", "ok", "fail"] == [bar["class"].split()[1] for bar in page.bars]
    heights = [float(bar["height"]) for bar in page.bars]
    assert heights[0] == heights[1] == heights[2] > heights[3]
    assert "svg" in page.tags

    data = await fetch_json(served.port, job_path("nightly-report", ".json"))
    assert ["FAIL", "SUCCESS", "SUCCESS", "SUCCESS"] == [t["status"] for t in data["ticks"]]
    newest = data["ticks"][0]
    assert HOSTILE_ERROR == newest["error"]
    assert failed.identity.idempotency_key == newest["idempotency_key"]
    assert 250.0 == data["ticks"][1]["duration_s"]
    assert 5 == len(data["job"]["next_fires"])
    history_fields = {
        "id",
        "job",
        "type",
        "run_key",
        "status",
        "reason",
        "attempt",
        "owner",
        "fencing_token",
        "acquired_at",
        "finished_at",
        "expires_at",
        "retry_at",
        "duration_s",
        "error",
    }
    assert history_fields <= set(newest)


async def test_a_job_with_an_odd_code_has_a_page_and_an_unknown_job_is_404(served: Site) -> None:
    status, _, html = await fetch_text(served.port, job_path(ODD_CODE))
    assert 200 == status
    assert f"Job {ODD_CODE}" in Page(html).all_text
    assert 3 == len(Page(html).bars)
    status, _, html = await fetch_text(served.port, job_path("no-such-job"))
    assert 404 == status
    assert "no job &#39;no-such-job&#39; in this replica&#39;s config" in html
    status, _, body = await fetch_text(served.port, job_path("no-such-job", ".json"))
    assert (404, {"error": "no job 'no-such-job' in this replica's config"}) == (
        status,
        json.loads(body),
    )


async def test_the_running_view_shows_run_key_replica_attempt_since_expiry_and_fencing_token(
    served: Site,
) -> None:
    status, _, html = await fetch_text(served.port, "/status/running")
    assert 200 == status
    assert_self_contained(html)
    running = served.history.running
    text = Page(html).all_text
    for value in (
        "sync-invoices",
        running.identity.run_key or "",
        OTHER_REPLICA,
        str(running.fencing_token),
    ):
        assert value in text
    [entry] = (await fetch_json(served.port, "/status/running.json"))["running"]
    assert {
        "job": "sync-invoices",
        "type": "SCHEDULE",
        "run_key": running.identity.run_key,
        "owner": OTHER_REPLICA,
        "attempt": 1,
        "stale": False,
        "fencing_token": running.fencing_token,
        "idempotency_key": running.identity.idempotency_key,
    } == {
        k: entry[k]
        for k in (
            "job",
            "type",
            "run_key",
            "owner",
            "attempt",
            "stale",
            "fencing_token",
            "idempotency_key",
        )
    }
    since = datetime.fromisoformat(entry["since"])
    expires = datetime.fromisoformat(entry["expires_at"])
    assert timedelta(minutes=10) == expires - since


async def test_the_replicas_view_lists_the_registrys_live_replicas_with_their_recent_rows(
    served: Site,
) -> None:
    status, _, html = await fetch_text(served.port, "/status/replicas")
    assert 200 == status
    assert_self_contained(html)
    text = Page(html).all_text
    assert THIS_REPLICA in text and OTHER_REPLICA in text
    data = await fetch_json(served.port, "/status/replicas.json")
    seen = {r["owner"]: r for r in data["replicas"]}
    assert {THIS_REPLICA, OTHER_REPLICA} == set(seen)
    assert pgcrond.__version__ == seen[THIS_REPLICA]["version"] == seen[OTHER_REPLICA]["version"]
    assert seen[THIS_REPLICA]["this_replica"] and not seen[OTHER_REPLICA]["this_replica"]
    assert seen[THIS_REPLICA]["config_hash"] == seen[OTHER_REPLICA]["config_hash"]
    assert None is data["drift"]
    assert 1 == seen[OTHER_REPLICA]["running"]
    # This replica: sync-invoices' odd minutes (one of them the failure) and the failed night.
    odd = [k for k in range(1, 13) if k % 2 and k != 5]
    assert len(odd) + 1 == seen[THIS_REPLICA]["runs"]
    assert 2 == seen[THIS_REPLICA]["failures"]


async def test_the_replicas_view_shows_drift_and_the_jobs_that_differ(served: Site) -> None:
    changed = served.config_path.parent / "changed.yaml"
    document = yaml.safe_load(served.config_path.read_text())
    document["jobs"]["nightly-report"]["cron"] = "45 2 * * *"
    changed.write_text(yaml.safe_dump(document))
    config = load_config([str(changed)], database_url=served.dsn)
    await registry.join(served.store, entry_of("replica-c:303", uuid.uuid4(), config))
    data = await fetch_json(served.port, "/status/replicas.json")
    _, _, html = await fetch_text(served.port, "/status/replicas")
    drift = data["drift"]
    assert {"nightly-report"} == set(drift["jobs"])
    assert [["replica-c:303"]] == [
        names for names in drift["configs"].values() if "replica-c:303" in names
    ]
    assert "Config drift since" in html and "nightly-report" in Page(html).all_text


async def test_the_page_changes_nothing_and_refuses_other_methods(served: Site) -> None:
    def count() -> tuple[int, str]:
        with psycopg.connect(served.dsn) as conn:
            row = conn.execute(
                f"""SELECT count(*), md5(string_agg(t::text, ',' ORDER BY id))
                    FROM "{served.schema}".leases t"""
            ).fetchone()
            assert row is not None
            return row[0], row[1]

    before = count()
    for path in ("/status", "/status/running", "/status/replicas", job_path("sync-invoices")):
        status, _, _ = await fetch_text(served.port, path)
        assert 200 == status
    assert before == count()
    for method in ("POST", "PUT", "DELETE"):
        status, headers, body = await send(served.port, method, "/status")
        if method == "POST":
            # Without authentication configured the page is read-only: a form POST is refused.
            assert 403 == status
            assert "read-only" in body
        else:
            assert 405 == status
            assert "GET, HEAD" == headers["Allow"]
    assert before == count()


async def test_the_stylesheet_is_served_from_the_package_and_the_root_is_the_overview(
    served: Site,
) -> None:
    status, headers, css = await fetch_text(served.port, "/status/status.css")
    assert (200, "text/css; charset=utf-8") == (status, headers["Content-Type"])
    assert "@media (max-width: 760px)" in css
    assert "url(" not in css  # no fonts or images from anywhere
    status, _, html = await fetch_text(served.port, "/")
    assert 200 == status
    assert "sync-invoices" in html


async def test_before_the_store_is_ready_the_page_answers_503_and_says_why(tmp_path: Path) -> None:
    config = load_config([str(write_config(tmp_path, "unused"))], database_url="postgresql://x")
    page = StatusPage(config=lambda: config, store=lambda: None, replica=THIS_REPLICA)
    status, content_type, body = await page.answer("/status", "text/html")
    assert (503, "text/html; charset=utf-8") == (status, content_type)
    assert "still starting" in body.decode()
    status, content_type, body = await page.answer("/status.json", "*/*")
    assert 503 == status
    assert "still starting" in json.loads(body)["error"]


async def test_the_jobs_view_pages_through_jobs_and_names_failing_jobs_on_every_page(
    served: Site,
) -> None:
    page = StatusPage(
        config=lambda: served.config,
        store=served_store(served),
        replica=THIS_REPLICA,
        page_size=2,
    )
    codes = list(served.config.jobs)
    seen: list[str] = []
    for number, path in enumerate(["/status.json", "/status/page/2.json", "/status/page/3.json"]):
        status, _, body = await page.answer(path, "*/*")
        assert 200 == status
        data = json.loads(body)
        assert (number + 1, 3) == (data["page"], data["pages"])
        assert ["nightly-report"] == data["failing"]
        seen += [job["job"] for job in data["jobs"]]
    assert codes == seen
    status, _, html = await page.answer("/status/page/2", "text/html")
    text = Page(html.decode()).all_text
    assert "jobs 3–4 of 5, page 2 of 3" in text
    assert "Last run failed: nightly-report" in text
    assert 404 == (await page.answer("/status/page/4", "text/html"))[0]


async def test_a_paused_job_says_by_whom_and_why_and_its_json_matches_status(served: Site) -> None:
    await jobstate.pause(
        served.store, ["nightly-report"], by="ops@host", reason='<b>"maintenance"</b>'
    )
    _, _, html = await fetch_text(served.port, "/status")
    text = Page(html).all_text
    assert 'paused — by ops@host: <b>"maintenance"</b>' in text
    assert "&lt;b&gt;&#34;maintenance&#34;&lt;/b&gt;" in html
    _, _, body = await fetch_text(served.port, "/status.json")
    entries = {entry["job"]: entry for entry in json.loads(body)["jobs"]}
    paused = entries["nightly-report"]["paused"]
    assert ("database", "ops@host") == (paused["source"], paused["by"])
    assert all(entries[code]["paused"] is None for code in entries if code != "nightly-report")


def test_a_job_is_shown_stale_once_it_has_not_succeeded_for_its_alert_after(
    tmp_path: Path,
) -> None:
    path = tmp_path / "jobs.yaml"
    path.write_text(
        "database: {url: 'postgresql://x@127.0.0.1/x'}\n"
        "jobs:\n"
        "  watched: {cron: '* * * * *', command: ['true'], alert_after: 1h}\n"
        "  unwatched: {cron: '* * * * *', command: ['true']}\n"
    )
    jobs = load_config([path]).jobs
    now = datetime.now(UTC)
    recent = {"finished_at": now - timedelta(minutes=10)}
    old = {"finished_at": now - timedelta(hours=2)}
    assert [False, True, True] == [_stale(jobs["watched"], s, now) for s in (recent, old, None)]
    assert _stale(jobs["unwatched"], old, now) is None


# -- access: sign-in, actions, CSRF ------------------------------------------------------------


async def send(
    port: int,
    method: str,
    path: str,
    headers: dict[str, str] | None = None,
    body: bytes = b"",
) -> tuple[int, httpx.Headers, str]:
    """One request; the answer's status, headers and body.

    Its ``Host`` is ``t``, the host the forms' ``Origin`` headers name.
    """
    sent = {"Host": "t", **(headers or {})}
    status, found, answer = await fetch(port, path, method=method, headers=sent, body=body)
    return status, found, answer.decode()


def token_of(html: str) -> str:
    """The CSRF token the page's forms carry."""
    token = re.search(r'name="csrf" value="([^"]+)"', html)
    assert token is not None, "no form on the page"
    return token.group(1)


FORM = "application/x-www-form-urlencoded"


def cluster_state(served: Site) -> tuple[list[tuple[Any, ...]], list[tuple[Any, ...]]]:
    """Pauses and requests as stored: what an action would change."""
    with psycopg.connect(served.dsn) as conn:
        pauses = conn.execute(
            f'SELECT code, paused_by, reason FROM "{served.schema}".leases_job_state ORDER BY code'
        ).fetchall()
        asked = conn.execute(
            f'SELECT code, run_key, requested_by FROM "{served.schema}".leases_requests ORDER BY id'
        ).fetchall()
    return pauses, asked


@pytest.fixture
async def signed(pg_dsn: str, schema: str, tmp_path: Path) -> AsyncIterator[Site]:
    """The seeded page with one Basic user, alice."""
    async with site(pg_dsn, schema, tmp_path, users_section()) as s:
        yield s


async def test_with_users_every_page_asks_who_you_are_and_probes_stay_open(signed: Site) -> None:
    for path in ("/status", "/status.json", job_path("sync-invoices"), "/status/status.css"):
        status, headers, body = await send(signed.port, "GET", path)
        assert 401 == status, path
        assert 'Basic realm="pgcrond status", charset="UTF-8"' == headers["www-authenticate"]
        assert "sync-invoices" not in body
    with capture_logs() as logs:
        wrong, _, _ = await send(signed.port, "GET", "/status", basic(password="wrong password"))
        unknown, _, _ = await send(signed.port, "GET", "/status", basic(user="mallory"))
    assert (401, 401) == (wrong, unknown)
    denied = [e for e in logs if e["event"] == "status_page_denied"]
    assert [OPERATOR, "mallory"] == [e["user"] for e in denied]
    # Neither the password nor the header that carries it is logged.
    assert "wrong password" not in repr(logs)
    assert basic(password="wrong password")["Authorization"].split()[1] not in repr(logs)
    assert operator_hash() not in repr(signed.config)
    for path in ("/healthz", "/metrics"):
        assert 200 == (await send(signed.port, "GET", path))[0]
    status, headers, html = await send(signed.port, "GET", job_path("sync-invoices"), basic())
    assert 200 == status
    assert "no-store" == headers["cache-control"]
    assert "DENY" == headers["x-frame-options"]
    # The token is the server's, in the form: no cookie to plant.
    assert "set-cookie" not in headers
    assert f"Signed in as <b>{OPERATOR}</b> (operator)" in html
    assert "form-action 'self'" in html
    page = Page(html)
    assert {"pause", "run"} <= {
        v.split()[-1] for t, a, v in page.attrs if t == "form" and a == "class"
    }


async def test_an_operator_pauses_resumes_and_runs_a_job_under_their_name(signed: Site) -> None:
    path = job_path(ODD_CODE)
    _, _, html = await send(signed.port, "GET", path, basic())
    token = token_of(html)
    sent = {**basic(), "Content-Type": FORM, "Origin": "http://t", "Sec-Fetch-Site": "same-origin"}

    async def post(action: str, fields: dict[str, str]) -> tuple[int, httpx.Headers]:
        body = urlencode({"csrf": token, **fields}).encode()
        status, answer, _ = await send(signed.port, "POST", f"{path}/{action}", sent, body)
        return status, answer

    status, answer = await post("pause", {"reason": "ledger <migration> & more"})
    assert (303, path) == (status, answer["location"])
    [pause] = (await jobstate.paused(signed.store)).values()
    assert (ODD_CODE, OPERATOR, "ledger <migration> & more") == (
        pause.code,
        pause.paused_by,
        pause.reason,
    )
    _, _, html = await send(signed.port, "GET", path, basic())
    assert f"Paused by {OPERATOR} at" in html and "ledger &lt;migration&gt; &amp; more" in html
    assert 'class="act resume"' in html
    status, answer = await post("resume", {})
    assert (303, path) == (status, answer["location"])
    assert {} == await jobstate.paused(signed.store)
    # The run key is the UTC minute: two clicks straddling its edge are two runs.
    await asyncio.to_thread(clear_of_a_minute_edge)
    assert 303 == (await post("run", {}))[0]
    assert 303 == (await post("run", {}))[0]  # a double click asks once
    _, asked = cluster_state(signed)
    [(code, run_key, by)] = asked
    assert (ODD_CODE, OPERATOR) == (code, by)
    assert re.fullmatch(r"manual:\d{4}-\d\d-\d\dT\d\d:\d\dZ", str(run_key))
    data = json.loads((await send(signed.port, "GET", path + ".json", basic()))[2])
    assert [OPERATOR] == [r["requested_by"] for r in data["requests"]]


async def test_a_post_without_a_server_issued_token_credential_or_own_origin_changes_nothing(
    signed: Site,
) -> None:
    """401 without a credential; 403 for a token the server did not issue to this user
    (made up, another user's, expired) and for another site's or origin's form."""
    path = job_path("sync-invoices")
    _, _, html = await send(signed.port, "GET", path, basic())
    token = token_of(html)
    access = signed.config.page_access
    before = cluster_state(signed)
    form = {"Content-Type": FORM}
    signed_in = {**form, **basic()}
    refusals = {
        "no credential": (401, form, {"csrf": token}),
        "a wrong password": (401, {**form, **basic(password="guess")}, {"csrf": token}),
        "no token": (403, signed_in, {}),
        "a made-up token": (403, signed_in, {"csrf": "x" * 43}),
        "a well-formed token the server did not sign": (
            403, signed_in, {"csrf": f"{int(time.time())}.{'A' * 43}"},
        ),
        "another user's token": (403, signed_in, {"csrf": auth.issue_token(access, "mallory")}),
        "an expired token": (
            403,
            signed_in,
            {"csrf": auth.issue_token(access, OPERATOR, time.time() - auth.TOKEN_TTL_S - 5)},
        ),
        "another site's form": (
            403, {**signed_in, "Sec-Fetch-Site": "cross-site"}, {"csrf": token},
        ),
        "a sibling subdomain's form": (
            403, {**signed_in, "Sec-Fetch-Site": "same-site"}, {"csrf": token},
        ),
        "another origin": (403, {**signed_in, "Origin": "http://evil.example"}, {"csrf": token}),
        "another port of this host": (
            403, {**signed_in, "Origin": "http://t:8080"}, {"csrf": token},
        ),
    }  # fmt: skip
    for why, (expected, sent, fields) in refusals.items():
        for action in ("pause", "run"):
            body = urlencode({**fields, "reason": "x"}).encode()
            status, answer, _ = await send(signed.port, "POST", f"{path}/{action}", sent, body)
            assert expected == status, (why, action)
            assert "location" not in answer
    # A form that is not one, and an action that does not exist.
    not_form = {**basic(), "Content-Type": "application/json"}
    status, _, _ = await send(signed.port, "POST", f"{path}/pause", not_form, b'{"csrf": "x"}')
    assert 400 == status
    status, _, _ = await send(
        signed.port, "POST", f"{path}/drop", signed_in, urlencode({"csrf": token}).encode()
    )
    assert 404 == status
    status, _, _ = await send(
        signed.port, "POST", f"{path}/pause", signed_in,
        urlencode({"csrf": token, "reason": "two\nlines \x1b[31m"}).encode(),
    )  # fmt: skip
    assert 400 == status
    assert before == cluster_state(signed)


async def test_a_viewer_sees_no_forms_and_an_operator_acts_only_on_its_jobs(
    pg_dsn: str, schema: str, tmp_path: Path
) -> None:
    users = (
        "http:\n  users:\n"
        f"    vera: {{password: '{operator_hash()}', role: viewer}}\n"
        f"    olga: {{password: '{operator_hash()}', role: operator, jobs: ['sync-*']}}\n"
    )
    async with site(pg_dsn, schema, tmp_path, users) as s:
        before = cluster_state(s)
        form = {"Content-Type": FORM}
        for user, path, forms in (
            ("vera", job_path("sync-invoices"), False),
            ("olga", job_path("nightly-report"), False),
            ("olga", job_path("sync-invoices"), True),
        ):
            status, _, html = await send(s.port, "GET", path, basic(user))
            assert 200 == status
            assert forms == ('method="post"' in html), (user, path)
        # The viewer's own token, and the operator's token for a job outside its globs.
        access = s.config.page_access
        for user, path in (("vera", "sync-invoices"), ("olga", "nightly-report")):
            body = urlencode({"csrf": auth.issue_token(access, user)}).encode()
            headers = {**form, **basic(user)}
            status, _, _text = await send(s.port, "POST", job_path(path, "/pause"), headers, body)
            assert 403 == status, (user, path)
        assert before == cluster_state(s)
        body = urlencode({"csrf": auth.issue_token(access, "olga"), "reason": "r"}).encode()
        headers = {**form, **basic("olga")}
        status, _, _ = await send(
            s.port, "POST", job_path("sync-invoices", "/pause"), headers, body
        )
        assert 303 == status
        [pause] = (await jobstate.paused(s.store)).values()
        assert ("sync-invoices", "olga") == (pause.code, pause.paused_by)


async def test_a_body_over_the_limit_is_refused_unread(signed: Site) -> None:
    status, _, _ = await send(
        signed.port, "POST", job_path("sync-invoices") + "/pause",
        {**basic(), "Content-Type": FORM}, b"a" * (MAX_BODY + 1),
    )  # fmt: skip
    assert 413 == status


async def test_a_proxy_header_from_an_untrusted_address_is_ignored(
    pg_dsn: str, schema: str, tmp_path: Path
) -> None:
    untrusted = "http:\n  trusted_proxies: [10.0.0.0/8]\n"
    async with site(pg_dsn, schema, tmp_path, untrusted) as s:
        status, headers, body = await send(s.port, "GET", "/status", {"X-Forwarded-User": "carol"})
        assert 403 == status
        assert "www-authenticate" not in headers
        assert "sync-invoices" not in body


async def test_a_trusted_proxy_names_the_operator_in_its_configured_header(
    pg_dsn: str, schema: str, tmp_path: Path
) -> None:
    trusted = "http:\n  trusted_proxies: 127.0.0.1\n  proxy_header: X-Auth-User\n"
    async with site(pg_dsn, schema, tmp_path, trusted) as s:
        status, _, html = await send(s.port, "GET", "/status", {"X-Auth-User": "carol"})
        assert 200 == status
        # Not listed in users: the proxy_role, a viewer, who gets no forms.
        assert "Signed in as <b>carol</b> (viewer)" in html
        # The default header is not the configured one; an unusable user name is refused.
        assert 403 == (await send(s.port, "GET", "/status", {"X-Forwarded-User": "carol"}))[0]
        assert 403 == (await send(s.port, "GET", "/status", {"X-Auth-User": "a b"}))[0]


async def test_the_page_turned_off_answers_404_and_probes_stay(
    pg_dsn: str, schema: str, tmp_path: Path
) -> None:
    async with site(pg_dsn, schema, tmp_path, "http:\n  status_page: false\n") as s:
        for path in ("/status", "/", job_path("sync-invoices"), "/status/status.css"):
            assert 404 == (await send(s.port, "GET", path))[0], path
        assert 404 == (await send(s.port, "POST", job_path("sync-invoices") + "/pause"))[0]
        for path in ("/healthz", "/metrics"):
            assert 200 == (await send(s.port, "GET", path))[0], path


# -- access settings and hashes (no database) --------------------------------------------------


def test_a_password_hash_matches_its_password_and_no_other() -> None:
    stored = parse_hash(operator_hash())
    assert stored.matches(OPERATOR_PASSWORD)
    assert not stored.matches(OPERATOR_PASSWORD + " ")
    assert operator_hash() != hash_password(OPERATOR_PASSWORD)  # salted


def test_hash_password_prints_a_hash_of_the_password_read_from_stdin(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr("sys.stdin", io.StringIO("s3cret pass phrase\nignored\n"))
    assert 0 == main(["hash-password", "--stdin"])
    printed = capsys.readouterr().out.strip()
    assert parse_hash(printed).matches("s3cret pass phrase")
    monkeypatch.setattr("sys.stdin", io.StringIO("short\n"))
    assert 2 == main(["hash-password", "--stdin"])
    out, err = capsys.readouterr()
    assert ("", "error: a password needs at least 8 characters; nothing printed\n") == (out, err)


def test_access_settings_are_read_and_the_page_is_read_only_without_them(tmp_path: Path) -> None:
    plain = load_config([str(write_config(tmp_path, "s"))], database_url="postgresql://x")
    assert (True, False) == (plain.page_access.enabled, plain.page_access.authenticated)
    http = (
        f"http:\n  status_page: true\n  users: {{{OPERATOR}: '{operator_hash()}'}}\n"
        "  trusted_proxies: [10.1.2.3, 'fd00::/8']\n  proxy_header: X-Auth-Request-User\n"
    )
    config = load_config([str(write_config(tmp_path, "s", http))], database_url="postgresql://x")
    access = config.page_access
    assert access.authenticated
    assert [OPERATOR] == list(access.users)
    assert ["10.1.2.3/32", "fd00::/8"] == [str(n) for n in access.trusted_proxies]
    assert "X-Auth-Request-User" == access.proxy_header


def test_a_plaintext_password_or_a_bad_proxy_address_is_refused_with_its_place(
    tmp_path: Path,
) -> None:
    http = "http:\n  users:\n    bob: hunter2-plain\n  trusted_proxies: [10.0.0.300]\n"
    path = write_config(tmp_path, "s", http)
    with pytest.raises(ConfigError) as raised:
        load_config([str(path)], database_url="postgresql://x")
    issues = sorted(raised.value.issues, key=lambda issue: issue.line or 0)
    lines = path.read_text().splitlines()
    assert [("http.users", "    bob: hunter2-plain"), ("http.trusted_proxies", lines[-1])] == [
        (issue.field, lines[(issue.line or 0) - 1]) for issue in issues
    ]
    assert "bob: must be a password hash like scrypt$" in issues[0].message
    assert "pgcrond hash-password" in issues[0].message
    assert "hunter2" not in str(raised.value)
    assert "'10.0.0.300' is not an IP address or CIDR" in issues[1].message


def load_http(tmp_path: Path, http: str) -> Config:
    path = write_config(tmp_path, "s", http)
    return load_config([str(path)], database_url="postgresql://x")


def refusals(tmp_path: Path, http: str) -> list[tuple[str | None, str]]:
    with pytest.raises(ConfigError) as raised:
        load_http(tmp_path, http)
    return [(issue.field, issue.message) for issue in raised.value.issues]


@pytest.mark.parametrize(
    ("listen", "access", "served"),
    [
        ("127.0.0.1:9464", "", True),
        ("[::1]:9464", "", True),
        ("localhost:9464", "", True),
        ("0.0.0.0:9464", "", False),
        (":9464", "", False),
        ("10.1.2.3:9464", "", False),
        ("0.0.0.0:9464", "  status_page: public\n", True),
        ("0.0.0.0:9464", "  trusted_proxies: [10.0.0.1]\n", True),
        ("127.0.0.1:9464", "  status_page: false\n", False),
    ],
)
def test_the_page_is_served_off_loopback_only_with_a_sign_in_or_public(
    tmp_path: Path, listen: str, access: str, served: bool
) -> None:
    config = load_http(tmp_path, f"http:\n  listen: '{listen}'\n{access}")
    host = http_parse_listen(listen)[0]
    assert served == config.page_access.served_on(host)


def test_public_off_loopback_warns_that_every_jobs_output_is_exposed(tmp_path: Path) -> None:
    config = load_http(tmp_path, "http:\n  listen: ':9464'\n  status_page: public\n")
    [warning] = [w for w in config.warnings if w.field == "http.status_page"]
    assert "recent output (stdout and stderr)" in warning.message
    quiet = load_http(tmp_path, "http:\n  status_page: public\n")
    assert [] == [w for w in quiet.warnings if w.field == "http.status_page"]


def test_check_refuses_passwords_over_plain_http_off_loopback_unless_tls_proxy_or_opt_out(
    tmp_path: Path,
) -> None:
    users = f"  users: {{{OPERATOR}: '{operator_hash()}'}}\n"
    [(field, message)] = refusals(tmp_path, f"http:\n  listen: ':9464'\n{users}")
    assert "http.users" == field
    assert "passwords would cross the network readable" in message
    for accepted in (
        "  tls: {cert: /etc/pgcrond/tls.crt, key: /etc/pgcrond/tls.key}\n",
        "  trusted_proxies: [10.0.0.1]\n",
        "  allow_plaintext_passwords: true\n",
        "  listen: '127.0.0.1:9464'\n",
    ):
        listen = "" if "listen" in accepted else "  listen: ':9464'\n"
        assert load_http(tmp_path, f"http:\n{listen}{users}{accepted}").page_access.users
    # A user without a password signs in through a proxy only: no password crosses.
    proxied = (
        "http:\n  listen: ':9464'\n  trusted_proxies: [10.0.0.1]\n"
        "  users: {olga: {role: operator}}\n"
    )
    assert "operator" == load_http(tmp_path, proxied).page_access.users["olga"].role


def test_roles_and_job_globs_are_read_and_a_wrong_one_is_refused_in_place(tmp_path: Path) -> None:
    hashed = operator_hash()
    http = (
        "http:\n  users:\n"
        f"    plain: '{hashed}'\n"
        f"    vera: {{password: '{hashed}'}}\n"
        f"    olga: {{password: '{hashed}', role: operator, jobs: ['sync-*', nightly-report]}}\n"
    )
    users = load_http(tmp_path, http).page_access.users
    assert ("operator", "viewer", "operator") == tuple(
        users[n].role for n in ("plain", "vera", "olga")
    )
    assert users["plain"].may_act("anything") and not users["vera"].may_act("sync-invoices")
    assert users["olga"].may_act("sync-invoices") and users["olga"].may_act("nightly-report")
    assert not users["olga"].may_act("cache-warm")
    assert hashed not in repr(users)
    for bad, said in (
        ("{role: admin}", "role 'admin' is not one of: viewer, operator"),
        ("{role: viewer, jobs: [x]}", "a viewer acts on none"),
        ("{password: hunter2}", "must be a password hash"),
        ("{pass: x}", "unknown key 'pass'"),
    ):
        [(field, message)] = refusals(tmp_path, f"http:\n  users:\n    bob: {bad}\n")
        assert ("http.users", True) == (field, said in message), message
    [(field, message)] = refusals(tmp_path, "http:\n  status_page: maybe\n")
    assert ("http.status_page", "must be true, false or public, got text") == (field, message)


@pytest.mark.parametrize(
    "path",
    [
        "/status/jobs/sync-invoices",
        "/status/jobs/sync-invoices/",
        "/status/jobs/sync-invoices/delete",
        "/status/jobs/nope/pause",
        "/status/jobs//pause",
        "/status/pause",
        "/status/jobs/%ZZ/run",
        "/status/jobs/sync-invoices/pause/x",
    ],
)
def test_only_a_known_job_and_action_are_a_post_route(path: str) -> None:
    assert None is action_route(path, {"sync-invoices", ODD_CODE})


def test_a_post_route_names_the_job_even_with_a_slash_in_its_code() -> None:
    jobs = {"sync-invoices", ODD_CODE}
    assert (ODD_CODE, "pause") == action_route(job_path(ODD_CODE, "/pause"), jobs)
    assert ("sync-invoices", "run") == action_route("/status/jobs/sync-invoices/run", jobs)


def test_the_access_example_in_the_operations_guide_loads_and_its_password_matches(
    tmp_path: Path,
) -> None:
    guide = (Path(__file__).parent.parent / "docs" / "operations.md").read_text("utf-8")
    section = guide.split("### Who may see it and act", 1)[1]
    block = section.split("```yaml\n", 1)[1].split("```", 1)[0]
    path = write_config(tmp_path, "s", block)
    access = load_config([str(path)], database_url="postgresql://x").page_access
    alice = access.users["alice"]
    assert alice.password is not None
    assert parse_hash(alice.password).matches("correct horse battery staple")
    assert ["10.0.0.0/8"] == [str(n) for n in access.trusted_proxies]
    assert "X-Forwarded-User" == access.proxy_header
