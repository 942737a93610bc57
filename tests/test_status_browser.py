"""The status page in a real browser: headless Chromium loads it from a real ``pgcrond run``.

A replica runs the status page test's config against a database holding that
test's known history; Chromium screenshots the overview and a job's page at
1280 px and at phone width (390 px) and must log nothing on its console (the
page has no script, so any console line is a blocked resource, a failed load
or a policy violation). Skipped only when Chromium is not installed (CI's
``.ci/run`` installs Debian's ``chromium``).

``PGCROND_UPDATE_SCREENSHOTS=1`` also copies the screenshots to
``docs/status-page/``, where the README shows one.
"""

from __future__ import annotations

import functools
import http.server
import json
import os
import re
import shutil
import signal
import ssl
import struct
import subprocess
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from pgcrond.daemon.page.routes import job_path
from tests.helpers.browser import CHROMIUM, Browser, self_signed
from tests.helpers.daemon_harness import ROOT, Replica, wait_until
from tests.helpers.http import answer, status_of
from tests.helpers.status_page import (
    OPERATOR,
    OTHER_REPLICA,
    THIS_REPLICA,
    basic,
    operator_hash,
    seed,
    users_section,
    write_config,
)
from tests.helpers.store import open_store

pytestmark = [
    pytest.mark.skipif(
        CHROMIUM is None,
        reason="headless Chromium is not installed (Debian: apt-get install chromium)",
    ),
    pytest.mark.usefixtures("system_processes"),
]
DOCS = ROOT / "docs" / "status-page"
CONSOLE = re.compile(r":CONSOLE[:(]\d+\)?\] (.*)")
VIEWS = {
    # name: (path, width, height); heights hold the whole page of the seeded history.
    "overview-1280": ("/status", 1280, 1180),
    "overview-phone": ("/status", 390, 3300),
    "job-1280": (job_path("nightly-report"), 1280, 1400),
    "job-phone": (job_path("nightly-report"), 390, 3900),
}


@dataclass(frozen=True)
class Shot:
    path: Path
    width: int
    height: int
    console: list[str]


def screenshot(url: str, out: Path, width: int, height: int, profile: Path) -> Shot:
    """One headless Chromium load of ``url``: a PNG of ``width`` x ``height`` and its console."""
    assert CHROMIUM is not None
    done = subprocess.run(
        [
            CHROMIUM,
            "--headless",
            "--no-sandbox",  # CI runs as root, where Chromium's sandbox refuses to start
            "--disable-gpu",
            "--hide-scrollbars",
            "--no-first-run",
            "--force-device-scale-factor=1",
            f"--user-data-dir={profile}",
            f"--window-size={width},{height}",
            f"--screenshot={out}",
            "--enable-logging=stderr",
            "--v=0",
            url,
        ],
        capture_output=True,
        text=True,
        timeout=90,
        check=False,
    )
    assert 0 == done.returncode, done.stderr[-3000:]
    console = [m.group(1) for line in done.stderr.splitlines() if (m := CONSOLE.search(line))]
    png = out.read_bytes()
    assert png.startswith(b"\x89PNG\r\n\x1a\n"), "not a PNG"
    shot_width, shot_height = struct.unpack(">II", png[16:24])
    return Shot(out, shot_width, shot_height, console)


def dump_dom(url: str, profile: Path) -> str:
    assert CHROMIUM is not None
    done = subprocess.run(
        [
            CHROMIUM,
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            f"--user-data-dir={profile}",
            "--dump-dom",
            url,
        ],
        capture_output=True,
        text=True,
        timeout=90,
        check=False,
    )
    assert 0 == done.returncode, done.stderr[-3000:]
    return done.stdout


