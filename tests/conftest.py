"""Test fixtures: a real PostgreSQL for every database test, and the tiers.

``PGCROND_TEST_DSN`` points the suite at an existing server; otherwise one
throwaway server is started for the session and removed at the end. Each test
gets its own schema, so tests never see each other's rows. Tests that stop,
kill or restart a server use ``own_server``: a server of their own, never the
shared one and never one the suite did not start.

Tiers are set by fixture, never by hand (docs/testing.md): a test is ``system``
when it requests ``own_server`` or ``system_processes``, ``integration`` when it
requests ``pg_dsn`` or ``subprocesses``, ``unit`` otherwise — directly or
through any fixture it uses. What a tier may not do raises while the test sets
up and runs, so a test cannot sit in a tier lighter than what it does.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import tempfile
import threading
import uuid
from collections.abc import AsyncIterator, Iterator, Sequence
from pathlib import Path
from typing import Any

import psycopg
import pytest

from pgcrond.core import redaction
from pgcrond.storage.db import Database
from pgcrond.storage.embedded import LocalServer, throwaway
from pgcrond.storage.leases import LeaseStore
from pgcrond.storage.migrate import migrate
from pgcrond.tickplan import CLAIM_AHEAD_MAX
from tests.helpers import idle
from tests.helpers.daemon_harness import wait_until

TIERS = ("unit", "integration", "system")
# Heaviest first: a test is in the tier of the heaviest fixture it uses.
TIER_FIXTURES = {
    "system": frozenset({"own_server", "system_processes"}),
    "integration": frozenset({"pg_dsn", "subprocesses"}),
}
# Programs that only the system tier starts: long-lived servers and daemons,
# and the slow external tools the issue puts there.
SYSTEM_PROGRAMS = frozenset(
    {"postgres", "initdb", "pg_ctl", "pg_basebackup", "pgbouncer", "chromium",
     "chromium-browser", "promtool", "prometheus"}
)  # fmt: skip


# True while pg_dsn starts the one shared server: the integration tier's
# database, set up inside whichever integration test needs it first.
_session_server_starting = threading.Event()


class TierViolation(AssertionError):
    """A test does what its tier forbids; it must request the fixture that says so."""


@pytest.fixture(scope="session")
def subprocesses() -> None:
    """This test starts child processes (a job's command, the CLI, a linter): integration."""


@pytest.fixture(scope="session")
def system_processes() -> None:
    """This test starts what the system tier owns: ``pgcrond run`` replicas, servers
    (PostgreSQL, PgBouncer), Chromium, promtool, a wheel build, the fault suite."""


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if hand := [m.name for m in item.iter_markers() if m.name in TIERS]:
            raise pytest.UsageError(
                f"{item.nodeid}: tier marked by hand ({', '.join(hand)}); "
                "tiers follow the fixtures a test requests (tests/conftest.py)"
            )
        item.add_marker(tier_of(getattr(item, "fixturenames", ())))
    # The idle minute's judges last (a stable sort): the scenario they read,
    # started with the first system test, has then had the most time to end.
    items.sort(key=lambda item: "idle_minute" in getattr(item, "fixturenames", ()))


def tier_of(fixturenames: Sequence[str]) -> str:
    names = set(fixturenames)
    for tier in ("system", "integration"):
        if names & TIER_FIXTURES[tier]:
            return tier
    return "unit"


def _tier(item: pytest.Item) -> str:
    return next(m.name for m in item.iter_markers() if m.name in TIERS)


def _program(args: Any) -> tuple[str, list[str]]:
    argv = [os.fsdecode(args)] if isinstance(args, (str, bytes, os.PathLike)) else list(args)
    return Path(os.fsdecode(argv[0])).name, [os.fsdecode(a) for a in argv[1:]]


@contextlib.contextmanager
def _tier_guard(item: pytest.Item) -> Iterator[None]:
    """Make what ``item``'s tier forbids raise, and fail the test even if the
    code under test catches that error (a runner records a failed spawn as FAIL)."""
    tier = _tier(item)
    if tier == "system":
        yield
        return
    violations: list[str] = []

    def violate(what: str, needs: str) -> TierViolation:
        violations.append(f"{item.nodeid} is marked {tier} but {what}: request {needs} "
                          "(tiers: tests/conftest.py, docs/testing.md)")  # fmt: skip
        return TierViolation(violations[-1])

    real_execute_child = subprocess.Popen._execute_child  # type: ignore[attr-defined]

    def execute_child(popen: Any, args: Any, *rest: Any, **kwargs: Any) -> Any:
        name, tail = _program(args)
        if _session_server_starting.is_set():
            return real_execute_child(popen, args, *rest, **kwargs)
        if name in SYSTEM_PROGRAMS or (name == "pgcrond" and tail[:1] == ["run"]):
            raise violate(f"starts {' '.join([name, *tail[:1]])}", "system_processes")
        if tier == "unit":
            raise violate(f"starts a process ({name})", "subprocesses")
        return real_execute_child(popen, args, *rest, **kwargs)

    def no_process(*args: Any, **kwargs: Any) -> Any:
        raise violate("forks or spawns a process", "subprocesses")

    def no_database(*args: Any, **kwargs: Any) -> Any:
        raise violate("connects to PostgreSQL", "pg_dsn")

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr("subprocess.Popen._execute_child", execute_child)
        if tier == "unit":
            for name in ("fork", "posix_spawn", "posix_spawnp", "system"):
                patch.setattr(os, name, no_process)
            patch.setattr(psycopg, "connect", no_database)  # an alias, bound at import
            patch.setattr(psycopg.Connection, "connect", no_database)
            patch.setattr(psycopg.AsyncConnection, "connect", no_database)
        try:
            yield
        finally:
            if violations:
                raise TierViolation("\n".join(violations))


@pytest.fixture(autouse=True)
def _no_remembered_secrets() -> Iterator[None]:
    """Each test starts and ends with no secret remembered for redaction.

    The registry is process-wide (``pgcrond.core.redaction``): a config a test
    loads remembers its URL's password (one test's is ``x``), and every later
    ``redact`` in that process then masks it, so an expected ``.../x`` came out
    ``.../***`` in whichever test ran after it (seen with pytest-xdist's order).
    """
    redaction.forget_all()
    yield
    redaction.forget_all()


# Setup and call only: a session fixture's teardown may run in whichever test
# happens to be last, and belongs to the tier of the test that set it up.
@pytest.hookimpl(wrapper=True)
def pytest_runtest_setup(item: pytest.Item) -> Iterator[None]:
    if _tier(item) == "system" and any(
        "idle_minute" in getattr(selected, "fixturenames", ()) for selected in item.session.items
    ):
        # The first system test starts the idle minute that its judges collect later.
        _start_idle_scenario()
    with _tier_guard(item):
        return (yield)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item: pytest.Item) -> Iterator[None]:
    with _tier_guard(item):
        return (yield)


