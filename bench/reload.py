"""A reload at scale: how long one replica's loop is held when N jobs are reloaded.

    .venv/bin/python -m bench.reload [--jobs 1000,10000] [--write-docs]

For each N: one ``pgcrond run`` replica on N per-minute jobs (bench.scale's
config), then two SIGHUPs: the same file again (nothing changed), and a file
in which every job's schedule changed (every job regrouped, its metrics and
its registry entry made anew). The figure is the reload's own time on the
loop, as the replica says it in ``config_reloaded`` (``loop_ms``: the file
is read on a thread, and is not counted), beside its wall time from SIGHUP
to that line.
"""

from __future__ import annotations

import argparse
import json
import signal
import subprocess
import sys
import time
from pathlib import Path

from bench.docs import header, load_note, write_docs
from bench.scale import ASYNC_NOOP, at_second, counts, write_config
from bench.side_by_side import (
    BIN,
    base_env,
    emit,
    markdown_table,
    progress,
    spawn,
    sql,
    stop,
    wait_ready,
    with_db,
)
from pgcrond.testing import LocalServer, throwaway

COLUMNS = ("jobs", "reload", "loop time", "SIGHUP to reloaded", "start to ready")


def reloaded_lines(log: Path) -> list[dict[str, object]]:
    return [
        json.loads(line)
        for line in log.read_text(errors="replace").splitlines()
        if '"config_reloaded"' in line
    ]


def one(server: LocalServer, workdir: Path, jobs: int) -> list[dict[str, str]]:
    db = f"reload_{jobs}"
    sql(server.dsn, f'DROP DATABASE IF EXISTS "{db}"')
    sql(server.dsn, f'CREATE DATABASE "{db}"')
    env = base_env(PGCROND_DATABASE_URL=with_db(server.dsn, db))
    config = workdir / f"reload-{jobs}.yaml"
    # Second 30 of each minute: no tick fires during the reloads' seconds.
    write_config(config, jobs, at_second(30), [], ASYNC_NOOP)
    subprocess.run([str(BIN / "pgcrond"), "migrate", "-c", str(config)], env=env, check=True)
    argv = [str(BIN / "pgcrond"), "run", "-c", str(config), "--log-format", "json"]
    replica = spawn(argv, env, workdir / f"reload-{jobs}.log")
    rows = []
    try:
        wait_ready([replica], '"daemon_ready"', timeout=300)
        ready = replica.ready - replica.spawned
        for name, second in (("nothing changed", 30), ("every schedule changed", 31)):
            write_config(config, jobs, at_second(second), [], ASYNC_NOOP)
            seen = len(reloaded_lines(replica.log))
            sent = time.monotonic()
            replica.process.send_signal(signal.SIGHUP)
            while len(reloaded_lines(replica.log)) == seen:
                if time.monotonic() - sent > 120:
                    raise SystemExit(f"no config_reloaded within 120 s ({jobs} jobs)")
                time.sleep(0.05)
            wall = time.monotonic() - sent
            line = reloaded_lines(replica.log)[-1]
            row = {
                "jobs": f"{jobs:,}",
                "reload": name,
                "loop time": f"{line['loop_ms']} ms",
                "SIGHUP to reloaded": f"{wall:.2f} s",
                "start to ready": f"{ready:.2f} s",
            }
            progress(f"reload: {row}")
            rows.append(row)
    finally:
        stop([replica])
        sql(server.dsn, f'DROP DATABASE IF EXISTS "{db}" WITH (FORCE)')
    return rows


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--jobs", type=counts, default=[1000, 10000])
    parser.add_argument("--write-docs", action="store_true", help="rewrite docs/performance.md")
    args = parser.parse_args()
    load = load_note()
    rows = []
    with throwaway() as server:
        workdir = Path(server.data_dir).parent / "bench-reload"
        workdir.mkdir(parents=True, exist_ok=True)
        for jobs in args.jobs:
            rows += one(server, workdir, jobs)
        emit(rows, COLUMNS)
        if args.write_docs:
            command = " ".join([".venv/bin/python -m bench.reload", *sys.argv[1:]])
            body = header(server.dsn, command, load)
            write_docs("reload", body + "\n" + markdown_table(rows, COLUMNS, COLUMNS))
    return 0


if __name__ == "__main__":
    sys.exit(main())
