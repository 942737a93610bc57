"""A fresh database migrated to head has exactly the schema in ``storage/sql/schema.sql``."""

from __future__ import annotations

from pgcrond.storage.leases import LeaseStore
from tests.helpers.schema_snapshot import SNAPSHOT, dump


async def test_the_migrations_produce_the_committed_schema_snapshot(
    pg_dsn: str, store: LeaseStore, schema: str
) -> None:
    produced = dump(pg_dsn, schema)
    assert produced == SNAPSHOT.read_text(), (
        "the migrations and pgcrond/storage/sql/schema.sql disagree: review the difference, "
        "then run `.venv/bin/python -m tests.helpers.schema_snapshot --write`"
    )
