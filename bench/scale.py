"""Co-firing jobs at scale: one tick of N per-minute jobs on R replicas, judged by the database.

    .venv/bin/python -m bench.scale [--jobs 1000,10000] [--replicas 1,3] [--write-docs]
    .venv/bin/python -m bench.scale --hourly 100000 --replicas 3 [--ticks 2]

Every job is an in-process async entrypoint that returns at once
(``bench.jobs:async_noop``, ``concurrency: allow``), so what is measured is
pgcrond: for each (jobs, replicas) a fresh schema on one throwaway
PostgreSQL, R ``pgcrond run`` replicas, one shared tick, then SIGTERM. Every
figure comes from the lease table by the database's clock (claimed:
``created_at - tick``: negative for a claim won ahead of the tick, whose run
is held until the tick; finished: ``finished_at - tick``), the replicas'
statements of the tick by name (``pg_stat_statements``; the bench reads under
a role of its own, so its own reads are not counted), the replicas' rusage
(CPU for the tick is read from /proc around it; RSS before the tick and
a second after its last run was recorded, max RSS at exit), a
``/metrics`` scrape of replica 0 as Prometheus makes one (gzip) three seconds
before the tick and half a second into it, and each
replica's own loop-stall probe (``loop_stall_max_s`` of ``daemon_stopped``).
Duplicates are ``run_started`` lines beyond one per job.

``--hourly N`` measures the other shape of scale: N per-hour jobs spread
over the hour (job n fires at minute n mod 60), so each minute's tick is N/60
of them while the rest wait. For each replica count: each replica's time from
start to ready, its RSS at rest (4 s before a measured tick, with the
previous minute's tick long over) and its CPU at rest (over the 40 s before
that), then ``--ticks`` consecutive minute ticks, each one's finished p50 /
p99, misses and duplicates by the database clock, and the replicas' CPU for it.

``--steps`` times every step of the replicas' event loops
(``bench/loop_steps``) and adds the longest step and the longest loop turn
seen during the tick: the stall probe's figure is the longest turn (every
step the loop ran between two looks for ready work), not one step.
"""

from __future__ import annotations

import argparse
import gzip
import json
import math
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

from bench.docs import header, load_note, write_docs
from bench.side_by_side import (
    BIN,
    Replica,
    base_env,
    cpu_seconds,
    emit,
    markdown_table,
    percentile,
    profiler,
    progress,
    spawn,
    sql,
    stop,
    wait_ready,
    with_db,
)
from bench.statements import READER, as_reader, count_statements, enable, made, split, statements
from pgcrond.core.schedule import run_key_for
from pgcrond.daemon.registry import SETTLE_S
from pgcrond.testing import LocalServer, throwaway
from pgcrond.tickplan import CLAIM_AHEAD_MAX

# What Prometheus 2.x and 3.x send in a scrape's Accept header.
PROMETHEUS_ACCEPT = (
    "application/openmetrics-text;version=1.0.0,application/openmetrics-text;version=0.0.1;"
    "q=0.75,text/plain;version=0.0.4;q=0.5,*/*;q=0.1"
)

COLUMNS = (
    "jobs",
    "replicas",
    "misses / duplicates",
    "claimed p50 / p99",
    "finished p50 / p99",
    "runs per replica",
    "statements (per 500 jobs per replica)",
    "claims / finalizes / looks / heartbeats / other",
    "CPU for the tick",
    "RSS at rest / after the tick / max",
    "/metrics at rest / during the tick",
    "longest loop stall",
    "start to ready",
)
# With --steps.
STEP_COLUMN = "longest step: CPU (what) / wall; longest turn"
STEPS = Path(__file__).resolve().parent / "loop_steps"


@dataclass
class Figures:
    jobs: int
    replicas: int
    row: dict[str, str]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def rss_mib(pid: int) -> float:
    """Resident memory now (``VmRSS``): at rest before the tick, and after it."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return math.nan


ASYNC_NOOP = "entrypoint: 'bench.jobs:async_noop'"
TRUE = "command: ['true']"


def write_config(
    path: Path, jobs: int, cron: Callable[[int], str], extra: list[str], action: str
) -> None:
    """N jobs, job ``n`` on the schedule ``cron(n)``."""
    lines = [
        "database: {url: '${PGCROND_DATABASE_URL}'}",
        *extra,
        "defaults:",
        "  concurrency: allow",
        "  late_ticks: all",
        "jobs:",
    ]
    lines += [f"  job-{n:05d}: {{cron: '{cron(n)}', {action}}}" for n in range(jobs)]
    path.write_text("\n".join(lines) + "\n")


def at_second(second: int) -> Callable[[int], str]:
    """Every job's schedule: each minute at this second."""
    return lambda _: f"{second} * * * * *"


