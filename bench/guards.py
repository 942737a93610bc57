"""Advisory mode and lease mode side by side: round trips, connections, runs/second.

    .venv/bin/python bench/guards.py [--runs 200] [--seconds 3]

Starts a throwaway PostgreSQL (pgcrond.storage.embedded.LocalServer, durable=False).

How round trips are counted: the clients reach the server through a small TCP
proxy that reads the protocol stream. Every exchange in which the client waits
for the server ends with exactly one ReadyForQuery ('Z') message from the
server, and pgcrond pipelines nothing, so 'Z' messages are round trips. The
proxy also counts what the client sent: simple Query ('Q') messages and
extended-protocol Execute ('E') messages. Pools are warmed first so that
connection start-up (which also ends with a 'Z') is not counted. This is
exact, unlike server statistics: pg_stat_database is flushed lazily and
pg_stat_statements would need an extension.

Connections held per running job: jobs run concurrently, each sleeping, and
pg_stat_activity is asked how many backends of the guard's pool sit inside a
transaction or a statement meanwhile.

Runs/second: one connection (pool max_size=1), no proxy, a job that does
nothing, min_hold 0; winner runs use a fresh key or identity each time, loser
runs a key held elsewhere.
"""

from __future__ import annotations

import argparse
import asyncio
import struct
import time
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

import psycopg
from psycopg.conninfo import conninfo_to_dict, make_conninfo

from pgcrond.core.keys import Identity, lock_id
from pgcrond.core.timing import LeaseTiming
from pgcrond.storage.advisory import advisory_lock
from pgcrond.storage.claims import Acquired, NotAcquired
from pgcrond.storage.db import Database
from pgcrond.storage.embedded import throwaway
from pgcrond.storage.leases import LeaseStore
from pgcrond.storage.migrate import migrate

NO_HOLD = timedelta(0)
TIMING = LeaseTiming.build(timedelta(seconds=60))
CONCURRENT_JOBS = 5


@dataclass
class Counts:
    round_trips: int = 0
    queries: int = 0
    executes: int = 0
    connections: int = 0


class CountingProxy:
    """Forwards bytes unchanged and counts protocol messages in both directions."""

    def __init__(self, target_port: int) -> None:
        self.target_port = target_port
        self.counts = Counts()
        self.port = 0

    async def start(self) -> None:
        server = await asyncio.start_server(self._handle, "127.0.0.1", 0)
        self.port = server.sockets[0].getsockname()[1]

    def snapshot(self) -> Counts:
        return Counts(**vars(self.counts))

    async def _handle(self, client_r: asyncio.StreamReader, client_w: asyncio.StreamWriter) -> None:
        server_r, server_w = await asyncio.open_connection("127.0.0.1", self.target_port)
        self.counts.connections += 1
        await asyncio.gather(
            self._pump(client_r, server_w, from_client=True),
            self._pump(server_r, client_w, from_client=False),
        )

    async def _pump(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, *, from_client: bool
    ) -> None:
        try:
            if from_client:
                # The start-up message is the only one without a type byte
                # (TLS and GSS are off in the proxied DSN, so none precedes it).
                length = await reader.readexactly(4)
                writer.write(length + await reader.readexactly(struct.unpack("!I", length)[0] - 4))
            while True:
                header = await reader.readexactly(5)
                kind = header[:1]
                body = await reader.readexactly(struct.unpack("!I", header[1:])[0] - 4)
                if from_client and kind == b"Q":
                    self.counts.queries += 1
                elif from_client and kind == b"E":
                    self.counts.executes += 1
                elif not from_client and kind == b"Z":
                    self.counts.round_trips += 1
                writer.write(header + body)
                await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()


def per_run(before: Counts, after: Counts, runs: int) -> tuple[float, float]:
    """(round trips, client messages) per run."""
    messages = (after.queries - before.queries) + (after.executes - before.executes)
    # A pool may open a connection meanwhile; its start-up ends with a 'Z' too.
    startups = after.connections - before.connections
    return (after.round_trips - before.round_trips - startups) / runs, messages / runs