def test_the_console_check_sees_a_blocked_resource(tmp_path: Path) -> None:
    """The console check is not vacuous: a stylesheet from elsewhere, blocked, is reported."""
    page = tmp_path / "broken.html"
    page.write_text(
        '<!doctype html><html><head><meta http-equiv="Content-Security-Policy" '
        "content=\"default-src 'none'\">"
        '<link rel="stylesheet" href="https://cdn.invalid/x.css"></head><body>x</body></html>'
    )
    shot = screenshot(page.as_uri(), tmp_path / "broken.png", 400, 300, tmp_path / "profile")
    assert 1 == len(shot.console)
    assert "https://cdn.invalid/x.css" in shot.console[0]


@dataclass(frozen=True)
class Served:
    """A real replica serving the page: its base URL, config and log."""

    base: str
    config: Path
    replica: Replica


@contextmanager
def serving(
    pg_dsn: str, schema: str, tmp_path: Path, http: str = "", scheme: str = "http"
) -> Iterator[Served]:
    """A real replica serving the status page over the seeded history (``http``: its section)."""
    import asyncio

    async def seeded() -> None:
        async with (
            open_store(pg_dsn, schema, owner=THIS_REPLICA) as store,
            open_store(pg_dsn, schema, owner=OTHER_REPLICA, migrate=False) as other,
        ):
            await seed(pg_dsn, schema, store, other)

    asyncio.run(seeded())
    config = write_config(tmp_path, schema, http)
    replica = Replica("replica", config, tmp_path / "replica.log", daemon_env(pg_dsn)).start()
    try:
        address = replica.http_address()
        base = f"{scheme}://{address}"
        wait_until(lambda: status_of(f"{base}/readyz") == 200, 20, "the replica to be ready")
        yield Served(base, config, replica)
    finally:
        replica.stop()


def daemon_env(pg_dsn: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("PGCROND_")}
    env["PGCROND_DATABASE_URL"] = pg_dsn
    return env


@pytest.fixture
def daemon(pg_dsn: str, schema: str, tmp_path: Path) -> Iterator[str]:
    """A real replica serving the status page over the seeded history; yields its base URL."""
    with serving(pg_dsn, schema, tmp_path) as served:
        yield served.base


def test_the_status_pages_load_in_chromium_at_1280_and_phone_width_without_console_errors(
    daemon: str, tmp_path: Path
) -> None:
    shots: dict[str, Shot] = {}
    for name, (path, width, height) in VIEWS.items():
        started = time.monotonic()
        shots[name] = screenshot(
            daemon + path, tmp_path / f"{name}.png", width, height, tmp_path / "profile"
        )
        assert time.monotonic() - started < 60
    for name, shot in shots.items():
        assert [] == shot.console, name
        assert (VIEWS[name][1], VIEWS[name][2]) == (shot.width, shot.height)
        # A blank page compresses to a few kB; a drawn one does not.
        assert shot.path.stat().st_size > 20_000, name
    # What Chromium built from the page: the jobs, the strip, the chart.
    overview = dump_dom(daemon + "/status", tmp_path / "profile")
    assert "nightly-report" in overview and "sync-invoices" in overview
    assert 'class="cell miss"' in overview
    job = dump_dom(daemon + job_path("nightly-report"), tmp_path / "profile")
    assert '<svg class="chart"' in job
    assert "<script>" not in job.split("</head>", 1)[1]
    if os.environ.get("PGCROND_UPDATE_SCREENSHOTS") == "1":
        DOCS.mkdir(parents=True, exist_ok=True)
        for name, shot in shots.items():
            shutil.copyfile(shot.path, DOCS / f"{name}.png")


# -- signed in: Chromium driven over the DevTools protocol ------------------------------------


@contextmanager
def in_chromium(
    pg_dsn: str, schema: str, tmp_path: Path, http: str = ""
) -> Iterator[tuple[Served, Browser]]:
    """A replica serving the page with ``http`` and a Chromium to look at it, closed after."""
    with serving(pg_dsn, schema, tmp_path, http) as served:
        browser = Browser(tmp_path / "profile")
        try:
            yield served, browser
        finally:
            browser.close()


