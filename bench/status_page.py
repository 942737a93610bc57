"""Status page: response time with 1,000 jobs and a month of history.

    .venv/bin/python -m bench.status_page [--requests 30]

Generates, in one throwaway PostgreSQL (PGCROND_BENCH_DSN to use another):
1,000 jobs, of which 5 fire every minute and 995 once a day, with 30 days of
history each (5 x 43,200 + 995 x 30 = 245,850 rows): 96 % SUCCESS, 3 % FAIL
with an error text, 1 % SKIPPED, and every 500th tick left without a row (a
gap); plus 5 RUNNING rows. Then serves the status page the way the daemon does
(the same HTTP server, in-process, on loopback) and times whole HTTP requests
(connect, request, full response) for each view: the first (cold: the page's
schedule memo is empty) and then ``--requests`` more, reporting median, p95
and max.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from urllib.parse import quote

import psycopg

from pgcrond.config.loader import load_config
from pgcrond.daemon.http import HealthServer
from pgcrond.daemon.metrics import Metrics
from pgcrond.daemon.status_page import StatusPage
from pgcrond.storage.db import Database
from pgcrond.storage.embedded import throwaway
from pgcrond.storage.leases import LeaseStore
from pgcrond.storage.migrate import migrate

MINUTELY = 5
DAILY = 995
DAYS = 30


@contextmanager
def server() -> Iterator[str]:
    if dsn := os.environ.get("PGCROND_BENCH_DSN"):
        yield dsn
        return
    with throwaway(max_connections=50, prefix="pgcrond-bench-") as local:
        yield local.dsn


def config_text() -> str:
    lines = ["database: {schema: bench_status}", "defaults: {timezone: UTC}", "jobs:"]
    for n in range(MINUTELY):
        lines.append(f'  minutely-{n:02d}: {{cron: "* * * * *", command: ["/bin/true"]}}')
    for n in range(DAILY):
        lines.append(
            f'  daily-{n:03d}: {{cron: "{n % 60} {n % 24} * * *", command: ["/bin/true"], '
            f'description: "Daily job number {n}"}}'
        )
    return "\n".join(lines) + "\n"


GENERATE = """
INSERT INTO bench_status.leases (lock_key, type, code, run_key, status, owner_token, owner,
    attempt, fencing_token, lease_ms, created_at, acquired_at, heartbeat_at, expires_at,
    finished_at, retry_at, reason, error)
SELECT 'bench:' || code || ':' || to_char(tick, 'YYYY-MM-DD"T"HH24:MI:SS"Z"'), 'SCHEDULE', code,
       to_char(tick, 'YYYY-MM-DD"T"HH24:MI:SS"Z"'),
       CASE WHEN r < 0.96 THEN 'SUCCESS' WHEN r < 0.99 THEN 'FAIL' ELSE 'SKIPPED' END,
       gen_random_uuid(), 'host-' || (n %% 3) || ':' || (1000 + n %% 3), 1,
       nextval('bench_status.leases_fencing_seq'), 60000, tick, tick, tick,
       tick + interval '1 minute', tick + (0.2 + r * 2) * interval '1 second', NULL,
       CASE WHEN r < 0.96 THEN NULL WHEN r < 0.99 THEN 'error' ELSE 'overlap' END,
       CASE WHEN r >= 0.96 AND r < 0.99 THEN 'exit status 3: <stderr tail>' END
FROM (
    SELECT code, tick, n, random() AS r
    FROM unnest(%(codes)s::text[], %(steps)s::interval[], %(offsets)s::interval[])
             AS j (code, step, offset_in_day),
         LATERAL generate_series(
             date_trunc('day', now()) - %(days)s * interval '1 day' + offset_in_day,
             now() - interval '1 minute', step) WITH ORDINALITY AS g (tick, n)
) ticks
WHERE n %% 500 <> 0
"""

RUNNING = """
INSERT INTO bench_status.leases (lock_key, type, code, run_key, status, owner_token, owner,
    attempt, fencing_token, lease_ms, created_at, acquired_at, heartbeat_at, expires_at)
