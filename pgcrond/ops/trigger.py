"""`pgcrond trigger`: one manual run on the cluster (a request a daemon replica takes, waited
for unless ``--no-wait``), or here and now in this process (``--here``)."""

from __future__ import annotations

import argparse
import sys
from datetime import UTC, datetime

from pgcrond import report
from pgcrond.config.models import JobConfig
from pgcrond.core import params
from pgcrond.core.keys import Identity
from pgcrond.core.schedule import manual_run_key
from pgcrond.errors import CommandError, ExitCode, ValidationError
from pgcrond.fire import Fire, Firing
from pgcrond.guard import Guards
from pgcrond.logs import configure
from pgcrond.ops.session import EXIT_NOT_DONE, EXIT_OK, Target, run_command
from pgcrond.run import box
from pgcrond.storage.leases import LeaseStore
from pgcrond.storage.migrate import migrate

# What `pgcrond trigger` exits with when this process did not run the job.
EXIT_NOT_RUN_HERE = ExitCode.NOT_RUN_HERE

# Outcomes of a fire that ran nothing in this process (exit 3).
NOT_RUN_HERE = ("lose", "skip", "misfire")


def overridden(job: JobConfig, concurrency: str | None) -> JobConfig:
    """``job`` under ``--concurrency``, checked here: a bad one is refused before any request."""
    if concurrency is None:
        return job
    try:
        return job.with_concurrency(concurrency)
    except ValidationError as exc:
        raise CommandError(f"--concurrency: {str(exc).removeprefix('concurrency: ')}") from None


def job_params(job: JobConfig, assignments: list[str] | None) -> dict[str, str]:
    """``--env NAME=VALUE`` as the run's parameters, checked against the job's ``params:``."""
    try:
        return params.parse(assignments or (), code=job.code, declared=job.params)
    except ValueError as exc:
        raise CommandError(str(exc)) from None


def trigger_command(args: argparse.Namespace) -> int:
    configure(args.log_format, args.log_level, args.color)
    try:
        return run_command(args, _trigger, needs_table=False)
    except KeyboardInterrupt:
        if args.here:
            raise
        # Only the waiting stopped: the request stays, and a replica runs it.
        print(
            f"pgcrond trigger: stopped waiting; the request stays (see `pgcrond history "
            f"--job {args.code}`)",
            file=sys.stderr,
        )
        return ExitCode.INTERRUPTED


async def _trigger(args: argparse.Namespace, target: Target, store: LeaseStore) -> int:
    if target.config is None:
        raise CommandError("trigger needs -c CONFIG: the job's definition comes from it")
    job = target.config.jobs.get(args.code)
    if job is None:
        known = ", ".join(sorted(target.config.jobs)) or "none"
        raise CommandError(f"no job {args.code!r} in the config (jobs: {known})")
    given = job_params(job, args.env)
    job = overridden(job, args.concurrency)
    await migrate(store)
    now = datetime.now(UTC)
    if not args.here:
        # Recorded for the daemons (pgcrond.ops.requests); nothing runs here.
        from pgcrond.ops.requests import on_the_cluster

        return await on_the_cluster(
            job,
            args.run_key or manual_run_key(now),
            store,
            given,
            concurrency=args.concurrency,
            as_json=args.output == "json",
            wait=not args.no_wait,
        )
    identity = Identity.schedule(job.code, args.run_key or manual_run_key(now))
    # Boxed as the daemon would box it, by the config's `cgroups:`; a one-off
    # run does not move this process into a v2 leaf.
    box.configure(target.config.cgroups, prepare=False)
    firing = Firing(guards=Guards(store, store.db).for_job, replica=store.owner)
    outcome = await firing.fire(
        Fire(job, now, identity, follow=False, trigger="manual", params=given)
    )
    detail = TRIGGER_OUTCOMES.get(outcome, outcome)
    ran_here = outcome not in NOT_RUN_HERE
    if args.output == "json":
        document = {
            "job": job.code,
            "run_key": identity.run_key,
            "outcome": outcome,
            "ran_here": ran_here,
            "detail": detail,
        }
        print(report.to_json(document))
    else:
        print(f"{job.code} {identity.run_key}: {detail}")
    if outcome == "success":
        return EXIT_OK
    return EXIT_NOT_DONE if ran_here else EXIT_NOT_RUN_HERE


TRIGGER_OUTCOMES = {
    "success": "ran here: success",
    "lose": "not run here: this run key is running or done elsewhere (pass --run-key to run again)",
    "skip": "not run: a previous run of this job still goes on, and its concurrency skips it",
    "misfire": "not run: the database could not be reached",
    "fail": "ran here: failed (see the log above; retried here if the job has retries)",
    "timeout": "ran here: stopped at its timeout",
    "cancelled": "ran here: stopped before it finished",
    "lease_lost": "ran here, but its lease was lost before it finished: "
    "the outcome is not recorded",
}
