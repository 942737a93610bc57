"""A `/metrics` render at rest: the daemon's registry with N jobs, rendered as Prometheus asks.

    .venv/bin/python -m bench.metrics_render [--jobs 10000] [--rounds 5]

The daemon's own ``Metrics`` with ``--jobs`` jobs (each with an
``alert_after``, half of them with a success recorded, all on one schedule
for the next fire), rendered for Prometheus's ``Accept`` (OpenMetrics) and
gzipped at level 1 as the HTTP server does, on this thread. The figure is
the best round's wall time of the render and of the gzip (the least
disturbed round on a shared machine). Compare two trees by ``PYTHONPATH``,
alternating.
"""

from __future__ import annotations

import argparse
import gzip
import json
import sys
import time
from datetime import UTC, datetime, timedelta

from bench.scale import PROMETHEUS_ACCEPT
from pgcrond.daemon.metrics import Metrics, exposition


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--jobs", type=int, default=10_000)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    metrics = Metrics()
    codes = [f"job-{n:05d}" for n in range(args.jobs)]
    metrics.set_jobs(codes, dict.fromkeys(codes, timedelta(hours=1)))
    tick = datetime.now(UTC)
    metrics.next_fires.follow(lambda: [(codes, tick)])
    for code in codes[::2]:
        metrics.alerts.recorded(code, "success", final=True)
    render, _ = exposition(metrics.registry, PROMETHEUS_ACCEPT)
    renders, zips = [], []
    for _ in range(args.rounds):
        started = time.perf_counter()
        body = render()
        rendered = time.perf_counter()
        packed = gzip.compress(body, compresslevel=1)
        renders.append(rendered - started)
        zips.append(time.perf_counter() - rendered)
    print(
        json.dumps(
            {
                "jobs": args.jobs,
                "render_ms": round(min(renders) * 1000, 1),
                "gzip_ms": round(min(zips) * 1000, 1),
                "bytes": len(body),
                "gzipped_bytes": len(packed),
            }
        )
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
