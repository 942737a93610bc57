"""A log line's CPU: what the loop pays for each line a run says (``run_started`` and the end).

    .venv/bin/python -m bench.log_line [--lines 20000] [--rounds 5] [--to pipe|devnull]

The daemon's own log set-up (``pgcrond.logs.configure("json")``), a logger
bound as a run's is, and ``--lines`` lines with a ``run_started``'s fields said
in one loop turn, as a big tick's runs say theirs; then the turn ends and what
waits is written. The figure is the best round's CPU of the loop's thread
per line (the least disturbed round on a shared machine). ``--to pipe``
(the default) writes into a pipe that another thread drains, as a supervisor
reads a replica's stderr; ``--to devnull`` leaves the reader out. Compare
two trees by ``PYTHONPATH``, alternating.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import threading
import time
from typing import TextIO

import structlog

from pgcrond import logs


def drained_pipe() -> TextIO:
    """The write end of a pipe whose read end a daemon thread empties."""
    read, write = os.pipe()

    def drain() -> None:
        while os.read(read, 1 << 16):
            pass

    threading.Thread(target=drain, daemon=True).start()
    return os.fdopen(write, "w")


async def one_round(lines: int) -> float:
    """CPU seconds of this thread to say ``lines`` lines in one turn and write them out."""
    log = structlog.get_logger("pgcrond.fire").bind(
        job="job-1234",
        run_key="2026-12-04T17:00:00Z",
        idempotency_key="v2:or7kevZEfjLdl1ehBiQdplaVKEH-3B0JAcu2PCVsm0g",
        attempt=1,
        replica="host:1234-5a1b2c",
    )
    began = time.thread_time()
    for _ in range(lines):
        log.info(
            "run_started",
            guard="lease",
            tick="2026-12-04T17:00:00+00:00",
            lateness_ms=12.5,
            fencing_token=123456,
            claimed_from=None,
        )
    await asyncio.sleep(0)  # the turn ends: what waits is written
    await asyncio.sleep(0)
    return time.thread_time() - began


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--lines", type=int, default=20000)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--to", choices=("pipe", "devnull"), default="pipe")
    args = parser.parse_args()
    sink = drained_pipe() if args.to == "pipe" else open(os.devnull, "w")  # noqa: SIM115
    stderr, sys.stderr = sys.stderr, sink
    try:
        logs.configure("json", "info")
    finally:
        sys.stderr = stderr
    best = min(asyncio.run(one_round(args.lines)) for _ in range(args.rounds))
    print(
        json.dumps(
            {
                "lines": args.lines,
                "to": args.to,
                "cpu_per_line_us": round(best / args.lines * 1e6, 2),
            }
        )
    )


if __name__ == "__main__":
    main()
