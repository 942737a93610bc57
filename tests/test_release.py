"""The built package works on its own: sdist -> wheel -> a fresh venv -> a real daemon.

The rest of the suite runs against an editable install, which reads files
straight from the source tree; a file missing from the package data (as the
migrations once were) only shows when the wheel is installed somewhere else.
Here the sdist is built from a copy of exactly what the Dockerfile copies, the
wheel is built from that sdist (``python -m build`` does so), and the wheel is
installed into a plain venv (no system site-packages, so the editable install
is invisible) whose commands run from a directory outside the source tree with
no ``PYTHONPATH``.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tarfile
import time
import venv
import zipfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import psycopg
import pytest

import pgcrond
from pgcrond.testing import LocalServer, throwaway

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("system_processes")]

REPO = Path(__file__).resolve().parents[1]
# What the Dockerfile's builder stage copies: the package is built from these alone.
SOURCES = ("pyproject.toml", "README.md", "LICENSE", "pgcrond")
BUILD_TIMEOUT_S = 300
MIGRATIONS = sorted(p.name for p in (REPO / "pgcrond/storage/sql/migrations").glob("*.sql"))


@dataclass
class Installed:
    dist: Path
    bin: Path
    home: Path  # cwd for every command: outside the source tree

    def env(self) -> dict[str, str]:
        env = {
            k: v
            for k, v in os.environ.items()
            if not k.startswith(("PGCROND_", "PYTHON", "VIRTUAL_ENV"))
        }
        env["PATH"] = f"{self.bin}{os.pathsep}{env.get('PATH', '')}"
        return env

    def run(self, *args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [str(self.bin / "pgcrond"), *args],
            cwd=self.home,
            env=self.env(),
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )


@pytest.fixture(scope="module")
def installed(tmp_path_factory: pytest.TempPathFactory) -> Installed:
    root = tmp_path_factory.mktemp("release")
    src = root / "src"
    src.mkdir()
    for name in SOURCES:
        source = REPO / name
        if source.is_dir():
            shutil.copytree(
                source, src / name, ignore=shutil.ignore_patterns("__pycache__", "*.pyc")
            )
        else:
            shutil.copy2(source, src / name)
    dist = root / "dist"
    subprocess.run(
        [sys.executable, "-m", "build", "--outdir", str(dist), str(src)],
        check=True,
        capture_output=True,
        timeout=BUILD_TIMEOUT_S,
    )
    env_dir = root / "venv"
    venv.create(env_dir, with_pip=True, system_site_packages=False)
    wheel = next(dist.glob("*.whl"))
    home = root / "home"
    home.mkdir()
    result = subprocess.run(
        [str(env_dir / "bin" / "python"), "-m", "pip", "install", "--quiet", str(wheel)],
        cwd=home,
        capture_output=True,
        text=True,
        timeout=BUILD_TIMEOUT_S,
        check=False,
    )
    assert 0 == result.returncode, result.stderr
    return Installed(dist=dist, bin=env_dir / "bin", home=home)


@pytest.fixture(scope="module")
def server() -> Iterator[LocalServer]:
    with throwaway(prefix="pgcrond-release-") as local:
        yield local


def test_the_wheel_ships_every_migration_the_queries_and_the_license(
    installed: Installed,
) -> None:
    wheel = zipfile.ZipFile(next(installed.dist.glob("*.whl")))
    names = set(wheel.namelist())
    shipped = sorted(
        n.rsplit("/", 1)[1] for n in names if n.startswith("pgcrond/storage/sql/migrations/")
    )
    assert MIGRATIONS == shipped
    assert "pgcrond/storage/sql/queries.sql" in names
    assert "pgcrond/py.typed" in names
    version = pgcrond.__version__
    assert f"pgcrond-{version}.dist-info/licenses/LICENSE" in names
    metadata = wheel.read(f"pgcrond-{version}.dist-info/METADATA").decode()
    assert "License-Expression: Apache-2.0" in metadata
    assert "Provides-Extra: embedded" in metadata
    assert "Classifier: Programming Language :: Python :: 3.11" in metadata
    with tarfile.open(next(installed.dist.glob("*.tar.gz"))) as sdist:
        assert f"pgcrond-{version}/LICENSE" in sdist.getnames()


def test_the_installed_package_is_the_wheel_not_the_source_tree(installed: Installed) -> None:
    """One version source: ``pgcrond.__version__`` is the metadata version and --version."""
    probe = subprocess.run(
        [
            str(installed.bin / "python"),
            "-c",
            "import importlib.metadata as m, pgcrond; "
            "print(pgcrond.__file__); print(m.version('pgcrond'))",
        ],
        cwd=installed.home,
        env=installed.env(),
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    location, metadata_version = probe.stdout.split()
    assert Path(location).is_relative_to(installed.bin.parent)
    assert pgcrond.__version__ == metadata_version
    result = installed.run("--version")
    assert (0, f"pgcrond {pgcrond.__version__}") == (result.returncode, result.stdout.strip())


def test_the_installed_check_accepts_the_example_config(installed: Installed) -> None:
    config = installed.home / "example.yaml"
    shutil.copy(REPO / "config" / "example.yaml", config)
    result = installed.run("check", "-c", str(config))
    assert 0 == result.returncode, result.stdout + result.stderr


def test_the_installed_init_config_passes_check_and_the_manual_and_completion_ship(
    installed: Installed,
) -> None:
    """The starter config and the man page are package data: they come from the wheel."""
    path = installed.home / "starter.yaml"
    written = installed.run("init", str(path))
    checked = installed.run("check", str(path))
    page = installed.run("manpage")
    completion = installed.run("completion", "bash")
    assert (0, 0) == (written.returncode, checked.returncode), written.stderr + checked.stderr
    assert "config OK: 1 job" in checked.stdout
    assert (0, '.TH PGCROND "1"') == (page.returncode, page.stdout[:15])
    assert (0, True) == (completion.returncode, "_shtab_pgcrond" in completion.stdout)


def test_the_installed_migrate_creates_the_lease_table(
    installed: Installed, server: LocalServer
) -> None:
    result = installed.run("migrate", "--database-url", server.dsn)
    assert 0 == result.returncode, result.stdout + result.stderr
    with psycopg.connect(server.dsn, autocommit=True) as conn:
        found = conn.execute("SELECT to_regclass('pgcrond.leases') IS NOT NULL").fetchone()
    assert (True,) == found


def test_the_installed_daemon_fires_a_job_and_stops_on_sigterm(
    installed: Installed, server: LocalServer
) -> None:
    marker = installed.home / "fired"
    config = installed.home / "jobs.yaml"
    config.write_text(
        "database:\n  schema: release_run\n"
        "jobs:\n"
        "  every-second:\n"
        '    cron: "* * * * * *"\n'
        f"    shell: \"echo fired >> '{marker}'\"\n"
    )
    log_path = installed.home / "run.log"
    with log_path.open("wb") as log:
        process = subprocess.Popen(
            [str(installed.bin / "pgcrond"), "run", "-c", str(config), "--http", "127.0.0.1:0",
             "--database-url", server.dsn, "--log-format", "json"],
            cwd=installed.home, env=installed.env(), stdin=subprocess.DEVNULL,
            stdout=log, stderr=subprocess.STDOUT,
        )  # fmt: skip
    try:
        deadline = time.monotonic() + 30
        finished: list[dict[str, object]] = []
        while not finished:
            assert process.poll() is None, log_path.read_text()[-3000:]
            assert time.monotonic() < deadline, (
                "no run_finished within 30 s\n" + (log_path.read_text()[-3000:])
            )
            time.sleep(0.1)
            events = [json.loads(line) for line in log_path.read_text().splitlines() if line]
            finished = [e for e in events if e["event"] == "run_finished"]
        assert "success" == finished[0]["outcome"]
        assert marker.read_text().startswith("fired\n")
        process.send_signal(signal.SIGTERM)
        assert 0 == process.wait(timeout=60)
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
    events = [json.loads(line) for line in log_path.read_text().splitlines() if line]
    assert "daemon_stopped" == events[-1]["event"]
