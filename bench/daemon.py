"""Daemon under load: fire lateness, statements per fire, idle queries, RSS and CPU.

    .venv/bin/python bench/daemon.py [--jobs 100] [--replicas 3] [--seconds 60] [--idle 60]

Starts a throwaway PostgreSQL and N ``pgcrond run`` replicas on one config of
per-second jobs whose action is a no-op entrypoint, so what is measured is
pgcrond itself. Lateness is each run's start minus its tick's intended fire
time (the ``lateness_ms`` of ``run_started``). Statements are counted by the
server (pg_stat_database transactions; every pgcrond statement is one
autocommit transaction), read after the replicas exited so that every backend
has flushed its counters. The idle phase runs the same replicas on jobs that
never fire in the window and counts every statement the server logs
(``log_statement = all``) meanwhile.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import time
from pathlib import Path

import psycopg

from pgcrond.storage.embedded import throwaway

ROOT = Path(__file__).resolve().parent.parent
PGCROND = Path(sys.executable).parent / "pgcrond"


def write_config(path: Path, jobs: int, cron: str, lease: str | None) -> None:
    lines = ["database: {url: '${PGCROND_DATABASE_URL}'}", "jobs:"]
    if lease:
        lines[1:1] = ["defaults:", f"  lease: {lease}"]
    lines += [
        f"  job-{n:03d}: {{cron: '{cron}', entrypoint: 'bench.jobs:noop'}}" for n in range(jobs)
    ]
    path.write_text("\n".join(lines) + "\n")


def transactions(dsn: str) -> int:
    with psycopg.connect(dsn, autocommit=True) as conn:
        row = conn.execute(
            "SELECT xact_commit + xact_rollback FROM pg_stat_database "
            "WHERE datname = current_database()"
        ).fetchone()
    assert row is not None
    return int(row[0])


def start(
    config: Path, count: int, workdir: Path, dsn: str, tag: str
) -> list[tuple[subprocess.Popen[bytes], Path]]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("PGCROND_")}
    env.update(PGCROND_DATABASE_URL=dsn, PYTHONPATH=str(ROOT))
    replicas = []
    for n in range(count):
        log = workdir / f"{tag}-{n}.log"
        with log.open("wb") as out:
            process = subprocess.Popen(
                [str(PGCROND), "run", "-c", str(config), "--http", "", "--log-format", "json"],
                stdout=out,
                stderr=out,
                env=env,
                cwd=ROOT,
            )
        replicas.append((process, log))
    for _, log in replicas:
        deadline = time.monotonic() + 60
        # Ready, and start-up work (the scan for missed ticks) over.
        while '"catch_up_scan_done"' not in log.read_text():
            if time.monotonic() > deadline:
                raise SystemExit(f"replica did not start:\n{log.read_text()[-2000:]}")
            time.sleep(0.1)
    return replicas


def usage(pid: int) -> tuple[float, float]:
    """(RSS in MiB, CPU seconds) of a process, from /proc."""
    rss_kib = next(
        int(line.split()[1])
        for line in Path(f"/proc/{pid}/status").read_text().splitlines()
        if line.startswith("VmRSS:")
    )
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    ticks = int(fields[11]) + int(fields[12])
    return rss_kib / 1024, ticks / os.sysconf("SC_CLK_TCK")


def stop(replicas: list[tuple[subprocess.Popen[bytes], Path]]) -> None:
    for process, _ in replicas:
        process.send_signal(signal.SIGTERM)
    for process, _ in replicas:
        if process.wait(60) != 0:
            raise SystemExit(f"replica exited with {process.returncode}")


def percentile(values: list[float], q: float) -> float:
    return statistics.quantiles(values, n=1000)[int(q * 1000) - 1] if len(values) > 1 else values[0]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=100)
    parser.add_argument("--replicas", type=int, default=3)
    parser.add_argument("--seconds", type=float, default=60)
    parser.add_argument("--idle", type=float, default=60)
    parser.add_argument(
        "--lease",
        help="the jobs' lease (default: the config default, 1m); losers re-check a tick "
        "once its holder's lease could have expired, so a window longer than the lease "
        "also counts those re-checks",
    )
    args = parser.parse_args()
    with throwaway(max_connections=200, prefix="pgcrond-bench-") as server:
        scratch = server.data_dir.parent
        dsn = server.dsn
        busy = scratch / "busy.yaml"
        write_config(busy, args.jobs, "* * * * * *", args.lease)
        print(
            f"load: {args.replicas} replicas x {args.jobs} per-second jobs, {args.seconds:g} s, "
            f"lease {args.lease or '1m (the default)'}",
            flush=True,
        )
        before = transactions(dsn)
        replicas = start(busy, args.replicas, scratch, dsn, "busy")
        started = time.monotonic()
        time.sleep(args.seconds)
        elapsed = time.monotonic() - started
        stats = [usage(process.pid) for process, _ in replicas]
        stop(replicas)
        statements = transactions(dsn) - before - 1
        lateness: list[float] = []
        for _, log in replicas:
            for line in log.read_text().splitlines():
                if '"run_started"' in line:
                    lateness.append(json.loads(line)["lateness_ms"])
        with psycopg.connect(dsn, autocommit=True) as conn:
            row = conn.execute(
                "SELECT count(*), count(DISTINCT lock_key) FROM pgcrond.leases "
                "WHERE code LIKE 'job-%'"
            ).fetchone()
        assert row is not None
        ticks, distinct = row
        fires = ticks * args.replicas
        print(f"  ticks run: {ticks} (distinct {distinct}: duplicates {ticks - distinct})")
        print(
            f"  fire lateness ms: p50 {percentile(lateness, 0.5):.1f}  "
            f"p99 {percentile(lateness, 0.99):.1f}  max {max(lateness):.1f}"
        )
        print(
            f"  statements: {statements} = {statements / ticks:.2f} per tick, "
            f"{statements / fires:.2f} per fire ({args.replicas} fires per tick)"
        )
        for n, (rss, cpu) in enumerate(stats):
            print(f"  replica {n}: RSS {rss:.0f} MiB, CPU {100 * cpu / elapsed:.0f}% of a core")

        idle = scratch / "idle.yaml"
        write_config(idle, args.jobs, "0 0 1 1 *", args.lease)
        replicas = start(idle, args.replicas, scratch, dsn, "idle")
        # The server logs every statement from here on; the window starts
        # once the replicas are up, and ends before they are stopped.
        with psycopg.connect(dsn, autocommit=True) as conn:
            conn.execute("ALTER SYSTEM SET log_statement = 'all'")
            conn.execute("SELECT pg_reload_conf()")
        time.sleep(1)
        mark = server.log_file.stat().st_size
        time.sleep(args.idle)
        with server.log_file.open(errors="replace") as server_log:
            server_log.seek(mark)
            logged = [line for line in server_log if "statement: " in line or "execute " in line]
        stop(replicas)
        print(
            f"idle: {args.replicas} replicas x {args.jobs} jobs that do not fire, "
            f"{args.idle:g} s: {len(logged)} statements logged by the server "
            f"({60 * len(logged) / args.idle:.1f} per minute)"
        )
        for line in logged[:5]:
            print("   ", line.strip()[:160])
    return 0


if __name__ == "__main__":
    sys.exit(main())
