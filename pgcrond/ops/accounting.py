"""``pgcrond pause``, ``resume`` and ``catch-up``: cluster-wide state and missed ticks.

Pause and resume write the job-state table; every replica's next claim reads
it (no reload, no polling). ``catch-up`` shows (``--dry-run``) or does, once,
what a starting replica does with the ticks no replica ran: the same plan
(:mod:`pgcrond.catchup`), from the same query, under the same lease row.
"""

from __future__ import annotations

import argparse
import os
import pwd
from datetime import UTC, datetime

from pgcrond import report
from pgcrond.catchup import JobPlan
from pgcrond.core.overlap import FORBID
from pgcrond.daemon.accounting import (
    SCAN_TIMING,
    find_plan,
    record_plan,
    run_catch_up,
    scan_identity,
)
from pgcrond.errors import CommandError, ExitCode
from pgcrond.fire import Firing
from pgcrond.guard import Guards
from pgcrond.logs import configure
from pgcrond.ops.session import Target, run_command
from pgcrond.storage import jobstate
from pgcrond.storage.claims import NotAcquired
from pgcrond.storage.leases import LeaseStore
from pgcrond.storage.migrate import migrate


def pause_command(args: argparse.Namespace) -> int:
    return run_command(args, _pause, needs_table=False)


def resume_command(args: argparse.Namespace) -> int:
    return run_command(args, _resume)


def catch_up_command(args: argparse.Namespace) -> int:
    configure(args.log_format, args.log_level, args.color)
    return run_command(args, _catch_up)


def _codes(args: argparse.Namespace, target: Target) -> list[str]:
    if args.all and args.codes:
        raise CommandError("give job codes or --all, not both")
    if args.all:
        return [jobstate.ALL_JOBS]
    if not args.codes:
        raise CommandError("give one or more job codes, or --all")
    if target.config is not None:
        unknown = [code for code in args.codes if code not in target.config.jobs]
        if unknown:
            known = ", ".join(sorted(target.config.jobs)) or "none"
            raise CommandError(
                f"no job {', '.join(map(repr, unknown))} in the config (jobs: {known})"
            )
    return list(args.codes)


# Who runs the command: the person behind sudo first, then the login user.
OPERATOR_ENV = ("SUDO_USER", "USER", "LOGNAME")


def operator(given: str | None, process: str) -> str:
    """``NAME (host:pid)``: who paused or resumed (``--by``, else the operator), and from where."""
    name = (
        given
        if given is not None
        else next((os.environ[var] for var in OPERATOR_ENV if os.environ.get(var)), None)
        or _account()
    )
    name = " ".join(name.split())
    if not name or not name.isprintable():
        raise CommandError(f"--by {given!r}: give a name of printable characters, like --by alice")
    return f"{name} ({process})"


def _account() -> str:
    """This process's user name, as ``id -un`` says it (a container or cron sets no USER)."""
    try:
        return pwd.getpwuid(os.getuid()).pw_name
    except KeyError:
        return f"uid {os.getuid()}"


def _pause_json(pause: jobstate.Pause) -> dict[str, object]:
    return {"job": pause.code, "by": pause.paused_by, "at": pause.paused_at, "reason": pause.reason}


async def _pause(args: argparse.Namespace, target: Target, store: LeaseStore) -> int:
    codes = _codes(args, target)
    by = operator(args.by, store.owner)
    # The job-state table comes with migration 2; a fresh cluster may not have it yet.
    await migrate(store)
    pauses = await jobstate.pause(store, codes, by=by, reason=args.reason)
    if args.output == "json":
        print(report.to_json({"paused": [_pause_json(pause) for pause in pauses]}))
        return ExitCode.OK
    for pause in pauses:
        which = "every job" if pause.code == jobstate.ALL_JOBS else pause.code
        print(f"paused {which}: {pause.describe()}")
    print("each replica skips their next ticks (recorded SKIPPED/paused) until resumed")
    return ExitCode.OK


async def _resume(args: argparse.Namespace, target: Target, store: LeaseStore) -> int:
    codes = _codes(args, target)
    by = operator(args.by, store.owner)
    # The pause row goes with the resume: who resumed is in the command's output only.
    resumed = await jobstate.resume(store, codes, all_jobs=args.all)
    left = await jobstate.paused(store)
    still_all = left.get(jobstate.ALL_JOBS)
    if args.output == "json":
        document = {
            "resumed": resumed,
            "by": by,
            "still_paused_all": None if still_all is None else _pause_json(still_all),
        }
        print(report.to_json(document))
        return ExitCode.OK if resumed else ExitCode.FAILED
    if not resumed:
        print("nothing to resume: no such pause in force")
        return ExitCode.FAILED
    for code in resumed:
        print(f"resumed {'every job' if code == jobstate.ALL_JOBS else code} (by {by})")
    if still_all is not None:
        print(f"note: every job is still paused ({still_all.describe()})")
    return ExitCode.OK