async def measure(
    proxy: CountingProxy, runs: int, run: Callable[[int], Awaitable[None]]
) -> tuple[float, float]:
    # Warm-up: psycopg prepares a statement on its 5th use, a round trip of its
    # own, once per connection; that is not a cost of each run.
    for n in range(-10, 0):
        await run(n)
    before = proxy.snapshot()
    for n in range(runs):
        await run(n)
    return per_run(before, proxy.snapshot(), runs)


async def rate(seconds: float, run: Callable[[int], Awaitable[None]]) -> float:
    done = 0
    deadline = time.perf_counter() + seconds
    started = time.perf_counter()
    while time.perf_counter() < deadline:
        await run(done)
        done += 1
    return done / (time.perf_counter() - started)


async def held_in_flight(dsn: str, application_name: str) -> tuple[int, int]:
    """(backends of that pool inside a transaction or statement, all its backends)."""
    async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn:
        cursor = await conn.execute(
            "SELECT count(*) FILTER (WHERE state <> 'idle'), count(*) "
            "FROM pg_stat_activity WHERE application_name = %s",
            (application_name,),
        )
        row = await cursor.fetchone()
    assert row is not None
    return int(row[0]), int(row[1])


async def open_db(dsn: str, name: str, max_size: int) -> Database:
    db = Database(dsn, min_size=1, max_size=max_size, application_name=name)
    await db.open()
    await db.fetchone("SELECT 1")  # warm: start-up is not a guarded run's cost
    return db


async def main(runs: int, seconds: float) -> None:
    with throwaway(prefix="pgcrond-bench-") as server:
        await bench(server.dsn, runs, seconds)


