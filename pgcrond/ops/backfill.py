"""``pgcrond backfill JOB --from T1 --to T2``: run a job's past ticks again, on the cluster.

The job's scheduled ticks in the range (walked by its own schedule), each
under its own identity and run key: a tick that SUCCEEDED is not run again,
one that FAILED for good or was MISSED (or has no record) is. ``--dry-run``
lists what would run and what is skipped, and why, and files nothing.
Otherwise the ticks to run are filed in one statement as requests
(:mod:`pgcrond.storage.backfills`) that the replicas take, at most
``--max-parallel`` at a time and in tick order, and run through the job's
guard like any retry: pause and the overlap policy apply, a replica killed
mid-run is taken over. The command then follows them, saying on stderr how
many are done, running and left (a ``backfill_progress`` log line, JSON off a
terminal), and prints a table of what each tick came to; ``--no-wait`` returns
once filed (the backfill goes on without it).
"""

from __future__ import annotations

import argparse
import asyncio
import sys
from datetime import UTC, datetime
from typing import Any

import structlog

from pgcrond import report
from pgcrond.config.models import JobConfig
from pgcrond.core import backfill, params
from pgcrond.core.schedule import run_key_for
from pgcrond.errors import CommandError, ExitCode
from pgcrond.logs import configure
from pgcrond.ops.session import Target, run_command
from pgcrond.ops.trigger import job_params, overridden
from pgcrond.storage import backfills, registry
from pgcrond.storage.leases import LeaseStore
from pgcrond.storage.migrate import migrate

log = structlog.get_logger("pgcrond.backfill")

# How often a waiting backfill reads where its ticks stand (one indexed read).
FOLLOW_POLL_S = 0.5
# What a tick's request came to: it ran and succeeded, it ran and failed.
_RAN_AND_FAILED = frozenset({"fail", "timeout", "cancelled", "lease_lost", "crashed"})


def backfill_command(args: argparse.Namespace) -> int:
    configure(args.log_format, args.log_level, args.color)
    try:
        return run_command(args, _backfill, needs_table=False)
    except KeyboardInterrupt:
        # Only the waiting stopped: the backfill is filed, and the replicas run it.
        print(
            f"pgcrond backfill: stopped waiting; the backfill goes on (see `pgcrond status` "
            f"and `pgcrond history --job {args.code}`)",
            file=sys.stderr,
        )
        return ExitCode.INTERRUPTED


def _instant(text: str, flag: str) -> datetime:
    """An ISO-8601 date or instant; UTC when it has no offset."""
    try:
        moment = datetime.fromisoformat(text)
    except ValueError:
        raise CommandError(
            f"{flag} {text!r}: not an ISO-8601 date or instant (2026-11-24, 2026-11-24T03:00:00Z)"
        ) from None
    return moment if moment.tzinfo else moment.replace(tzinfo=UTC)


def _job(args: argparse.Namespace, target: Target) -> JobConfig:
    if target.config is None:
        raise CommandError("backfill needs -c CONFIG: the job's schedule comes from it")
    job = target.config.jobs.get(args.code)
    if job is None:
        known = ", ".join(sorted(target.config.jobs)) or "none"
        raise CommandError(f"no job {args.code!r} in the config (jobs: {known})")
    if job.is_once:
        raise CommandError(f"job {job.code!r} runs once: it has no ticks to backfill")
    if not job.guard_remembers:
        raise CommandError(
            f"job {job.code!r} is guarded by an advisory lock, which keeps no record of which "
            "ticks succeeded: a backfill needs guard: lease"
        )
    return job


