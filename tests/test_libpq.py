"""libpq's conventions: the URL as written, PG* variables and services without a URL.

pgcrond adds only what the user did not set (connect_timeout, keepalives,
application_name); operators find replicas by ``application_name``.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path
from urllib.parse import urlsplit

import psycopg

from pgcrond.storage.db import Database, connection_settings
from tests.helpers.daemon_harness import PGCROND


def test_parameters_written_in_the_url_are_never_replaced() -> None:
    settings = connection_settings(
        "postgresql://db/app?connect_timeout=2&application_name=mine&keepalives_idle=99",
        environ={},
    )
    assert "connect_timeout" not in settings
    assert "application_name" not in settings
    assert "keepalives_idle" not in settings
    assert 5 == settings["keepalives_interval"]


def test_libpq_environment_variables_win_over_pgcronds_defaults() -> None:
    settings = connection_settings(
        "host=db", environ={"PGAPPNAME": "from-env", "PGCONNECT_TIMEOUT": "3"}
    )
    assert "application_name" not in settings
    assert "connect_timeout" not in settings


async def test_a_pool_connects_under_the_replicas_name_unless_the_url_names_it(
    pg_dsn: str,
) -> None:
    named = Database(pg_dsn, application_name="pgcrond/host-a:42")
    mine = Database(f"{pg_dsn}?application_name=billing-cron", application_name="pgcrond/x")
    names = []
    for db in (named, mine):
        await db.open()
        try:
            row = await db.fetchone("SELECT current_setting('application_name') AS name")
            assert row is not None
            names.append(row["name"])
        finally:
            await db.close()
    assert ["pgcrond/host-a:42", "billing-cron"] == names


def libpq_env(pg_dsn: str) -> dict[str, str]:
    parts = urlsplit(pg_dsn)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PGCROND_", "PG"))}
    env.update(PGHOST=parts.hostname or "", PGPORT=str(parts.port), PGUSER=parts.username or "")
    return env


def migrate(config: Path, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(PGCROND), "migrate", "-c", str(config)],
        env=env,
        check=False,
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_pg_variables_work_without_any_url(pg_dsn: str, schema: str, tmp_path: Path) -> None:
    config = tmp_path / "jobs.yaml"
    config.write_text(
        f"database: {{schema: {schema}}}\njobs:\n  j: {{cron: '0 3 * * *', command: ['true']}}\n"
    )
    done = migrate(config, libpq_env(pg_dsn))
    assert 0 == done.returncode, done.stderr
    with psycopg.connect(pg_dsn) as conn:
        found = conn.execute("SELECT to_regclass(%s)", (f'"{schema}".leases',)).fetchone()
    assert found is not None and found[0] is not None


def test_a_service_file_names_the_database(pg_dsn: str, schema: str, tmp_path: Path) -> None:
    parts = urlsplit(pg_dsn)
    services = tmp_path / "pg_service.conf"
    services.write_text(
        f"[cron]\nhost={parts.hostname}\nport={parts.port}\nuser={parts.username}\n"
        "dbname=postgres\n"
    )
    config = tmp_path / "jobs.yaml"
    config.write_text(
        f"database: {{url: 'service=cron', schema: {schema}}}\n"
        "jobs:\n  j: {cron: '0 3 * * *', command: ['true']}\n"
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PGCROND_", "PG"))}
    env["PGSERVICEFILE"] = str(services)
    done = migrate(config, env)
    assert 0 == done.returncode, done.stderr


async def test_prepared_statements_can_be_turned_on_for_the_lease_pool(
    pg_dsn: str, schema: str, tmp_path: Path
) -> None:
    """database.prepared_statements: the claim is prepared server-side and still answers."""
    from pgcrond.config.loader import load_config
    from pgcrond.core.keys import Identity
    from pgcrond.storage.claims import Acquired
    from pgcrond.storage.leases import LeaseStore
    from pgcrond.storage.migrate import migrate as migrate_store

    path = tmp_path / "jobs.yaml"
    path.write_text(
        f"database: {{url: '{pg_dsn}', prepared_statements: true}}\n"
        "jobs:\n  j: {cron: '0 3 * * *', command: ['true']}\n"
    )
    assert load_config([path]).database.prepared_statements
    db = Database(pg_dsn, max_size=1, prepared=True)
    await db.open()
    try:
        store = LeaseStore(db, schema=schema)
        await migrate_store(store)
        for n in range(3):
            lease = await store.claim(Identity.schedule("j", f"2026-01-01T00:00:0{n}Z"))
            assert isinstance(lease, Acquired)
            assert await store.complete(lease)
        row = await db.fetchone(
            "SELECT count(*) AS prepared FROM pg_prepared_statements"
            " WHERE statement LIKE %(pattern)s",
            {"pattern": "%unnest%"},
        )
    finally:
        await db.close()
    assert row is not None and row["prepared"] >= 1
