"""`pgcrond unlock`: release a held or finished row so its tick (or run-once job) can run again."""

from __future__ import annotations

import argparse
import sys
from typing import Any

from pgcrond import report
from pgcrond.core.keys import Identity
from pgcrond.errors import CommandError, ValidationError
from pgcrond.ops.session import EXIT_NOT_DONE, EXIT_OK, Target, run_command
from pgcrond.storage import history as records
from pgcrond.storage.leases import LeaseStore


def unlock_command(args: argparse.Namespace) -> int:
    return run_command(args, _unlock)


async def _unlock(args: argparse.Namespace, target: Target, store: LeaseStore) -> int:
    try:
        identity = (
            Identity.initial(args.code)
            if args.initial
            else Identity.schedule(args.code, args.run_key)
        )
    except ValidationError as exc:
        raise CommandError(str(exc)) from exc
    as_json = args.output == "json"
    if as_json and not args.yes:
        raise CommandError("-o json does not ask for confirmation: pass --yes to release")
    row = await records.unlock_row(store, identity)
    which = "run-once (INITIAL) row" if args.initial else f"run key {identity.run_key}"
    if row is None:
        raise CommandError(
            f"job {identity.code!r} has no {which} in {target.table_name}: "
            f"see `pgcrond history --job {identity.code}` for its run keys"
        )
    # A FAIL tick may be released too: that makes it reclaimable, so that
    # `trigger --run-key` re-runs it under its own idempotency key.
    if row["type"] == "SCHEDULE" and row["status"] in ("SUCCESS", "SKIPPED"):
        why = (
            "it finished with SUCCESS, and a finished tick is history"
            if row["status"] == "SUCCESS"
            else "it was skipped (its concurrency, or a pause), and a skipped tick is history"
        )
        raise CommandError(
            f"not releasing job {identity.code!r}, {which}: {why}; "
            f"use `pgcrond trigger {identity.code}` to run the job again"
        )
    if not as_json:
        _show(row)
    if not args.yes and not _confirmed():
        return EXIT_NOT_DONE
    released = await records.unlock_release(
        store,
        identity,
        status=row["status"],
        owner_token=row["owner_token"],
        note=_release_note(row, store.owner),
    )
    if as_json:
        print(report.to_json(_unlock_json(identity, row, released)))
        return EXIT_OK if released else EXIT_NOT_DONE
    if not released:
        now = await records.unlock_row(store, identity)
        state = "it is gone" if now is None else f"it is now {now['status']} by {now['owner']}"
        print(
            f"pgcrond: not released: the row changed after it was shown ({state}); "
            "nothing was changed, run the command again to see it",
            file=sys.stderr,
        )
        return EXIT_NOT_DONE
    fenced = f"{row['owner']} is fenced and " if row["status"] == "RUNNING" else ""
    print(
        f"released job {identity.code}, {which}: now FAIL/released; "
        f"{fenced}the next claim may run it again"
    )
    if identity.run_key is not None:
        print(
            f"to run it again now, under the same idempotency key: "
            f"pgcrond trigger {identity.code} --run-key {identity.run_key}"
        )
    return EXIT_OK


def _unlock_json(identity: Identity, row: dict[str, Any], released: bool) -> dict[str, Any]:
    """`unlock -o json`: whether it was released, and the row as it was before."""
    return {
        "job": identity.code,
        "run_key": identity.run_key,
        "initial": identity.run_key is None,
        "released": released,
        "was": {
            "status": row["status"],
            "reason": row["reason"],
            "attempt": row["attempt"],
            "owner": row["owner"],
            "acquired_at": row["acquired_at"],
            "expires_at": row["expires_at"],
            "finished_at": row["finished_at"],
            "stale": row["stale"],
        },
    }


def _show(row: dict[str, Any]) -> None:
    if row["status"] == "RUNNING":
        lease = (
            f"expired {report.when(row['expires_at'])} (stale)"
            if row["stale"]
            else f"LIVE until {report.when(row['expires_at'])}: its owner may still be running it"
        )
    else:
        lease = f"finished {report.when(row['finished_at'])}"
    print(
        report.table(
            ["FIELD", "VALUE"],
            [
                ["job", row["code"]],
                ["run key", row["run_key"] or "(initial)"],
                ["status", row["status"] + (f"/{row['reason']}" if row["reason"] else "")],
                ["attempt", str(row["attempt"])],
                ["owner", row["owner"]],
                ["since", report.when(row["acquired_at"])],
                ["lease", lease],
            ],
        )
    )


def _confirmed() -> bool:
    if not sys.stdin.isatty():
        raise CommandError("stdin is not a terminal, so I cannot ask: pass --yes to release")
    try:
        answer = input("Release this run? [y/N] ")
    except EOFError:
        answer = ""
    if answer.strip().lower() in ("y", "yes"):
        return True
    print("not released")
    return False


def _release_note(row: dict[str, Any], by: str) -> str:
    was = f"was {row['status']} (owner {row['owner']}, attempt {row['attempt']})"
    note = f"released by `pgcrond unlock` on {by}; {was}"
    return f"{note}: {row['error']}" if row["error"] else note
