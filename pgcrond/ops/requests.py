"""``pgcrond trigger CODE``: ask the running daemons to run a job now, and wait for it.

The command records a request (one statement, which also NOTIFYs every
listening replica); one replica takes it and fires it through the job's guard,
so it runs once across the cluster, where the jobs run. :func:`follow` then
reads the request and its run key's lease row until the taker says how it
ended, and exits with that; ``--no-wait`` returns at once with the run key
(the outcome is then in ``pgcrond history --job CODE``).
"""

from __future__ import annotations

import asyncio
from typing import Any

from pgcrond import report
from pgcrond.config.models import JobConfig
from pgcrond.core import params
from pgcrond.core.keys import Identity
from pgcrond.errors import ExitCode
from pgcrond.ops.attempts import logs_entry, logs_text
from pgcrond.storage import attempts, registry
from pgcrond.storage.leases import LeaseStore
from pgcrond.storage.requests import Progress, Requested, request_progress, request_run

# A lease row in one of these states is not claimed again: the request runs nothing.
_FINISHED = {"SUCCESS", "SKIPPED", "MISSED"}
# How often a waiting trigger reads where its request stands (one indexed read):
# a run is seen to start and end within this.
FOLLOW_POLL_S = 0.25
# What the taker's fire came to -> the exit code: it ran and failed, or it did not run.
_RAN_AND_FAILED = frozenset({"fail", "timeout", "cancelled", "lease_lost", "crashed"})


async def on_the_cluster(
    job: JobConfig,
    run_key: str,
    store: LeaseStore,
    given: dict[str, str],
    *,
    concurrency: str | None = None,
    as_json: bool,
    wait: bool,
) -> int:
    """Record the request (with its parameters ``given``) and, with ``wait``, follow it to
    its end (:func:`follow`); else print what was done and where to look, and exit 0."""
    identity = Identity.schedule(job.code, run_key)  # refuses a malformed run key
    assert identity.run_key is not None
    done = await request_run(
        store,
        identity.code,
        identity.run_key,
        by=store.owner,
        params=given,
        concurrency=concurrency,
    )
    if wait:
        return await follow(job, identity.run_key, store, done, as_json=as_json)
    note = _lease_note(done, identity)
    if as_json:
        document = {
            "job": identity.code,
            "run_key": identity.run_key,
            "outcome": "requested" if done.opened else "already_requested",
            "ran_here": False,
            "detail": _said(done),
            "note": note,
            "params": params.shown(given),
        }
        print(report.to_json(document))
        return ExitCode.OK
    print(f"{identity.code} {identity.run_key}: {_said(done)}")
    if note:
        print(note)
    print(f"see its outcome: pgcrond history --job {identity.code}")
    return ExitCode.OK