def cli_status(served: Served, pg_dsn: str) -> dict[str, dict[str, Any]]:
    """``pgcrond status --json`` from the real CLI, by job."""
    done = subprocess.run(
        [str(ROOT / ".venv" / "bin" / "pgcrond"), "status", "-c", str(served.config), "--json"],
        capture_output=True,
        text=True,
        timeout=60,
        env=daemon_env(pg_dsn),
        check=False,
    )
    assert 0 == done.returncode, done.stderr
    return {entry["job"]: entry for entry in json.loads(done.stdout)["jobs"]}


def test_a_signed_in_operator_pauses_resumes_and_runs_a_job_in_chromium(
    pg_dsn: str, schema: str, tmp_path: Path
) -> None:
    http = users_section()
    job = "nightly-report"
    with in_chromium(pg_dsn, schema, tmp_path, http) as (served, browser):
        url = served.base + job_path(job)
        # Without credentials Chromium gets the Basic challenge and shows no job.
        assert 401 == browser.load(url)
        assert "nightly-report" not in browser.text()
        browser.send_headers(basic())
        assert 200 == browser.load(url)
        assert f"Signed in as {OPERATOR}" in browser.text()
        assert "Not paused" in browser.text()

        browser.submit("form.pause", {"reason": "ledger migration <tonight>"})
        assert url == browser.evaluate("location.href")  # redirected back, a GET
        assert f"Paused by {OPERATOR} at" in browser.text()
        assert "ledger migration <tonight>" in browser.text()
        paused = cli_status(served, pg_dsn)[job]["paused"]
        assert (OPERATOR, "ledger migration <tonight>") == (paused["by"], paused["reason"])

        browser.submit("form.resume")
        assert "Not paused" in browser.text()
        assert None is cli_status(served, pg_dsn)[job]["paused"]

        browser.submit("form.run")
        assert url == browser.evaluate("location.href")
        taken = served.replica.wait_event("request_done", where=lambda e: e["job"] == job)
        assert "success" == taken["outcome"]
        [requested] = served.replica.events("request_taken")
        assert OPERATOR == requested["requested_by"]
        assert 200 == browser.load(url)
        [row] = browser.evaluate(
            "[...document.querySelectorAll('table.requests tbody tr')]"
            ".map(r => [...r.cells].map(c => c.innerText.trim()))"
        )
        run_key, trigger, by, _, taken_by, outcome = row
        assert (requested["run_key"], "manual", OPERATOR, "success") == (
            run_key,
            trigger,
            by,
            outcome,
        )
        assert served.replica.wait_event("daemon_ready")["replica"] == taken_by
        last = cli_status(served, pg_dsn)[job]["last_run"]
        assert (requested["run_key"], "SUCCESS") == (last["run_key"], last["status"])


def test_a_forged_post_and_an_unsigned_one_change_nothing_on_a_real_replica(
    pg_dsn: str, schema: str, tmp_path: Path
) -> None:
    """A made-up token is 403, a POST without credentials 401; nothing is paused."""
    http = users_section()
    with serving(pg_dsn, schema, tmp_path, http) as served:
        action = served.base + job_path("nightly-report", "/pause")
        for headers, expected in ((basic(), 403), ({}, 401)):
            forged = {"reason": "forged", "csrf": "guess"}
            assert expected == status_of(action, headers, method="POST", form=forged)
        assert None is cli_status(served, pg_dsn)["nightly-report"]["paused"]


def test_the_page_switched_off_is_a_404_and_metrics_stay(
    pg_dsn: str, schema: str, tmp_path: Path
) -> None:
    with serving(pg_dsn, schema, tmp_path, "http:\n  status_page: false\n") as served:
        assert 404 == status_of(served.base + "/status")
        assert 200 == status_of(served.base + "/metrics")