def fresh_database(server: LocalServer, db: str) -> str:
    """An empty database of the throwaway server: its DSN."""
    sql(server.dsn, f'DROP DATABASE IF EXISTS "{db}"')
    sql(server.dsn, f'CREATE DATABASE "{db}"')
    return with_db(server.dsn, db)


def start_replicas(
    dsn: str, config: Path, env: dict[str, str], replicas: int, logs: str
) -> tuple[list[Replica], list[int], str]:
    """Migrated, then R replicas spawned: them, their HTTP ports, the bench's reader DSN."""
    migrate = [str(BIN / "pgcrond"), "migrate", "-c", str(config)]
    subprocess.run(migrate, env=env, check=True, stdout=subprocess.DEVNULL)
    enable(dsn)
    sql(dsn, f"GRANT USAGE ON SCHEMA pgcrond TO {READER}")
    sql(dsn, f"GRANT SELECT ON pgcrond.leases TO {READER}")
    ports = [free_port() for _ in range(replicas)]
    argv = [str(BIN / "pgcrond"), "run", "-c", str(config), "--log-format", "json", "--http"]
    started = [
        spawn([*argv, f"127.0.0.1:{port}"], env, config.parent / f"{logs}-{n}.log")
        for n, port in enumerate(ports)
    ]
    return started, ports, as_reader(dsn)


def over(reader: str, run_key: str) -> int:
    """Runs of the tick ``run_key`` that are over (whatever their outcome)."""
    return int(
        sql(
            reader,
            "SELECT count(*) FROM pgcrond.leases "
            "WHERE status <> 'RUNNING' AND code LIKE 'job-%%' AND run_key = %s",
            (run_key,),
        )[0][0]
    )


def pair(values: list[float]) -> str:
    if not values:
        return "-"
    return f"{percentile(values, 0.5):,.0f} / {percentile(values, 0.99):,.0f} ms"


def scrape(port: int, at: float, into: dict[str, float]) -> None:
    """One scrape at ``at`` (a scraper's steady state: there was one before, at ``at - 3``)."""
    for moment, kind in ((at - 3, "rest"), (at, "tick")):
        time.sleep(max(0.0, moment - time.time()))
        _scrape_once(port, kind, into)


def _scrape_once(port: int, kind: str, into: dict[str, float]) -> None:
    """A scrape as Prometheus makes it (gzip, OpenMetrics first)."""
    request = urllib.request.Request(
        f"http://127.0.0.1:{port}/metrics",
        headers={"Accept-Encoding": "gzip", "Accept": PROMETHEUS_ACCEPT},
    )
    started = time.monotonic()
    try:
        with urllib.request.urlopen(request, timeout=60) as answer:
            body = answer.read()
            zipped = answer.headers.get("Content-Encoding") == "gzip"
    except OSError as exc:
        progress(f"scrape failed: {exc}")
        return
    into[f"{kind}_seconds"] = time.monotonic() - started
    into["sent"] = len(body)
    into["bytes"] = len(gzip.decompress(body)) if zipped else len(body)


def stall(replica: Replica) -> float:
    for line in replica.log.read_text(errors="replace").splitlines():
        if '"daemon_stopped"' in line:
            return float(json.loads(line).get("loop_stall_max_s") or math.nan)
    return math.nan


def longest_steps(where: Path, pids: list[int], since: float, until: float) -> str:
    """The replicas' longest loop step (its CPU, its wall time) and turn in a window (--steps)."""
    cpu: tuple[float, str] = (0.0, "-")
    wall = turn = 0.0
    for pid in pids:
        path = where / f"steps-{pid}.jsonl"
        if not path.exists():
            continue
        for line in path.read_text().splitlines():
            said = json.loads(line)
            if not since <= said["at"] <= until:
                continue
            if "step_ms" in said:
                cpu = max(cpu, (said["cpu_ms"], said["what"]))
                wall = max(wall, said["step_ms"])
            else:
                turn = max(turn, said["turn_ms"])
    return f"{cpu[0]:,.1f} ({cpu[1]}) / {wall:,.1f} / {turn:,.1f} ms"


