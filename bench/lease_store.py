"""Lease store: round trips per operation and claims per second.

    .venv/bin/python -m bench.lease_store [--seconds 5]

Round trips are counted on the wire: libpq's protocol trace of the store's own
connection records every message; each Sync (extended protocol) or Query
(simple protocol) the client sends is one round trip. Throughput runs claim +
complete cycles on distinct identities, on one connection and on 8 processes
with a connection each, side by side against one throwaway server
(PGCROND_BENCH_DSN to use another).
"""

from __future__ import annotations

import argparse
import asyncio
import multiprocessing
import os
import sys
import tempfile
import time
import uuid
from collections.abc import Awaitable, Callable, Iterator
from contextlib import contextmanager
from datetime import timedelta
from pathlib import Path

from pgcrond.core.keys import Identity
from pgcrond.core.timing import LeaseTiming
from pgcrond.storage.claims import Acquired
from pgcrond.storage.db import Database
from pgcrond.storage.embedded import throwaway
from pgcrond.storage.jobstate import pause
from pgcrond.storage.leases import LeaseStore
from pgcrond.storage.migrate import migrate
from tests.helpers.store import count_round_trips

TIMING = LeaseTiming.build(timedelta(minutes=5))


@contextmanager
def server() -> Iterator[str]:
    if dsn := os.environ.get("PGCROND_BENCH_DSN"):
        yield dsn
        return
    with throwaway(max_connections=50, prefix="pgcrond-bench-") as local:
        yield local.dsn


async def count(trace: Path, op: Callable[[], Awaitable[object]]) -> int:
    before = count_round_trips(trace.read_text())
    await op()
    return count_round_trips(trace.read_text()) - before


async def round_trips(dsn: str, schema: str) -> dict[str, int]:
    db = Database(dsn, min_size=1, max_size=1)
    await db.open()
    store = LeaseStore(db, schema=schema)
    await migrate(store)
    trace = Path(tempfile.mkstemp(prefix="pgcrond-trace-")[1])
    handle = trace.open("w")
    async with db.connection() as conn:
        conn.pgconn.trace(handle.fileno())
        # Disable server-side preparing so every call is counted the same way:
        # the first count would otherwise include a one-off Parse round trip.
        conn.prepare_threshold = None
    results: dict[str, int] = {}
    identity = Identity.schedule("rt", "2026-01-01T00:00:00Z")
    holder: list[Acquired] = []

    async def fresh() -> None:
        lease = await store.claim(identity, TIMING)
        assert isinstance(lease, Acquired)
        holder.append(lease)

    results["acquire (fresh insert)"] = await count(trace, fresh)
    results["acquire (lost: held)"] = await count(trace, lambda: store.claim(identity))
    results["heartbeat"] = await count(trace, lambda: store.heartbeat(holder[-1]))
    results["fail"] = await count(trace, lambda: store.fail(holder[-1], "x"))
    results["acquire (reclaim of FAIL)"] = await count(trace, fresh)
    results["complete"] = await count(trace, lambda: store.complete(holder[-1]))
    results["acquire (lost: done)"] = await count(trace, lambda: store.claim(identity))
    # Pause is read inside the claim: a paused job's tick is refused (and
    # recorded SKIPPED/paused) in the same one round trip.
    await pause(store, ["rt-paused"], by="bench", reason=None)
    paused = Identity.schedule("rt-paused", "2026-01-01T00:00:00Z")
    results["acquire (lost: paused, recorded SKIPPED)"] = await count(
        trace, lambda: store.claim(paused, TIMING)
    )
    handle.close()
    trace.unlink()
    await db.close()
    return results


async def claim_loop(dsn: str, schema: str, seconds: float, tag: str) -> int:
    db = Database(dsn, min_size=1, max_size=1)
    await db.open()
    store = LeaseStore(db, schema=schema)
    done = 0
    deadline = time.perf_counter() + seconds
    while time.perf_counter() < deadline:
        lease = await store.claim(Identity.schedule("tp", f"{tag}-{done}"), TIMING)
        assert isinstance(lease, Acquired)
        assert await store.complete(lease)
        done += 1
    await db.close()
    return done


def _worker(
    dsn: str, schema: str, seconds: float, tag: str, out: multiprocessing.Queue[int]
) -> None:
    out.put(asyncio.run(claim_loop(dsn, schema, seconds, tag)))


def throughput(dsn: str, schema: str, processes: int, seconds: float) -> float:
    ctx = multiprocessing.get_context("spawn")
    out: multiprocessing.Queue[int] = ctx.Queue()
    workers = [
        ctx.Process(
            target=_worker, args=(dsn, schema, seconds, f"{processes}-{n}-{uuid.uuid4()}", out)
        )
        for n in range(processes)
    ]
    for worker in workers:
        worker.start()
    total = sum(out.get(timeout=seconds + 60) for _ in workers)
    for worker in workers:
        worker.join()
    return total / seconds


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=5.0)
    args = parser.parse_args()
    schema = f"bench_{uuid.uuid4().hex[:8]}"
    with server() as dsn:
        trips = asyncio.run(round_trips(dsn, schema))
        print("round trips per operation (counted on the wire)")
        for name, value in trips.items():
            print(f"  {name:28s} {value}")
        one = throughput(dsn, schema, 1, args.seconds)
        eight = throughput(dsn, schema, 8, args.seconds)
        print(f"claim + complete cycles/s, 1 connection:   {one:8.0f}")
        print(f"claim + complete cycles/s, 8 processes:    {eight:8.0f}  ({eight / one:.2f}x)")
        print(f"(machine: {os.cpu_count()} cores, server on the same machine)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