def test_without_authentication_the_page_has_no_forms_and_refuses_a_post(
    daemon: str, tmp_path: Path
) -> None:
    job = dump_dom(daemon + job_path("nightly-report"), tmp_path / "profile")
    assert "nightly-report" in job
    assert 'method="post"' not in job and "Read-only." in job
    refused = answer(
        daemon + job_path("nightly-report", "/pause"), method="POST", form={"reason": "x"}
    )
    assert 403 == refused.status_code
    assert b"read-only" in refused.content


def post_forms(browser: Browser) -> int:
    return int(browser.evaluate("document.querySelectorAll('form[method=post]').length"))


def forge_form(browser: Browser, action: str, token: str) -> None:
    """Builds a form the page never drew (as a forger's script would) and sends it."""
    browser.events.clear()
    browser.evaluate(
        "(() => { const f = document.createElement('form'); f.method = 'post';"
        f" f.action = {json.dumps(action)};"
        " for (const [k, v] of [['csrf', " + json.dumps(token) + "], ['reason', 'forged']]) {"
        " const i = document.createElement('input'); i.name = k; i.value = v; f.appendChild(i); }"
        " document.body.appendChild(f); f.submit(); })()"
    )
    browser.wait_for("Page.loadEventFired")


def test_a_viewer_sees_no_buttons_and_a_forged_post_is_refused_in_chromium(
    pg_dsn: str, schema: str, tmp_path: Path
) -> None:
    http = f"http:\n  users:\n    vera: {{password: '{operator_hash()}', role: viewer}}\n"
    job = "nightly-report"
    with in_chromium(pg_dsn, schema, tmp_path, http) as (served, browser):
        url = served.base + job_path(job)
        browser.send_headers(basic("vera"))
        assert 200 == browser.load(url)
        assert "Signed in as vera (viewer)" in browser.text()
        assert 0 == post_forms(browser)
        buttons = "document.querySelectorAll('button:not(form.filter button)').length"
        assert 0 == browser.evaluate(buttons)
        forge_form(browser, job_path(job, "/pause"), "0.forged")
        assert 403 == browser.page_status()
        assert None is cli_status(served, pg_dsn)[job]["paused"]


def test_a_token_the_server_did_not_issue_is_refused_even_with_a_matching_cookie(
    pg_dsn: str, schema: str, tmp_path: Path
) -> None:
    """The double-submit forgery: a planted cookie and the same value in the form field."""
    http = users_section()
    job = "nightly-report"
    with in_chromium(pg_dsn, schema, tmp_path, http) as (served, browser):
        url = served.base + job_path(job)
        forged = "Z" * 43
        browser.send_headers(basic())
        browser.call("Network.setCookie", session=True, name="pgcrond_csrf", value=forged,
                     url=served.base + "/status", path="/status")  # fmt: skip
        assert 200 == browser.load(url)
        assert 1 <= post_forms(browser)
        browser.evaluate(
            f"document.querySelector('form.pause [name=csrf]').value = {json.dumps(forged)}"
        )
        browser.submit("form.pause", {"reason": "forged"})
        assert 403 == browser.page_status()
        assert None is cli_status(served, pg_dsn)[job]["paused"]
        assert [] == served.replica.events("status_page_action")


class _Forger(http.server.SimpleHTTPRequestHandler):
    def log_message(self, format: str, *args: Any) -> None:
        pass