def run_started(replica: Replica, run_key: str) -> int:
    """The replica's runs of the bench's tick (an earlier tick fired before it is not counted)."""
    count = 0
    for line in replica.log.read_text(errors="replace").splitlines():
        if '"run_started"' not in line:
            continue
        said = json.loads(line)
        count += said.get("run_key") == run_key and str(said.get("job", "")).startswith("job-")
    return count


def one(
    server: LocalServer,
    workdir: Path,
    jobs: int,
    replicas: int,
    extra: list[str],
    profile: Path | None = None,
    action: str = ASYNC_NOOP,
    steps: bool = False,
) -> Figures:
    db = f"scale_{jobs}_{replicas}"
    dsn = fresh_database(server, db)
    env = base_env(PGCROND_DATABASE_URL=dsn)
    steps_dir = workdir / f"steps-{jobs}-{replicas}"
    if steps:
        steps_dir.mkdir(parents=True, exist_ok=True)
        env.update(PYTHONPATH=f"{env['PYTHONPATH']}:{STEPS}", BENCH_LOOP_STEPS=str(steps_dir))
    # The tick: the first whole minute's second far enough after start-up.
    guess = time.time() + 14 + (1 + jobs / 1500) * max(1.0, replicas / 2) * 1.5
    tick = math.ceil(guess)
    config = workdir / f"scale-{jobs}-{replicas}.yaml"
    write_config(config, jobs, at_second(tick % 60), extra, action)
    progress(f"scale: {jobs} jobs x {replicas} replicas, tick at second {tick % 60}")
    started, ports, reader = start_replicas(dsn, config, env, replicas, f"scale-{jobs}-{replicas}")
    try:
        wait_ready(started, '"daemon_ready"', timeout=300)
        ready = max(r.ready - r.spawned for r in started)
        # Past the registry's settle touch (spread then knows every peer), with
        # room for the scrape before the tick.
        settled = time.time() + SETTLE_S + 2
        if tick < settled:
            tick += 60 * math.ceil((settled - tick) / 60)
            progress(f"scale: ready after the tick; waiting {tick - time.time():.0f}s")
        time.sleep(max(0.0, tick - 4.0 - time.time()))
        before = statements(reader)
        cpu_before = [cpu_seconds(r.pid) for r in started]
        at_rest = max(rss_mib(r.pid) for r in started)
        scraped: dict[str, float] = {}
        scraper = threading.Thread(target=scrape, args=(ports[0], tick + 0.5, scraped))
        scraper.start()
        spy = None
        if profile is not None:
            spy = profiler(started[0].pid, profile / f"scale-{jobs}-{replicas}.txt")
        deadline = tick + 60
        # A replica ready before the first guess fires that tick too: only this one counts.
        run_key = run_key_for(datetime.fromtimestamp(tick, UTC))
        done = 0
        while time.time() < deadline:
            done = over(reader, run_key)
            if time.time() > tick and done >= jobs:
                break
            time.sleep(0.25)
        tick_over = time.time()
        time.sleep(1.0)  # room for a late duplicate to show
        cpu_after = [cpu_seconds(r.pid) for r in started]
        after_tick = max(rss_mib(r.pid) for r in started)
        if spy is not None:
            spy.send_signal(signal.SIGINT)
            spy.wait(60)
        scraper.join()
        after = statements(reader)
        rows = sql(
            reader,
            "SELECT owner, status, extract(epoch FROM created_at) - %s, "
            "extract(epoch FROM finished_at) - %s FROM pgcrond.leases "
            "WHERE code LIKE 'job-%%' AND run_key = %s",
            (tick, tick, run_key),
        )
        stop(started)
        success = [r for r in rows if r[1] == "SUCCESS"]
        claimed = [float(r[2]) * 1000 for r in success]
        finished = [float(r[3]) * 1000 for r in success]
        by_owner: dict[str, int] = {}
        for r in success:
            by_owner[str(r[0])] = by_owner.get(str(r[0]), 0) + 1
        starts = sum(run_started(r, run_key) for r in started)
        tick_made = made(before, after)
        count = sum(tick_made.values())
        chunks = max(1.0, jobs / 500) * replicas

        cpu = [b - a for a, b in zip(cpu_before, cpu_after, strict=True)]
        stalls = [stall(r) for r in started]

        row = {
            "jobs": f"{jobs:,}",
            "replicas": str(replicas),
            "misses / duplicates": f"{jobs - len(success)} / {max(0, starts - jobs)}",
            "claimed p50 / p99": pair(claimed),
            "finished p50 / p99": pair(finished),
            "runs per replica": " / ".join(str(n) for n in sorted(by_owner.values(), reverse=True)),
            "statements (per 500 jobs per replica)": f"{count:,} ({count / chunks:.1f})",
            "claims / finalizes / looks / heartbeats / other": " / ".join(
                f"{calls / chunks:.1f}" for calls in split(tick_made)
            ),
            "CPU for the tick": " / ".join(f"{c:.1f}" for c in cpu) + " s",
            "RSS at rest / after the tick / max": (
                f"{at_rest:.0f} / {after_tick:.0f} / {max(r.max_rss_mib for r in started):.0f} MiB"
            ),
            "/metrics at rest / during the tick": (
                f"{scraped['rest_seconds'] * 1000:,.0f} / {scraped['tick_seconds'] * 1000:,.0f} ms"
                f" ({scraped['sent'] / 1024:,.0f} KiB gzip of {scraped['bytes'] / 1024:,.0f})"
                if "rest_seconds" in scraped and "tick_seconds" in scraped
                else "-"
            ),
            "longest loop stall": f"{max(stalls) * 1000:,.0f} ms",
            "start to ready": f"{ready:.2f} s",
        }
        if steps:
            pids = [r.pid for r in started]
            row[STEP_COLUMN] = longest_steps(
                steps_dir, pids, tick - CLAIM_AHEAD_MAX.total_seconds(), tick_over
            )
    finally:
        # An error on the way (a missing tool, a timeout) must not leave replicas
        # running to load the machine under the next measurement.
        for replica in started:
            if replica.process.poll() is None:
                replica.process.kill()
    progress(f"scale: {row}")
    sql(server.dsn, f'DROP DATABASE IF EXISTS "{db}" WITH (FORCE)')
    return Figures(jobs, replicas, row)