async def follow(
    job: JobConfig, run_key: str, store: LeaseStore, done: Requested, *, as_json: bool
) -> int:
    """Wait for the request of ``(job, run_key)`` to end; say what happened on the way.

    Exit 0: it ran and succeeded; 1: it ran and failed (its output's kept tail is
    printed); 3: it did not run (done or running elsewhere, or no live replica runs
    the job, in which case the request stays for the first one that starts).
    """

    def say(line: str) -> None:
        if not as_json:
            print(line, flush=True)

    say(f"{job.code} {run_key}: {_said(done)}")
    runs_it = [r.name for r in await registry.live(store) if job.code in r.job_hashes]
    if not runs_it:
        detail = (
            f"no live replica runs {job.code}: the request waits for the first one that "
            f"starts (or run it in this process: pgcrond trigger {job.code} --here)"
        )
        return _ended(
            job,
            run_key,
            None,
            outcome="not_taken",
            detail=detail,
            code=ExitCode.NOT_RUN_HERE,
            as_json=as_json,
        )
    seen: set[tuple[str, object]] = set()
    while True:
        now = await request_progress(store, job.code, run_key)
        if now.taken_by is not None and ("taken", now.taken_by) not in seen:
            seen.add(("taken", now.taken_by))
            say(f"taken by {now.taken_by}")
        if now.lease_status == "RUNNING" and ("attempt", now.lease_attempt) not in seen:
            seen.add(("attempt", now.lease_attempt))
            say(f"run_started on {now.lease_owner}, attempt {now.lease_attempt}")
        if now.done_at is not None:
            break
        await asyncio.sleep(FOLLOW_POLL_S)
    outcome = now.outcome or "unknown"
    ran = outcome == "success" or outcome in _RAN_AND_FAILED
    if ran and now.lease_attempt is not None and ("attempt", now.lease_attempt) not in seen:
        # A run shorter than a poll started and ended between two looks: it still started.
        say(f"run_started on {now.lease_owner}, attempt {now.lease_attempt}")
    if outcome == "success":
        return _ended(
            job, run_key, now, outcome=outcome, detail="success", code=ExitCode.OK, as_json=as_json
        )
    if outcome in _RAN_AND_FAILED:
        detail = f"{outcome}" + (f": {now.lease_error}" if now.lease_error else "")
        if not as_json:
            print(f"{job.code} {run_key}: {detail}")
            found = await attempts.of_job(store, job.code, run_key=run_key)
            if found:
                print(logs_text(logs_entry(job.code, found[0])))
        return _ended(
            job,
            run_key,
            now,
            outcome=outcome,
            detail=detail,
            code=ExitCode.FAILED,
            as_json=as_json,
            said=True,
        )
    detail = _not_run.get(outcome, f"not run: {outcome}")
    return _ended(
        job,
        run_key,
        now,
        outcome=outcome,
        detail=detail,
        code=ExitCode.NOT_RUN_HERE,
        as_json=as_json,
    )


_not_run = {
    "lose": "not run: this run key is running or done elsewhere (pass --run-key to run again)",
    "skip": "not run: a previous run of this job still goes on, and its concurrency skips it",
    "misfire": "not run: the taking replica could not reach the database in time",
    "unknown": "not known: the advisory-guarded run started on a replica that did not record "
    "its end",
}


def _ended(
    job: JobConfig,
    run_key: str,
    now: Progress | None,
    *,
    outcome: str,
    detail: str,
    code: int,
    as_json: bool,
    said: bool = False,
) -> int:
    if as_json:
        document: dict[str, Any] = {
            "job": job.code,
            "run_key": run_key,
            "outcome": outcome,
            "ran_here": False,
            "ran_on": None if now is None else now.lease_owner or now.taken_by,
            "attempt": None if now is None else now.lease_attempt,
            "detail": detail,
        }
        print(report.to_json(document))
    elif not said:
        print(f"{job.code} {run_key}: {detail}")
    return code


def _said(done: Requested) -> str:
    if done.opened:
        again = (
            f" (again: the earlier request ended {done.earlier_outcome or 'done'} "
            f"at {report.when(done.earlier_done_at)})"
            if done.earlier_done_at is not None
            else ""
        )
        return f"requested{again}; one daemon replica runs it, within about a second"
    if done.earlier_params and not done.earlier_done_at:
        pending = f" with its own parameters {params.text(done.earlier_params)}"
    else:
        pending = ""
    if done.earlier_by is None:
        # Another shell's request committed while this statement ran: its
        # snapshot does not show that row, but the conflict was with it.
        return "already requested by another shell just now; not requested twice"
    where = (
        f"taken by {done.earlier_taken_by}"
        if done.earlier_taken_by
        else "pending: it runs once a replica takes it"
    )
    return (
        f"already requested by {done.earlier_by} at {report.when(done.earlier_at)} ({where})"
        f"{pending}; not requested twice"
    )


def _lease_note(done: Requested, identity: Identity) -> str | None:
    status = done.lease_status
    if status is None:
        return None
    state = status + (f"/{done.lease_reason}" if done.lease_reason else "")
    if status == "RUNNING":
        return f"note: this run key is running now on {done.lease_owner}; it is not run twice"
    # A FAIL row with a retry time, or released by `pgcrond unlock`, is claimed again.
    reclaimable = done.lease_retry_at is not None or done.lease_reason == "released"
    if status in _FINISHED or (status == "FAIL" and not reclaimable):
        return (
            f"note: this run key already ended {state} on {done.lease_owner}, so a replica "
            f"will find it done and run nothing; pass --run-key to run {identity.code} again"
        )
    return None