def plan_rows(plans: list[JobPlan]) -> list[dict[str, object]]:
    """The plan, one row per tick, as `catch-up --dry-run` prints it."""
    rows: list[dict[str, object]] = []
    for job_plan in plans:
        for item in job_plan.ticks:
            rows.append(
                {
                    "job": item.code,
                    "run_key": item.run_key,
                    "action": {
                        "run": "run (catch-up)",
                        "missed": "record MISSED",
                        "skipped": "record SKIPPED",
                        "due": "run (within misfire_grace)",
                    }[item.action],
                    "reason": item.reason,
                    "why": item.why,
                }
            )
    return rows


async def _catch_up(args: argparse.Namespace, target: Target, store: LeaseStore) -> int:
    if target.config is None:
        raise CommandError("catch-up needs -c CONFIG: the jobs' schedules come from it")
    config = target.config
    as_json = args.output == "json"
    now = datetime.now(UTC)
    if args.dry_run:
        plans = await find_plan(store, config)
        if as_json:
            print(report.to_json(_catch_up_json(True, True, plans, [])))
        else:
            _print_plan(plans, "would be")
        return ExitCode.OK
    plans = []

    async def account(_: object) -> int:
        plans.extend(await find_plan(store, config))
        return len(await record_plan(store, config, plans))

    recorded = await store.run_exclusive(
        scan_identity(now), account, timing=SCAN_TIMING, overlap=FORBID, retry_after=None
    )
    if isinstance(recorded, NotAcquired):
        detail = f"a replica is accounting for missed ticks right now ({recorded.reason})"
        if as_json:
            print(report.to_json(_catch_up_json(False, False, [], [], detail)))
        else:
            print(f"not done: {detail}")
        return ExitCode.NOT_RUN_HERE
    if not as_json:
        _print_plan(plans, "")
    firing = Firing(guards=Guards(store, store.db).for_job, replica=store.owner)
    runs: list[dict[str, object]] = []
    for job_plan in plans:
        todo = [p for p in job_plan.ticks if p.action in ("run", "due")]
        for item, outcome in await run_catch_up(firing, dict(config.jobs), todo):
            if not as_json:
                print(f"{item.code} {item.run_key}: {outcome}")
            runs.append({"job": item.code, "run_key": item.run_key, "outcome": outcome})
    if as_json:
        print(report.to_json(_catch_up_json(False, True, plans, runs)))
    failed = sum(run["outcome"] in ("fail", "timeout", "lease_lost") for run in runs)
    return ExitCode.FAILED if failed else ExitCode.OK


def _catch_up_json(
    dry_run: bool,
    done: bool,
    plans: list[JobPlan],
    runs: list[dict[str, object]],
    detail: str | None = None,
) -> dict[str, object]:
    """`catch-up -o json`: the plan (a row per tick), and each run's outcome if not a dry run."""
    return {
        "dry_run": dry_run,
        "done": done,
        "detail": detail,
        "plan": plan_rows(plans),
        "runs": runs,
    }


def _print_plan(plans: list[JobPlan], mood: str) -> None:
    rows = plan_rows(plans)
    if not rows:
        print("every expected tick has a record: nothing to catch up")
        return
    print(
        report.table(
            ["JOB", "TICK", "ACTION", "WHY"],
            [
                [
                    str(r["job"]),
                    str(r["run_key"]),
                    str(r["action"]),
                    # A calendar's day has no text: its reason (calendar:<name>) says it.
                    str(r["why"] or r["reason"] or report.NONE),
                ]
                for r in rows
            ],
        )
    )
    missed = sum(r["action"] == "record MISSED" for r in rows)
    skipped = sum(r["action"] == "record SKIPPED" for r in rows)
    runs = len(rows) - missed - skipped
    on_calendars = f", {skipped} {mood} recorded SKIPPED (a calendar's day)" if skipped else ""
    print(
        f"{missed} ticks {mood} recorded MISSED{on_calendars}, {runs} {mood} run".replace("  ", " ")
    )