HOURLY_COLUMNS = (
    "jobs",
    "replicas",
    "start to ready",
    "RSS at rest",
    "CPU at rest (40 s)",
    "jobs per tick",
    "finished p50 / p99",
    "misses / duplicates",
    "CPU for the tick",
    "max RSS",
)
# The at-rest window: the 40 s before a measured tick's last 4 s (the previous
# minute's tick 16 s over when it begins).
REST_S = 40.0


def hourly(
    server: LocalServer, workdir: Path, jobs: int, replicas: int, ticks: int, extra: list[str]
) -> Figures:
    """N per-hour jobs, job n at minute n mod 60, on R replicas: start-up, rest, minute ticks."""
    dsn = fresh_database(server, f"hourly_{jobs}_{replicas}")
    env = base_env(PGCROND_DATABASE_URL=dsn)
    config = workdir / f"hourly-{jobs}-{replicas}.yaml"
    write_config(config, jobs, lambda n: f"{n % 60} * * * *", extra, ASYNC_NOOP)
    progress(f"hourly: {jobs} jobs x {replicas} replicas")
    started, _, reader = start_replicas(dsn, config, env, replicas, f"hourly-{jobs}-{replicas}")
    try:
        wait_ready(started, '"daemon_ready"', timeout=600)
        ready = [r.ready - r.spawned for r in started]
        # The first measured tick: the registry settled before its at-rest window.
        rest_from = max(r.ready for r in started) + SETTLE_S
        first = 60 * math.ceil((rest_from + REST_S + 4) / 60)
        progress(f"hourly: ready in {max(ready):.1f}s; first tick in {first - time.time():.0f}s")
        time.sleep(max(0.0, first - 4 - REST_S - time.time()))
        cpu_rest = [cpu_seconds(r.pid) for r in started]
        time.sleep(max(0.0, first - 4 - time.time()))
        cpu_rest = [cpu_seconds(r.pid) - c for r, c in zip(started, cpu_rest, strict=True)]
        at_rest = [rss_mib(r.pid) for r in started]
        per_tick: list[tuple[int, list[float], int, float]] = []
        for tick in range(first, first + 60 * ticks, 60):
            minute = tick // 60 % 60
            due = len(range(minute, jobs, 60))
            run_key = run_key_for(datetime.fromtimestamp(tick, UTC))
            time.sleep(max(0.0, tick - 2 - time.time()))
            cpu_before = sum(cpu_seconds(r.pid) for r in started)
            while time.time() < tick + 55 and (time.time() < tick or over(reader, run_key) < due):
                time.sleep(0.25)
            time.sleep(1.0)  # room for a late duplicate to show
            cpu = sum(cpu_seconds(r.pid) for r in started) - cpu_before
            rows = sql(
                reader,
                "SELECT extract(epoch FROM finished_at) - %s FROM pgcrond.leases "
                "WHERE code LIKE 'job-%%' AND run_key = %s AND status = 'SUCCESS'",
                (tick, run_key),
            )
            starts = sum(run_started(r, run_key) for r in started)
            per_tick.append((due, [float(r[0]) * 1000 for r in rows], starts, cpu))
        stop(started)
    finally:
        for replica in started:
            if replica.process.poll() is None:
                replica.process.kill()
    row = {
        "jobs": f"{jobs:,}",
        "replicas": str(replicas),
        "start to ready": " / ".join(f"{s:.1f}" for s in ready) + " s",
        "RSS at rest": " / ".join(f"{m:.0f}" for m in at_rest) + " MiB",
        "CPU at rest (40 s)": " / ".join(f"{c:.2f}" for c in cpu_rest) + " s",
        "jobs per tick": " / ".join(f"{due:,}" for due, *_ in per_tick),
        "finished p50 / p99": "; ".join(pair(done) for _, done, _, _ in per_tick),
        "misses / duplicates": "; ".join(
            f"{due - len(done)} / {max(0, starts - due)}" for due, done, starts, _ in per_tick
        ),
        "CPU for the tick": " / ".join(f"{cpu:.1f}" for *_, cpu in per_tick) + " s",
        "max RSS": " / ".join(f"{r.max_rss_mib:.0f}" for r in started) + " MiB",
    }
    progress(f"hourly: {row}")
    sql(server.dsn, f'DROP DATABASE IF EXISTS "hourly_{jobs}_{replicas}" WITH (FORCE)')
    return Figures(jobs, replicas, row)


