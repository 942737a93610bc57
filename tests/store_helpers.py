"""Shared helpers for lease-store tests."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from pgcrond.db import Database
from pgcrond.store import LeaseStore


@asynccontextmanager
async def open_store(
    dsn: str, schema: str, *, owner: str = "test:1", migrate: bool = True, max_size: int = 2
) -> AsyncIterator[LeaseStore]:
    db = Database(dsn, min_size=1, max_size=max_size)
    await db.open()
    try:
        store = LeaseStore(db, schema=schema, owner=owner)
        if migrate:
            await store.migrate()
        yield store
    finally:
        await db.close()