async def bench(dsn: str, runs: int, seconds: float) -> None:
    proxy = CountingProxy(int(str(conninfo_to_dict(dsn)["port"])))
    await proxy.start()
    proxied = make_conninfo(dsn, port=proxy.port, sslmode="disable", gssencmode="disable")
    rows: list[tuple[str, str, str]] = []

    # --- round trips per guarded run -------------------------------------
    # Advisory mode holds a connection per running job: a smaller pool would
    # make the jobs beyond its size wait.
    adv = await open_db(proxied, "bench-advisory", CONCURRENT_JOBS + 1)
    store_db = await open_db(proxied, "bench-lease", 4)
    store = LeaseStore(store_db, schema="bench")
    await migrate(store)
    prefix = uuid.uuid4().hex

    async def advisory_win(n: int) -> None:
        async with advisory_lock(adv, f"{prefix}-win-{n}", min_hold=NO_HOLD) as lease:
            assert lease.acquired

    async def advisory_win_within_hold(n: int) -> None:
        # A short job whose hold outlasts it: tick chosen so the hold ends 10 ms on.
        tick = datetime.now(UTC) - timedelta(seconds=5) + timedelta(milliseconds=10)
        async with advisory_lock(adv, f"{prefix}-hold-{n}", tick=tick) as lease:
            assert lease.acquired

    held_key = f"{prefix}-held"
    holder = await psycopg.AsyncConnection.connect(dsn, autocommit=True)
    await holder.execute("SELECT pg_advisory_lock(%s)", (lock_id(held_key),))

    async def advisory_lose(n: int) -> None:
        async with advisory_lock(adv, held_key) as lease:
            assert not lease.acquired

    async def lease_win(n: int) -> None:
        lease = await store.claim(Identity.schedule("bench", f"{prefix}-{n}"), TIMING)
        assert isinstance(lease, Acquired)
        assert await store.complete(lease)

    taken = await store.claim(Identity.schedule("bench", f"{prefix}-held"), TIMING)
    assert isinstance(taken, Acquired)

    async def lease_lose(n: int) -> None:
        refused = await store.claim(Identity.schedule("bench", f"{prefix}-held"), TIMING)
        assert isinstance(refused, NotAcquired)

    trips = {
        "advisory win (min_hold over)": await measure(proxy, runs, advisory_win),
        "advisory win (within min_hold)": await measure(
            proxy, max(runs // 10, 5), advisory_win_within_hold
        ),
        "advisory lose": await measure(proxy, runs, advisory_lose),
        "lease win": await measure(proxy, runs, lease_win),
        "lease lose": await measure(proxy, runs, lease_lose),
    }

    # --- connections held per running job ----------------------------------
    async def advisory_job(n: int) -> None:
        async with advisory_lock(adv, f"{prefix}-conc-{n}", min_hold=NO_HOLD):
            await asyncio.sleep(1.0)

    async def lease_job(n: int) -> None:
        identity = Identity.schedule("bench-conc", f"{prefix}-{n}")
        await store.run_exclusive(identity, lambda lease: asyncio.sleep(1.0), timing=TIMING)

    held: dict[str, tuple[int, int]] = {}
    for name, job, app in (
        ("advisory", advisory_job, "bench-advisory"),
        ("lease", lease_job, "bench-lease"),
    ):
        jobs = [asyncio.create_task(job(n)) for n in range(CONCURRENT_JOBS)]
        await asyncio.sleep(0.5)
        held[name] = await held_in_flight(dsn, app)
        await asyncio.gather(*jobs)

    await adv.close()
    await store_db.close()

    # --- runs per second on one connection, no proxy ---------------------------
    one_adv = await open_db(dsn, "bench-rate-advisory", 1)
    one_store_db = await open_db(dsn, "bench-rate-lease", 1)
    one_store = LeaseStore(one_store_db, schema="bench")

    async def rate_advisory_win(n: int) -> None:
        async with advisory_lock(one_adv, f"{prefix}-rate-{n}", min_hold=NO_HOLD) as lease:
            assert lease.acquired

    async def rate_advisory_lose(n: int) -> None:
        async with advisory_lock(one_adv, held_key) as lease:
            assert not lease.acquired

    async def rate_lease_win(n: int) -> None:
        lease = await one_store.claim(Identity.schedule("bench-rate", f"{prefix}-{n}"), TIMING)
        assert isinstance(lease, Acquired)
        assert await one_store.complete(lease)

    async def rate_lease_lose(n: int) -> None:
        refused = await one_store.claim(Identity.schedule("bench", f"{prefix}-held"), TIMING)
        assert isinstance(refused, NotAcquired)

    rates = {
        "advisory win (min_hold over)": await rate(seconds, rate_advisory_win),
        "advisory lose": await rate(seconds, rate_advisory_lose),
        "lease win": await rate(seconds, rate_lease_win),
        "lease lose": await rate(seconds, rate_lease_lose),
    }
    await one_adv.close()
    await one_store_db.close()
    await holder.close()

    for name, (round_trips, messages) in trips.items():
        per_second = rates.get(name)
        rows.append(
            (
                name,
                f"{round_trips:g} round trips, {messages:g} messages",
                "-" if per_second is None else f"{per_second:,.0f}/s",
            )
        )
    print(f"server: PostgreSQL {await server_version(dsn)}, runs per figure: {runs}")
    print()
    print(f"| {'guarded run':<32} | {'per run (proxy count)':<32} | {'1 connection':>12} |")
    print(f"|{'-' * 34}|{'-' * 34}|{'-' * 13}:|")
    for name, trip, speed in rows:
        print(f"| {name:<32} | {trip:<32} | {speed:>12} |")
    print()
    for name, (busy, total) in held.items():
        print(
            f"{name}: {CONCURRENT_JOBS} jobs running -> {busy} connections held "
            f"({busy / CONCURRENT_JOBS:g} per running job), {total} open in its pool"
        )


async def server_version(dsn: str) -> str:
    async with await psycopg.AsyncConnection.connect(dsn) as conn:
        return conn.info.parameter_status("server_version") or "?"


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--runs", type=int, default=200)
    parser.add_argument("--seconds", type=float, default=3.0)
    arguments = parser.parse_args()
    asyncio.run(main(arguments.runs, arguments.seconds))