def counts(text: str) -> list[int]:
    return [int(part) for part in text.split(",")]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--jobs", type=counts, default=[100, 1000, 10000])
    parser.add_argument("--replicas", type=counts, default=[1, 3, 6])
    parser.add_argument("--profile", type=Path, help="py-spy replica 0 into this directory")
    parser.add_argument(
        "--commands", action="store_true", help="command: ['true'] instead of the async no-op"
    )
    parser.add_argument(
        "--steps",
        action="store_true",
        help="time every loop step of the replicas (bench/loop_steps)",
    )
    parser.add_argument("--keep", type=Path, help="write the replicas' logs and configs here")
    parser.add_argument("--write-docs", action="store_true", help="rewrite docs/performance.md")
    parser.add_argument(
        "--set", action="append", default=[], help="a top-level config line, e.g. 'spread: 0'"
    )
    parser.add_argument(
        "--hourly", type=int, help="N per-hour jobs spread over the hour instead of one tick"
    )
    parser.add_argument("--ticks", type=int, default=2, help="minute ticks measured (--hourly)")
    args = parser.parse_args()
    if args.profile is not None and not (BIN / "py-spy").exists():
        parser.error("--profile records with py-spy: .venv/bin/pip install py-spy, then run again")
    if args.profile is not None:
        args.profile.mkdir(parents=True, exist_ok=True)
    load = load_note()
    rows = []
    with throwaway() as server:
        count_statements(server)
        workdir = args.keep or Path(server.data_dir).parent / "bench-scale"
        workdir.mkdir(parents=True, exist_ok=True)
        if args.hourly is not None:
            for replicas in args.replicas:
                rows.append(
                    hourly(server, workdir, args.hourly, replicas, args.ticks, args.set).row
                )
        else:
            for jobs in args.jobs:
                for replicas in args.replicas:
                    action = TRUE if args.commands else ASYNC_NOOP
                    figures = one(
                        server, workdir, jobs, replicas, args.set, args.profile, action, args.steps
                    )
                    rows.append(figures.row)
        columns: tuple[str, ...] = (*COLUMNS, STEP_COLUMN) if args.steps else COLUMNS
        if args.hourly is not None:
            columns = HOURLY_COLUMNS
        emit(rows, columns)
        if args.write_docs:
            command = "bench.scale " + " ".join(sys.argv[1:])
            body = header(server.dsn, f".venv/bin/python -m {command}", load)
            section = "scale-commands" if args.commands else "scale-tick"
            section = "scale-hourly" if args.hourly is not None else section
            write_docs(section, body + "\n" + markdown_table(rows, columns, columns))
    return 0


if __name__ == "__main__":
    sys.exit(main())