def test_a_form_from_another_site_is_refused_even_with_a_good_token(
    pg_dsn: str, schema: str, tmp_path: Path
) -> None:
    """A page at http://localhost:PORT (another site than 127.0.0.1) posts the operator's
    own token, with the Basic credentials Chromium re-sends: refused by origin."""
    http_section = users_section()
    job = "nightly-report"
    with in_chromium(pg_dsn, schema, tmp_path, http_section) as (served, browser):
        site = tmp_path / "forger"
        site.mkdir()
        handler = functools.partial(_Forger, directory=str(site))
        forger = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
        threading.Thread(target=forger.serve_forever, daemon=True).start()
        try:
            browser.send_headers(basic())
            assert 200 == browser.load(served.base + job_path(job))
            token = browser.evaluate("document.querySelector('form.pause [name=csrf]').value")
            action = served.base + job_path(job, "/pause")
            site.joinpath("index.html").write_text(
                f'<form class="pause" method="post" action="{action}">'
                f'<input name="csrf" value="{token}"><input name="reason" value="x">'
                "<button>go</button></form>"
            )
            assert 200 == browser.load(f"http://localhost:{forger.server_address[1]}/")
            browser.submit("form.pause")
            assert 403 == browser.page_status()
            assert None is cli_status(served, pg_dsn)[job]["paused"]
            [denied] = served.replica.events("status_page_denied")
            assert ("origin", "Sec-Fetch-Site: cross-site") == (denied["why"], denied["sent"])
        finally:
            forger.shutdown()


def test_the_overview_refreshes_by_itself_and_shows_a_paused_job_as_paused(
    pg_dsn: str, schema: str, tmp_path: Path
) -> None:
    row = (
        "[...document.querySelectorAll('table.jobs tbody tr')]"
        ".find(r => r.innerText.includes('nightly-report'))"
    )
    with in_chromium(pg_dsn, schema, tmp_path) as (served, browser):
        assert 200 == browser.load(served.base + "/status?refresh=5")
        assert "paused" not in browser.evaluate(f"{row}.cells[2].innerText")
        done = subprocess.run(
            [str(ROOT / ".venv" / "bin" / "pgcrond"), "pause", "-c", str(served.config),
             "nightly-report", "--reason", "ledger migration", "--by", "ops"],
            capture_output=True, text=True, timeout=60, env=daemon_env(pg_dsn), check=False,
        )  # fmt: skip
        assert 0 == done.returncode, done.stderr
        # No one reloads: the page does, within its 5 s.
        browser.wait_for("Page.loadEventFired", timeout=15)
        assert 200 == browser.page_status()
        next_fire = browser.evaluate(f"{row}.cells[2].innerText")
        assert re.fullmatch(r"paused — by ops( \(.+\))?: ledger migration", next_fire.strip())
        # Switched off, it stays put.
        assert 200 == browser.load(served.base + "/status?refresh=off")
        refreshing = "document.querySelectorAll('meta[http-equiv=refresh]').length"
        assert 0 == browser.evaluate(refreshing)


def test_https_with_a_self_signed_certificate_in_chromium_and_a_new_one_after_sighup(
    pg_dsn: str, schema: str, tmp_path: Path
) -> None:
    cert, key, spki = self_signed(tmp_path, "first")
    http_section = f"http:\n  tls: {{cert: '{cert}', key: '{key}'}}\n"
    with serving(pg_dsn, schema, tmp_path, http_section, scheme="https") as served:
        assert served.base.startswith("https://")
        browser = Browser(tmp_path / "profile", (f"--ignore-certificate-errors-spki-list={spki}",))
        try:
            assert 200 == browser.load(served.base + "/status")
            assert "https:" == browser.evaluate("location.protocol")
            assert "nightly-report" in browser.text()
        finally:
            browser.close()
        host, port = served.base.removeprefix("https://").rsplit(":", 1)
        before = ssl.get_server_certificate((host, int(port)))
        renewed, renewed_key, _ = self_signed(tmp_path, "second")
        cert.write_bytes(renewed.read_bytes())
        key.write_bytes(renewed_key.read_bytes())
        served.replica.signal(signal.SIGHUP)
        served.replica.wait_event("http_tls_reloaded")
        after = ssl.get_server_certificate((host, int(port)))
        assert before != after
        assert ssl.PEM_cert_to_DER_cert(after) == ssl.PEM_cert_to_DER_cert(renewed.read_text())
