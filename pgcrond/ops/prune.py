"""`pgcrond prune`: delete finished rows older than their job's history retention."""

from __future__ import annotations

import argparse

from pgcrond import report
from pgcrond.config.fields import MIN_HISTORY_RETENTION
from pgcrond.config.models import (
    DEFAULT_HISTORY_RETENTION,
    PruneRule,
    min_history_retention,
    prune_rules,
)
from pgcrond.core.durations import format_duration, parse_duration
from pgcrond.errors import CommandError
from pgcrond.ops.session import EXIT_OK, Target, run_command
from pgcrond.storage.history import abandon_stale, prune
from pgcrond.storage.leases import LeaseStore
from pgcrond.storage.requests import prune_requests


def prune_command(args: argparse.Namespace) -> int:
    return run_command(args, _prune)


async def _prune(args: argparse.Namespace, target: Target, store: LeaseStore) -> int:
    if args.older_than is not None:
        try:
            older_than = parse_duration(args.older_than)
        except ValueError as exc:
            raise CommandError(f"--older-than {args.older_than!r}: {exc}") from exc
    elif target.config is not None:
        older_than = target.config.history_retention
    else:
        older_than = DEFAULT_HISTORY_RETENTION

    # Deleting a finished row a late replica could still claim would run its
    # tick again: never below the longest misfire window plus lease.
    floor = (
        min_history_retention(target.config.jobs)
        if target.config is not None
        else MIN_HISTORY_RETENTION
    )
    if args.older_than is not None and older_than < floor:
        raise CommandError(
            f"--older-than {format_duration(older_than)} is below {format_duration(floor)}: "
            "a late replica could claim a pruned tick and run it again"
        )

    as_json = args.output == "json"
    say = _silent if as_json else print

    def progress(deleted: int) -> None:
        say(f"deleted {deleted} rows…", flush=True)

    abandoned = await abandon_stale(store, floor)
    if abandoned:
        say(f"closed {abandoned} RUNNING rows whose owner vanished (now FAIL/abandoned)")
    # --older-than is one age for every job; otherwise each job's history_retention.
    rules = (
        prune_rules(target.config)
        if args.older_than is None and target.config is not None
        else [PruneRule(older_than)]
    )
    deleted: list[dict[str, object]] = []
    for rule in rules:
        total = await prune(
            store, rule.older_than, on_batch=progress, only=rule.only, excluding=rule.excluding
        )
        which = "" if rule.only is None else f" of {', '.join(rule.only)}"
        say(
            f"deleted {total} finished rows{which} older than "
            f"{format_duration(rule.older_than)} from {target.table_name}"
        )
        deleted.append(
            {
                "jobs": None if rule.only is None else list(rule.only),
                "older_than": format_duration(rule.older_than),
                "rows": total,
            }
        )
    # Finished `trigger --detach` requests go with the history of the same age.
    requests = await prune_requests(store, older_than)
    if requests:
        say(f"deleted {requests} finished requests older than {format_duration(older_than)}")
    if as_json:
        document = {
            "table": target.table_name,
            "abandoned": abandoned,
            "deleted": deleted,
            "requests": requests,
        }
        print(report.to_json(document))
    return EXIT_OK


def _silent(*_: object, **__: object) -> None:
    """With -o json the one document is all stdout carries."""