@pytest.fixture(scope="session")
def pg_dsn() -> Iterator[str]:
    if dsn := os.environ.get("PGCROND_TEST_DSN"):
        yield dsn
        return
    with contextlib.ExitStack() as stack:
        _session_server_starting.set()
        try:
            server = stack.enter_context(throwaway(max_connections=300, prefix="pgcrond-test-"))
        finally:
            _session_server_starting.clear()
        yield server.dsn


LOCKS_IN_SCHEMA = """
SELECT 1 FROM pg_locks l
JOIN pg_class c ON c.oid = l.relation
JOIN pg_namespace n ON n.oid = c.relnamespace
WHERE n.nspname = %s AND l.pid <> pg_backend_pid()
LIMIT 1
"""


@pytest.fixture
def schema(pg_dsn: str) -> Iterator[str]:
    """A fresh schema name for this test; dropped afterwards."""
    name = f"t_{uuid.uuid4().hex[:12]}"
    yield name
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        # A replica the test just killed may have left a backend mid-statement
        # in the schema (it ends once it notices its client gone): DROP ...
        # CASCADE taking the tables one by one then deadlocked with it (seen
        # under pytest-xdist's load). The drop waits for the schema's locks.
        wait_until(
            lambda: not conn.execute(LOCKS_IN_SCHEMA, (name,)).fetchone(),
            15,
            f"other sessions to release their locks in schema {name}",
        )
        conn.execute(f'DROP SCHEMA IF EXISTS "{name}" CASCADE')


@pytest.fixture
def own_server() -> Iterator[LocalServer]:
    """A server only this test uses, free to be stopped, killed and restarted."""
    with throwaway(prefix="pgcrond-test-") as server:
        yield server


@pytest.fixture
async def store(pg_dsn: str, schema: str) -> AsyncIterator[LeaseStore]:
    """A migrated lease store in this test's schema, owner ``test:1``."""
    db = Database(pg_dsn)
    await db.open()
    # Claims win a tick as early as the daemon's (the tick plan's bound).
    leases = LeaseStore(db, schema=schema, owner="test:1", claim_ahead=CLAIM_AHEAD_MAX)
    try:
        await migrate(leases)
        yield leases
    finally:
        await db.close()


# The idle scenario in the background (tests/helpers/idle.py), once per session: every
# process of the session (each pytest-xdist worker) shares it through a
# directory the controller makes, and the controller stops it at the end.
IDLE_HOME = "PGCROND_TEST_IDLE_HOME"  # a PGCROND_ name: kept from the replicas' environment
_background: dict[str, idle.Background] = {}


def _is_xdist_worker(config: pytest.Config) -> bool:
    return hasattr(config, "workerinput")


_OWNS_IDLE_HOME = pytest.StashKey[Path]()


def pytest_configure(config: pytest.Config) -> None:
    # Made once, by the outermost pytest process (not a worker, not a session
    # of tests/test_tiers.py's inside this one), before any worker starts: the
    # workers inherit the variable.
    if not _is_xdist_worker(config) and IDLE_HOME not in os.environ:
        home = Path(tempfile.mkdtemp(prefix="pgcrond-idle-"))
        home.chmod(0o755)  # under root, the scenario's server runs as 'nobody'
        os.environ[IDLE_HOME] = str(home)
        config.stash[_OWNS_IDLE_HOME] = home


def _start_idle_scenario() -> idle.Background:
    if "idle" not in _background:
        _background["idle"] = idle.Background(Path(os.environ[IDLE_HOME]))
    _background["idle"].start_once()
    return _background["idle"]


@pytest.fixture(scope="session")
def idle_minute(system_processes: None) -> idle.IdleMinute:
    """Three listening replicas' first idle minute, as their own server logged it.

    Run once for the two tests that judge it (tests/helpers/idle.py), started early
    by ``pytest_runtest_setup`` when either test is selected: the touch is
    once a minute, a wait that costs no CPU and so overlaps other tests.
    """
    return _start_idle_scenario().result()


def pytest_unconfigure(config: pytest.Config) -> None:
    # After every worker is done (a worker may still need the result while another ends).
    if home := config.stash.get(_OWNS_IDLE_HOME, None):
        del os.environ[IDLE_HOME]
        (_background.pop("idle", None) or idle.Background(home)).stop()
