"""The fault suite, long form: invariant violations per fault kind.

    .venv/bin/python -m bench.faults --duration 600 --seed N [--ref HEAD] [--keep DIR]

Runs tests/faults/nemesis.py (three real replicas through the fault proxy, a
throwaway PostgreSQL of its own, entrypoint, command and ``sql:`` jobs, a seeded
schedule of kills, SIGSTOPs, server restarts, connection cuts, partitions,
blackholes, clock skew and pause/resume, with detached requests) for
``--duration`` seconds, lets the cluster settle, and checks the ledger, the
requests and the replicas' logs (crashed fires) against the lease table
(tests/faults/checker.py). Progress goes to stderr. The table
goes to stdout: aligned text on a terminal, otherwise one JSON line per fault
kind (``"fault": "none"``: violations near no fault; ``"total"``: all), then
one JSON line per kind of violation with its first example (``--examples``
adds the replicas' log lines about it). Exit status 1 when a defect was found
(the lease's inherent limits, ``checker.INHERENT``, are reported only).
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

from tests.faults import checker, nemesis


def progress(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


def main() -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--duration", type=float, default=600.0, help="seconds of faults")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument(
        "--ref", help="run the replicas on the package as committed at this git ref"
    )
    parser.add_argument("--keep", type=Path, help="keep logs and rows in this directory")
    parser.add_argument(
        "--examples", type=int, default=0, help="log lines to show per example violation"
    )
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="pgcrond-faults-") as scratch:
        workdir = args.keep or Path(scratch)
        observations = nemesis.run(args.duration, args.seed, workdir, progress, args.ref)
        report = observations.check()
        tty = sys.stdout.isatty()
        if tty:
            print(checker.table_text(report))
            print(
                f"\nseed {args.seed}, {args.duration:g}s: {report.ticks_checked} ticks checked, "
                f"{report.effects} effects, {len(observations.requests)} requests, "
                f"{len(observations.pauses)} pauses, {len(report.violations)} violations "
                f"({report.total('crashed_fire')} crashed fires)"
            )
        else:
            for row in report.rows():
                print(json.dumps(row))
        for kind, violation in report.examples().items():
            example = {"example": kind, **violation.as_dict()}
            print(json.dumps(example) if not tty else f"\n{kind}: {json.dumps(example)}")
            for line in observations.logs_about(violation.job, violation.run_key, args.examples):
                print(f"    {line}" if tty else json.dumps({"log": line}))
        if args.keep:
            progress(f"rows and logs kept in {workdir}")
    # The lease's inherent limits are reported, not failed (checker.INHERENT).
    return 1 if any(v.kind not in checker.INHERENT for v in report.violations) else 0


if __name__ == "__main__":
    sys.exit(main())
