"""A batch's client CPU: what one replica pays per row to claim and record co-firing ticks.

    .venv/bin/python -m bench.claim_batch [--rows 500] [--rounds 20]

``--rows`` identities of one tick are claimed in one statement (the lease
store's turn batch, as a co-firing tick's fires claim) and then recorded
SUCCESS in one; the figure is the process CPU per row of each, best of
``--rounds`` rounds (the least disturbed on a shared machine), against one
throwaway server (PGCROND_BENCH_DSN to use another). The server's own time
is not in it: this is the encoding of parameters, the decoding of rows and
the store's own bookkeeping, with the daemon's collector settings. Compare
two trees by ``PYTHONPATH``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import time
import uuid
from datetime import UTC, datetime, timedelta

from bench.lease_store import server
from pgcrond.core.keys import Identity
from pgcrond.core.timing import LeaseTiming
from pgcrond.daemon import interpreter
from pgcrond.storage.claims import Acquired
from pgcrond.storage.db import Database
from pgcrond.storage.leases import LeaseStore
from pgcrond.storage.migrate import migrate

TIMING = LeaseTiming.build(timedelta(minutes=1))


async def measure(dsn: str, rows: int, rounds: int) -> dict[str, float]:
    db = Database(dsn, min_size=1, max_size=1)
    await db.open()
    store = LeaseStore(db, schema=f"bench_{uuid.uuid4().hex[:8]}")
    await migrate(store)
    codes = [f"job-{n:05d}" for n in range(rows)]
    best = {"claim": float("inf"), "finalize": float("inf")}
    for round_ in range(rounds):
        tick = datetime(2026, 1, 1, tzinfo=UTC) + timedelta(minutes=round_)
        identities = [Identity.schedule(code, tick.isoformat()) for code in codes]
        began = time.process_time()
        won = await asyncio.gather(*(store.claim(one, TIMING) for one in identities))
        claimed = time.process_time()
        leases = [lease for lease in won if isinstance(lease, Acquired)]
        if len(leases) != rows:
            raise SystemExit(f"round {round_}: {len(leases)} of {rows} claims won")
        await asyncio.gather(*(store.complete(lease) for lease in leases))
        recorded = time.process_time()
        best["claim"] = min(best["claim"], claimed - began)
        best["finalize"] = min(best["finalize"], recorded - claimed)
    await db.close()
    return best


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=int, default=500)
    parser.add_argument("--rounds", type=int, default=20)
    args = parser.parse_args()
    interpreter.tune()  # the daemon's collector settings
    interpreter.settle()
    with server() as dsn:
        best = asyncio.run(measure(dsn, args.rows, args.rounds))
    print(
        json.dumps(
            {
                "rows": args.rows,
                "claim_cpu_per_row_us": round(best["claim"] / args.rows * 1e6, 1),
                "finalize_cpu_per_row_us": round(best["finalize"] / args.rows * 1e6, 1),
            }
        )
    )


if __name__ == "__main__":
    main()