async def _backfill(args: argparse.Namespace, target: Target, store: LeaseStore) -> int:
    job = _job(args, target)
    given = job_params(job, args.env)
    overridden(job, args.concurrency)  # refused here if bad; the replicas apply it
    start, end = _instant(args.start, "--from"), _instant(args.end, "--to")
    now = datetime.now(UTC)
    if end < start:
        raise CommandError(f"--to {args.end} is before --from {args.start}")
    if end > now:
        raise CommandError(
            f"--to {args.end} is in the future: a backfill runs past ticks, the schedule the rest"
        )
    if args.max_parallel < 1:
        raise CommandError(f"--max-parallel must be at least 1, got {args.max_parallel}")
    try:
        ticks = backfill.ticks_in(job.schedule, start, end)
    except ValueError as exc:
        raise CommandError(str(exc)) from None
    await migrate(store)
    rows = await backfills.tick_rows(store, job.code, [run_key_for(t) for t, _ in ticks])
    planned = backfill.plan(ticks, dict(rows))
    as_json = args.output == "json"
    head: dict[str, Any] = {
        "job": job.code,
        "from": start,
        "to": end,
        "max_parallel": args.max_parallel,
        "params": params.shown(given),
        "concurrency": args.concurrency,
    }
    to_run = [p for p in planned if p.run]
    if args.dry_run or not to_run:
        if as_json:
            print(report.to_json({**head, "dry_run": args.dry_run, "ticks": _entries(planned)}))
        else:
            verb = "would run" if args.dry_run else "runs"
            print(_summary(job, start, end, planned, verb) + ("" if to_run else ": nothing to do"))
            print(_plan_table(planned))
        return ExitCode.OK
    filed = await backfills.file_backfill(
        store,
        job.code,
        [p.tick for p in to_run],
        span=(start, end),
        by=store.owner,
        max_parallel=args.max_parallel,
        lease=job.timing.lease,
        params=given,
        concurrency=args.concurrency,
    )
    kept = set(filed.run_keys)
    # A tick that moved on between the read and the filing (it ran meanwhile) is not filed.
    planned = [
        p if not p.run or p.run_key in kept else backfill.Planned(p.tick, False, "ran meanwhile")
        for p in planned
    ]
    head["backfill"] = filed.id
    if not as_json:
        print(_summary(job, start, end, planned, f"backfill {filed.id} runs"), flush=True)
    if args.no_wait:
        if as_json:
            print(report.to_json({**head, "ticks": _entries(planned)}))
        else:
            print(_plan_table(planned))
            print(
                f"see where it stands: pgcrond status; its runs: pgcrond history --job {job.code}"
            )
        return ExitCode.OK
    runs_it = [r.name for r in await registry.live(store) if job.code in r.job_hashes]
    if not runs_it:
        detail = (
            f"no live replica runs {job.code}: the backfill waits for the first one that starts"
        )
        if as_json:
            print(report.to_json({**head, "detail": detail, "ticks": _entries(planned)}))
        else:
            print(detail)
        return ExitCode.NOT_RUN_HERE
    found = await _follow(store, filed.id)
    outcomes = {row["run_key"]: row for row in found}
    if as_json:
        print(report.to_json({**head, "ticks": _entries(planned, outcomes)}))
    else:
        print(_result_table(planned, outcomes))
    ended = [outcomes[key]["outcome"] for key in kept if key in outcomes]
    if any(outcome in _RAN_AND_FAILED for outcome in ended):
        return ExitCode.FAILED
    if any(outcome != "success" for outcome in ended):
        return ExitCode.NOT_RUN_HERE
    return ExitCode.OK


async def _follow(store: LeaseStore, backfill_id: int) -> list[dict[str, Any]]:
    """Until every filed tick's request is done; says each change of the counts."""
    said: tuple[int, int, int] | None = None
    while True:
        found = await backfills.progress(store, backfill_id)
        done = sum(row["done_at"] is not None for row in found)
        running = sum(row["done_at"] is None and row["taken_by"] is not None for row in found)
        counts = (done, running, len(found) - done - running)
        if counts != said:
            said = counts
            log.info(
                "backfill_progress",
                backfill=backfill_id,
                done=counts[0],
                running=counts[1],
                left=counts[2],
            )
        # (A filed request that a manual one of its run key reopened left the backfill.)
        if done == len(found):
            return found
        await asyncio.sleep(FOLLOW_POLL_S)


def _summary(
    job: JobConfig, start: datetime, end: datetime, planned: list[backfill.Planned], verb: str
) -> str:
    runs = sum(p.run for p in planned)
    return (
        f"{job.code} {report.when(start)} .. {report.when(end)}: {len(planned)} ticks; "
        f"{verb} {runs}, skips {len(planned) - runs}"
    )


def _plan_table(planned: list[backfill.Planned]) -> str:
    return report.table(
        ["TICK", "ACTION", "WHY"],
        [[p.run_key, "run" if p.run else "skip", p.why] for p in planned],
    )


def _result_table(planned: list[backfill.Planned], outcomes: dict[str, dict[str, Any]]) -> str:
    rows = []
    for p in planned:
        row = outcomes.get(p.run_key) if p.run else None
        if row is None:
            rows.append([p.run_key, "skipped", report.NONE, report.NONE, report.NONE, p.why])
            continue
        rows.append(
            [
                p.run_key,
                row["outcome"] or "not done",
                report.NONE if row["lease_attempt"] is None else str(row["lease_attempt"]),
                row["trigger"] or report.NONE,
                row["lease_owner"] or row["taken_by"] or report.NONE,
                report.first_line(row["lease_error"], 60),
            ]
        )
    return report.table(["TICK", "OUTCOME", "ATTEMPT", "TRIGGER", "RAN ON", "DETAIL"], rows)


def _entries(
    planned: list[backfill.Planned], outcomes: dict[str, dict[str, Any]] | None = None
) -> list[dict[str, Any]]:
    entries = []
    for p in planned:
        entry: dict[str, Any] = {
            "run_key": p.run_key,
            "action": "run" if p.run else "skip",
            "why": p.why,
        }
        row = None if outcomes is None or not p.run else outcomes.get(p.run_key)
        if row is not None:
            entry.update(
                outcome=row["outcome"],
                attempt=row["lease_attempt"],
                trigger=row["trigger"],
                ran_on=row["lease_owner"] or row["taken_by"],
                error=row["lease_error"],
            )
        entries.append(entry)
    return entries
