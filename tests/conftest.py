"""Test fixtures: a real PostgreSQL for every database test.

``PGCROND_TEST_DSN`` points the suite at an existing server; otherwise one
throwaway server is started for the session and removed at the end. Each test
gets its own schema, so tests never see each other's rows. Tests that stop,
kill or restart a server use ``own_server``: a server of their own, never the
shared one and never one the suite did not start.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import AsyncIterator, Iterator

import psycopg
import pytest

from pgcrond.storage.db import Database
from pgcrond.storage.embedded import LocalServer, throwaway
from pgcrond.storage.leases import LeaseStore


@pytest.fixture(scope="session")
def pg_dsn() -> Iterator[str]:
    if dsn := os.environ.get("PGCROND_TEST_DSN"):
        yield dsn
        return
    with throwaway(max_connections=300, prefix="pgcrond-test-") as server:
        yield server.dsn


@pytest.fixture
def schema(pg_dsn: str) -> Iterator[str]:
    """A fresh schema name for this test; dropped afterwards."""
    name = f"t_{uuid.uuid4().hex[:12]}"
    yield name
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
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
    leases = LeaseStore(db, schema=schema, owner="test:1")
    try:
        await leases.migrate()
        yield leases
    finally:
        await db.close()
