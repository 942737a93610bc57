"""Creating and upgrading the lease table's schema (``storage/sql/migrations``)."""

from __future__ import annotations

from pgcrond.core.keys import lock_id
from pgcrond.storage.leases import LeaseStore
from pgcrond.storage.sql import migrations


async def migrate(store: LeaseStore) -> list[int]:
    """Create or upgrade the table; safe when many replicas migrate at once.

    An up-to-date table is recognised without any DDL, so a role that may
    only read and write the table can start replicas once it is migrated.
    """
    if await _up_to_date(store):
        return []
    applied_now: list[int] = []
    async with store.db.connection() as conn, conn.transaction():
        await conn.execute(
            store.queries.get("migration_lock"),
            {"lock_id": lock_id(f"migrate:{store.queries.schema}")},
        )
        # CREATE SCHEMA IF NOT EXISTS needs CREATE on the whole database
        # even when the schema exists; a least-privilege role owns only its
        # schema, so ask first.
        cursor = await conn.execute(
            store.queries.get("schema_exists"), {"schema": store.queries.schema}
        )
        found = await cursor.fetchone()
        if not (found and found["present"]):
            await conn.execute(store.queries.create_schema())
        await conn.execute(store.queries.get("migrations_table"))
        cursor = await conn.execute(store.queries.get("applied_migrations"))
        done = {row["version"] for row in await cursor.fetchall()}
        for version, template in migrations():
            if version in done:
                continue
            # A migration holds several statements: never prepared, even
            # with database.prepared_statements on.
            await conn.execute(store.queries.migration(template), prepare=False)
            await conn.execute(store.queries.get("record_migration"), {"version": version})
            applied_now.append(version)
    return applied_now


async def _up_to_date(store: LeaseStore) -> bool:
    async with store.db.connection() as conn:
        cursor = await conn.execute(
            store.queries.get("table_exists"), {"name": store.queries.migrations_name}
        )
        found = await cursor.fetchone()
        if not (found and found["present"]):
            return False
        cursor = await conn.execute(store.queries.get("applied_migrations"))
        done = {row["version"] for row in await cursor.fetchall()}
    return {version for version, _ in migrations()} <= done