SELECT 'bench:' || code || ':now', 'SCHEDULE', code, 'now', 'RUNNING', gen_random_uuid(),
       'host-0:1000', 1, nextval('bench_status.leases_fencing_seq'), 60000,
       now(), now(), now(), now() + interval '1 minute'
FROM unnest(%(codes)s::text[]) AS code
"""


async def fetch(port: int, path: str, accept: str) -> tuple[int, int]:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(f"GET {path} HTTP/1.1\r\nHost: b\r\nAccept: {accept}\r\n\r\n".encode())
    await writer.drain()
    response = await reader.read()
    writer.close()
    await writer.wait_closed()
    return int(response.split(b" ", 2)[1]), len(response)


async def bench(dsn: str, requests: int) -> None:
    scratch = Path(tempfile.mkdtemp(prefix="pgcrond-bench-status-"))
    path = scratch / "jobs.yaml"
    path.write_text(config_text())
    config = load_config([str(path)], database_url=dsn)
    db = Database(dsn, min_size=1, max_size=4)
    await db.open()
    store = LeaseStore(db, schema="bench_status")
    await migrate(store)
    codes = list(config.jobs)
    steps = ["1 minute"] * MINUTELY + ["1 day"] * DAILY
    started = time.perf_counter()
    with psycopg.connect(dsn, autocommit=True) as conn:
        # Daily job n fires at n % 24 : n % 60 (UTC); its ticks are generated there.
        offsets = ["0 minutes"] * MINUTELY + [
            f"{n % 24} hours {n % 60} minutes" for n in range(DAILY)
        ]
        conn.execute(GENERATE, {"codes": codes, "steps": steps, "offsets": offsets, "days": DAYS})
        conn.execute(RUNNING, {"codes": codes[MINUTELY : MINUTELY + 5]})
        conn.execute("ANALYZE bench_status.leases")
        row = conn.execute("SELECT count(*) FROM bench_status.leases").fetchone()
    assert row is not None
    print(
        f"history: {len(codes)} jobs ({MINUTELY} per-minute, {DAILY} daily), {DAYS} days, "
        f"{row[0]:,} rows (generated in {time.perf_counter() - started:.1f}s)"
    )
    page = StatusPage(config=lambda: config, store=lambda: store, replica="bench:1")
    http = HealthServer(
        "127.0.0.1:0",
        health=lambda: True,
        ready=lambda: asyncio.sleep(0, True),
        registry=Metrics().registry,
        status_page=page,
    )
    await http.start()
    views = [
        ("jobs view (HTML)", "/status", "text/html"),
        ("jobs view (JSON)", "/status.json", "application/json"),
        ("jobs view, page 10 (HTML)", "/status/page/10", "text/html"),
        ("a per-minute job's page", f"/status/jobs/{quote('minutely-00')}", "text/html"),
        ("a daily job's page", f"/status/jobs/{quote('daily-007')}", "text/html"),
        ("running now", "/status/running", "text/html"),
        ("replicas", "/status/replicas", "text/html"),
    ]
    print(f"{'view':<28}{'first':>9}{'median':>9}{'p95':>9}{'max':>9}{'size':>11}")
    try:
        for name, target, accept in views:
            times = []
            size = 0
            for _ in range(requests + 1):
                t0 = time.perf_counter()
                status, size = await fetch(http.port, target, accept)
                times.append((time.perf_counter() - t0) * 1000)
                assert 200 == status, (target, status)
            first, rest = times[0], sorted(times[1:])
            p95 = rest[max(0, round(0.95 * len(rest)) - 1)]
            print(
                f"{name:<28}{first:>7.1f}ms{statistics.median(rest):>7.1f}ms{p95:>7.1f}ms"
                f"{rest[-1]:>7.1f}ms{size / 1024:>8.0f} KiB"
            )
    finally:
        await http.stop()
        await db.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--requests", type=int, default=30, help="timed requests per view")
    args = parser.parse_args()
    with server() as dsn:
        asyncio.run(bench(dsn, args.requests))


if __name__ == "__main__":
    main()
