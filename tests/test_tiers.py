"""The tiers cannot rot: a test doing more than its fixtures say fails loudly.

A small suite with the project's conftest runs in its own pytest process; its
tests spawn, connect and start daemons in tiers that allow it or not.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.conftest import tier_of
from tests.helpers.daemon_harness import PGCROND

pytest_plugins = ["pytester"]
ROOT = Path(__file__).resolve().parent.parent
INI = """[pytest]
asyncio_default_fixture_loop_scope = function
markers =
    unit
    integration
    system
"""

SUITE = """
import subprocess

import psycopg
import pytest


def test_unit_pure():
    assert True


def test_unit_spawns():
    subprocess.run(["true"], check=True)


def test_unit_swallows_the_refusal():
    try:
        subprocess.run(["true"], check=True)
    except Exception:
        pass


def test_unit_connects():
    psycopg.connect("postgresql://127.0.0.1:1/x", connect_timeout=1)


@pytest.mark.usefixtures("subprocesses")
def test_integration_spawns():
    subprocess.run(["true"], check=True)


@pytest.mark.usefixtures("subprocesses")
def test_integration_starts_a_daemon():
    subprocess.run(["PGCROND", "run", "-c", "jobs.yaml"], check=True)


@pytest.mark.usefixtures("system_processes")
def test_system_starts_a_daemon():
    # The guard lets it through; the exit code is pgcrond's own.
    assert 0 != subprocess.run(["PGCROND", "run", "-c", "/nonexistent.yaml"]).returncode
"""


def test_a_tier_is_the_heaviest_its_fixtures_name() -> None:
    assert "unit" == tier_of(["tmp_path", "monkeypatch"])
    assert "integration" == tier_of(["tmp_path", "pg_dsn", "schema"])
    assert "integration" == tier_of(["subprocesses"])
    assert "system" == tier_of(["pg_dsn", "own_server"])
    assert "system" == tier_of(["subprocesses", "system_processes"])


@pytest.mark.usefixtures("subprocesses")
def test_a_test_that_does_more_than_its_tier_allows_fails(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PYTHONPATH", str(ROOT))
    pytester.makeini(INI)
    pytester.makeconftest("from tests.conftest import *  # noqa: F403\n")
    pytester.makepyfile(test_suite=SUITE.replace("PGCROND", str(PGCROND)))
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", "-rA")
    outcomes = {
        line.split()[1].split("::")[-1]: line.split()[0]
        for line in result.outlines
        if line.startswith(("PASSED", "FAILED", "ERROR")) and "::" in line
    }
    assert {
        "test_unit_pure": "PASSED",
        "test_unit_spawns": "FAILED",
        "test_unit_swallows_the_refusal": "FAILED",
        "test_unit_connects": "FAILED",
        "test_integration_spawns": "PASSED",
        "test_integration_starts_a_daemon": "FAILED",
        "test_system_starts_a_daemon": "PASSED",
    } == outcomes
    result.stdout.fnmatch_lines(
        [
            "*test_unit_spawns is marked unit but starts a process (true): request subprocesses*",
            "*test_unit_connects is marked unit but connects to PostgreSQL: request pg_dsn*",
            "*test_integration_starts_a_daemon is marked integration but starts pgcrond run:"
            " request system_processes*",
        ]
    )


def test_a_tier_marked_by_hand_is_refused(pytester: pytest.Pytester) -> None:
    pytester.makeini(INI)
    pytester.makeconftest("from tests.conftest import *  # noqa: F403\n")
    pytester.makepyfile(test_suite="import pytest\n\n@pytest.mark.unit\ndef test_x():\n    pass\n")
    # Refused while collecting, before anything runs: in this process.
    result = pytester.runpytest_inprocess("-p", "no:cacheprovider", "--collect-only")
    assert pytest.ExitCode.USAGE_ERROR == result.ret
    result.stderr.fnmatch_lines(["*test_x: tier marked by hand (unit)*"])
