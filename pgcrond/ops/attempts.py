"""``pgcrond logs``: the output an attempt left, from its attempt record.

The record keeps each stream's head and tail (pgcrond.core.output), redacted;
the text printed here has every control character and invalid byte escaped,
so a job's output can never drive the terminal it is shown in.

``--follow`` cannot stream a running attempt from here: its output reaches
the database only when the attempt ends (with its finalize, in the same
statement), and between the replica running it and this command there is no
other channel. The replica streams it live to its own log stream as
``job_output`` events; ``--follow`` says so, waits for the attempt to end and
then prints what it left.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
from typing import Any

from pgcrond import report
from pgcrond.errors import CommandError
from pgcrond.ops.session import EXIT_OK, Target, run_command
from pgcrond.storage import attempts
from pgcrond.storage.leases import LeaseStore

# How often --follow looks whether the attempt ended (one indexed read).
FOLLOW_POLL_S = 1.0


def logs_command(args: argparse.Namespace) -> int:
    return run_command(args, _logs)


async def _logs(args: argparse.Namespace, target: Target, store: LeaseStore) -> int:
    if args.attempt is not None and args.attempt < 1:
        raise CommandError(f"--attempt must be at least 1, got {args.attempt}")
    row = await _newest(args, target, store)
    if row["status"] == "running" and args.follow:
        print(
            f"pgcrond logs: attempt {row['attempt']} of {args.job} "
            f"{row['run_key'] or '(initial)'} is running on {row['replica']}; its output is "
            "stored when it ends, so it cannot be streamed from here (that replica streams "
            "it live to its own log as job_output events). Waiting for it to end…",
            file=sys.stderr,
            flush=True,
        )
        while row["status"] == "running":
            await asyncio.sleep(FOLLOW_POLL_S)
            row = await _again(args, store, row)
    entry = logs_entry(args.job, row)
    if args.output == "json":
        print(report.to_json(entry))
        return EXIT_OK
    print(logs_text(entry))
    return EXIT_OK


async def _newest(args: argparse.Namespace, target: Target, store: LeaseStore) -> dict[str, Any]:
    found = await attempts.of_job(store, args.job, run_key=args.run_key, attempt=args.attempt)
    if not found:
        which = " ".join(
            part
            for part in (
                args.job,
                f"run key {args.run_key}" if args.run_key else "",
                f"attempt {args.attempt}" if args.attempt else "",
            )
            if part
        )
        raise CommandError(
            f"no attempt record of {which} in {target.table_name} (records are kept for "
            "runs under the lease guard, and pruned with the history; "
            f"see `pgcrond history --job {args.job}`)"
        )
    return found[0]


async def _again(
    args: argparse.Namespace, store: LeaseStore, row: dict[str, Any]
) -> dict[str, Any]:
    """The same attempt read again: its lease row and fencing token name it."""
    found = await attempts.of_rows(store, [row["lease_id"]], output=True)
    same = [r for r in found[row["lease_id"]] if r["fencing_token"] == row["fencing_token"]]
    if not same:
        raise CommandError(f"the attempt record of {args.job} went (pruned?) while waiting")
    return {**row, **same[0]}


def logs_entry(job: str, row: dict[str, Any]) -> dict[str, Any]:
    return {
        "job": job,
        "type": row["type"],
        "run_key": row["run_key"],
        "tick_status": row["tick_status"],
        **report.attempt_entry(row, output=True),
        "params": report.params_entry(row.get("params")),
    }


def logs_text(entry: dict[str, Any]) -> str:
    outcome = entry["status"].upper()
    if entry["error"]:
        outcome += f": {entry['error']}"
    lines = [
        f"{entry['job']} {entry['run_key'] or '(initial)'} attempt {entry['attempt']} "
        f"on {entry['replica']}: {outcome}",
        f"trigger {entry['trigger'] or report.NONE}"
        + (
            ", params " + " ".join(f"{k}={v}" for k, v in entry["params"].items())
            if entry["params"]
            else ""
        ),
        f"started {report.when(entry['started_at'])}, "
        + (
            f"ended {report.when(entry['finished_at'])} ({report.took(entry['duration_s'])})"
            if entry["finished_at"]
            else "not ended"
        ),
    ]
    failed = entry["status"] not in ("success", "running")
    order = ("stderr", "stdout") if failed else ("stdout", "stderr")
    for name in order:
        stream = entry["output"][name]
        dropped = stream["dropped_bytes"]
        note = f", {dropped} bytes in the middle not kept" if dropped else ""
        if not stream["text"]:
            lines.append(f"--- {name}: empty{note}")
            continue
        lines.append(f"--- {name}{note}")
        lines.append(stream["text"].rstrip("\n"))
    if entry["status"] == "running":
        lines.append("(still running: its output is stored when it ends; --follow waits for it)")
    return "\n".join(lines)
