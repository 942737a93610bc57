"""Do server-side prepared statements win claim throughput back behind PgBouncer?

    .venv/bin/python -m bench.prepared [--seconds 4] [--rounds 4]

Claim + complete cycles per second on one connection (the lease store's own
statements, distinct identities), for each path to one throwaway server:
direct, through PgBouncer in session and in transaction pooling, each with
psycopg's server-side preparing off (pgcrond's default, ``prepare_threshold``
None: every statement is parsed and planned again) and on (prepared on first
use, then only Bind/Execute). The variants take turns in ``--rounds`` slices
so that load from elsewhere on the machine hits them alike.

PgBouncer in transaction pooling keeps prepared statements working only from
1.21 on (``max_prepared_statements``). Older ones hand a client's next
transaction to a server connection that never saw its Parse; the last part
shows what two clients then get. Session pooling pins one server connection
per client, so its prepared figure is what a PgBouncer >= 1.21 can give at
best in transaction pooling (it adds its own statement bookkeeping).
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import time
import uuid
from datetime import timedelta

import psycopg

from pgcrond.core.keys import Identity
from pgcrond.core.timing import LeaseTiming
from pgcrond.storage.claims import Acquired
from pgcrond.storage.db import Database
from pgcrond.storage.leases import LeaseStore
from pgcrond.storage.migrate import migrate
from pgcrond.testing import throwaway
from tests.helpers import pgbouncer as bouncer

TIMING = LeaseTiming.build(timedelta(minutes=5))


async def open_store(dsn: str, schema: str, prepared: bool) -> LeaseStore:
    db = Database(dsn, min_size=1, max_size=1)
    await db.open()
    async with db.connection() as conn:
        # The pool has one connection: this is the one every claim uses.
        conn.prepare_threshold = 0 if prepared else None
    store = LeaseStore(db, schema=schema)
    await migrate(store)
    return store


async def cycles(store: LeaseStore, seconds: float, tag: str) -> int:
    done = 0
    deadline = time.perf_counter() + seconds
    while time.perf_counter() < deadline:
        lease = await store.claim(Identity.schedule("bench", f"{tag}-{done}"), TIMING)
        assert isinstance(lease, Acquired)
        assert await store.complete(lease)
        done += 1
    return done


async def measure(paths: dict[str, str], schema: str, seconds: float, rounds: int) -> None:
    variants = [(name, prepared) for name in paths for prepared in (False, True)]
    stores = {v: await open_store(paths[v[0]], schema, v[1]) for v in variants}
    for store in stores.values():  # warm-up: connection, first Parse, plan cache
        await cycles(store, 0.3, f"warm-{uuid.uuid4()}")
    totals = dict.fromkeys(variants, 0)
    for n in range(rounds):
        for variant, store in stores.items():
            totals[variant] += await cycles(store, seconds / rounds, f"{n}-{uuid.uuid4()}")
    base = totals[(next(iter(paths)), False)]
    print("| path                       | prepared | cycles/s | vs direct, unprepared |")
    print("|----------------------------|----------|---------:|----------------------:|")
    for (name, prepared), total in totals.items():
        print(
            f"| {name:26s} | {'on' if prepared else 'off':8s} | {total / seconds:8,.0f} |"
            f" {total / base:20.2f}x |"
        )
    for store in stores.values():
        await store.db.close()


def two_clients_prepared(dsn: str, schema: str) -> str:
    """Two clients with preparing on, taking turns behind transaction pooling."""
    query = f'SELECT count(*) FROM "{schema}".leases WHERE code = %s'
    conns = [psycopg.connect(dsn, autocommit=True, prepare_threshold=0) for _ in range(2)]
    try:
        for n in range(20):
            conns[n % 2].execute(query, ("bench",)).fetchone()
    except psycopg.Error as exc:
        return f"fails after {n} statements: {type(exc).__name__}: {str(exc).splitlines()[0]}"
    finally:
        for conn in conns:
            conn.close()
    return "works"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=4.0, help="per variant")
    parser.add_argument("--rounds", type=int, default=4)
    args = parser.parse_args()
    if bouncer.binary() is None:
        print("pgbouncer is not installed (apt-get install pgbouncer)")
        return 1
    schema = f"bench_{uuid.uuid4().hex[:8]}"
    with (
        throwaway(prefix="pgcrond-bench-") as server,
        bouncer.pgbouncer(server, "session") as session,
        bouncer.pgbouncer(server, "transaction") as transaction,
    ):
        with psycopg.connect(server.dsn) as conn:
            version = conn.execute("SELECT version()").fetchone()
        print(f"server: {version[0] if version else '?'}")
        print(f"pooler: {bouncer.version()}, {args.seconds:g} s per variant\n")
        paths = {
            "direct": server.dsn,
            "PgBouncer session": session.dsn,
            "PgBouncer transaction": transaction.dsn,
        }
        asyncio.run(measure(paths, schema, args.seconds, args.rounds))
        print(
            f"\n{bouncer.version()}, transaction pooling, two clients with preparing on: "
            f"{two_clients_prepared(transaction.dsn, schema)}"
        )
        print(f"same, session pooling: {two_clients_prepared(session.dsn, schema)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
