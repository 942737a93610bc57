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

import os
import re
import shutil
import struct
import subprocess
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from pgcrond.daemon.status_page import job_path
from tests.daemon_harness import ROOT, Replica, wait_until
from tests.store_helpers import open_store
from tests.test_status_page import OTHER_REPLICA, THIS_REPLICA, seed, write_config

CHROMIUM = next(
    (found for name in ("chromium", "chromium-browser") if (found := shutil.which(name))), None
)
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


@pytest.fixture
def daemon(pg_dsn: str, schema: str, tmp_path: Path) -> Iterator[str]:
    """A real replica serving the status page over the seeded history; yields its base URL."""
    import asyncio

    async def seeded() -> None:
        async with (
            open_store(pg_dsn, schema, owner=THIS_REPLICA) as store,
            open_store(pg_dsn, schema, owner=OTHER_REPLICA, migrate=False) as other,
        ):
            await seed(pg_dsn, schema, store, other)

    asyncio.run(seeded())
    config = write_config(tmp_path, schema)
    env = {k: v for k, v in os.environ.items() if not k.startswith("PGCROND_")}
    env["PGCROND_DATABASE_URL"] = pg_dsn
    replica = Replica("replica", config, tmp_path / "replica.log", env).start()
    try:
        address = replica.http_address()
        base = f"http://{address}"
        wait_until(lambda: _get(f"{base}/readyz") == 200, 20, "the replica to be ready")
        yield base
    finally:
        replica.stop()


def _get(url: str) -> int:
    try:
        with urllib.request.urlopen(url, timeout=5) as response:
            return int(response.status)
    except OSError:
        return 0


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
