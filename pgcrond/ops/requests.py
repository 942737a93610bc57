"""``pgcrond trigger CODE --detach``: ask the running daemons to run a job now.

The command records a request (one statement, which also NOTIFYs every
listening replica) and returns at once with the run key; one replica takes it
and fires it through the job's guard, so it runs once across the cluster. The
outcome is in ``pgcrond history --job CODE``.
"""

from __future__ import annotations

from pgcrond import report
from pgcrond.config.models import JobConfig
from pgcrond.core.keys import Identity
from pgcrond.errors import ExitCode
from pgcrond.storage.leases import LeaseStore
from pgcrond.storage.requests import Requested, request_run

# A lease row in one of these states is not claimed again: the request runs nothing.
_FINISHED = {"SUCCESS", "SKIPPED", "MISSED"}


async def detach(job: JobConfig, run_key: str, store: LeaseStore, *, as_json: bool) -> int:
    """Record the request, print what was done and where to look; exit 0."""
    identity = Identity.schedule(job.code, run_key)  # refuses a malformed run key
    assert identity.run_key is not None
    done = await request_run(store, identity.code, identity.run_key, by=store.owner)
    note = _lease_note(done, identity)
    if as_json:
        document = {
            "job": identity.code,
            "run_key": identity.run_key,
            "outcome": "requested" if done.opened else "already_requested",
            "ran_here": False,
            "detail": _said(done),
            "note": note,
        }
        print(report.to_json(document))
        return ExitCode.OK
    print(f"{identity.code} {identity.run_key}: {_said(done)}")
    if note:
        print(note)
    print(f"see its outcome: pgcrond history --job {identity.code}")
    return ExitCode.OK


def _said(done: Requested) -> str:
    if done.opened:
        again = (
            f" (again: the earlier request ended {done.earlier_outcome or 'done'} "
            f"at {report.when(done.earlier_done_at)})"
            if done.earlier_done_at is not None
            else ""
        )
        return f"requested{again}; one daemon replica runs it, within about a second"
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
        f"already requested by {done.earlier_by} at {report.when(done.earlier_at)} ({where}); "
        "not requested twice"
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
