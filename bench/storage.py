"""What history costs: bytes per tick in the lease table, and what pruning it costs.

    .venv/bin/python -m bench.storage [--jobs 50] [--ticks 400] [--write-docs]

One throwaway PostgreSQL; ``jobs`` co-firing jobs run ``ticks`` ticks through
the lease store (one batched claim and one batched finalize per tick, as the
daemon does), then the table's size on disk (heap + indexes + TOAST, after
VACUUM) is divided by its rows, and everything is pruned the way the daemon
prunes, in its batches, timed. Prints one JSON object per figure.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
from datetime import UTC, datetime, timedelta

import psycopg

from bench.docs import header, load_note, write_docs
from pgcrond.core.keys import Identity
from pgcrond.core.schedule import run_key_for
from pgcrond.core.timing import LeaseTiming
from pgcrond.storage.claims import Acquired
from pgcrond.storage.db import Database
from pgcrond.storage.embedded import throwaway
from pgcrond.storage.history import prune
from pgcrond.storage.leases import LeaseStore
from pgcrond.storage.migrate import migrate

TIMING = LeaseTiming.build(timedelta(minutes=1), timedelta(0))
SCHEMA = "bench"


def say(figures: list[tuple[str, str]], figure: str, value: object) -> None:
    print(json.dumps({"figure": figure, "value": value}), flush=True)
    figures.append((figure, f"{value:,}" if isinstance(value, int | float) else str(value)))


async def fill(dsn: str, jobs: int, ticks: int) -> LeaseStore:
    db = Database(dsn)
    await db.open()
    store = LeaseStore(db, schema=SCHEMA, owner="bench-host:12345")
    await migrate(store)
    start = datetime.now(UTC).replace(microsecond=0) - timedelta(seconds=ticks)
    for n in range(ticks):
        tick = start + timedelta(seconds=n)
        identities = [Identity.schedule(f"job-{j:04d}", run_key_for(tick)) for j in range(jobs)]
        won = await asyncio.gather(
            *(
                store.claim(i, TIMING, fire_time=tick, late_after=tick + timedelta(hours=1))
                for i in identities
            )
        )
        await asyncio.gather(*(store.complete(w) for w in won if isinstance(w, Acquired)))
        if n % 100 == 0:
            print(f"# {n}/{ticks} ticks", flush=True)
    return store


def sizes(dsn: str) -> tuple[int, int, int]:
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(f"VACUUM ANALYZE {SCHEMA}.leases")
        row = conn.execute(
            f"SELECT count(*), pg_table_size('{SCHEMA}.leases'),"
            f" pg_indexes_size('{SCHEMA}.leases') FROM {SCHEMA}.leases"
        ).fetchone()
    assert row is not None
    return int(row[0]), int(row[1]), int(row[2])


async def main() -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--jobs", type=int, default=50)
    parser.add_argument("--ticks", type=int, default=400)
    parser.add_argument("--write-docs", action="store_true", help="rewrite docs/performance.md")
    args = parser.parse_args()
    load = load_note()
    figures: list[tuple[str, str]] = []
    with throwaway(prefix="pgcrond-bench-") as server:
        store = await fill(server.dsn, args.jobs, args.ticks)
        rows, table, indexes = sizes(server.dsn)
        per_row = (table + indexes) / rows
        say(figures, "rows", rows)
        say(figures, "bytes per tick row (heap + TOAST)", round(table / rows, 1))
        say(figures, "bytes per tick row (indexes)", round(indexes / rows, 1))
        say(figures, "bytes per tick row (total)", round(per_row, 1))
        month = 50 * 86_400 * 30
        say(figures, "50 per-second jobs, 30 days: rows", month)
        say(figures, "50 per-second jobs, 30 days: GiB", round(month * per_row / 2**30, 1))
        started = time.perf_counter()
        deleted = await prune(store, timedelta(0))
        took = time.perf_counter() - started
        say(figures, "prune: rows deleted", deleted)
        say(figures, "prune: rows per second (default batches)", round(deleted / took))
        await store.db.close()
        if args.write_docs:
            command = " ".join([".venv/bin/python -m bench.storage", *sys.argv[1:]])
            lines = ["| figure | value |", "|---|---|"]
            lines += [f"| {figure} | {value} |" for figure, value in figures]
            write_docs("storage", header(server.dsn, command, load) + "\n" + "\n".join(lines))
    return 0


if __name__ == "__main__":
    raise SystemExit(asyncio.run(main()))
