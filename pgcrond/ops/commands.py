"""Operator commands on the lease table: migrate, status, history, trigger, unlock, prune.

They read the same table as the daemon. The database is ``--database-url``,
else ``PGCROND_DATABASE_URL``, else the config's ``database.url``; the table is
the config's ``database.schema``/``table`` with ``-c``, ``pgcrond.leases``
without. A failure is one line on stderr that says what to do next, exit 2.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import sys
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from pgcrond.cli import ExitCode
from pgcrond.config.loader import (
    DATABASE_URL_ENV,
    DEFAULT_HISTORY_RETENTION,
    MIN_HISTORY_RETENTION,
    Config,
    load_config,
    min_history_retention,
)
from pgcrond.config.models import PruneRule, prune_rules
from pgcrond.core.durations import format_duration, parse_duration
from pgcrond.core.keys import Identity
from pgcrond.core.redaction import redact
from pgcrond.daemon.logs import configure
from pgcrond.daemon.metrics import Metrics
from pgcrond.errors import ConfigError, DatabaseUnavailable, PgcrondError, ValidationError
from pgcrond.fire import Firing
from pgcrond.guard import Guards
from pgcrond.ops import report
from pgcrond.storage import history as records
from pgcrond.storage.db import Database
from pgcrond.storage.embedded import running_dsn
from pgcrond.storage.history import abandon_stale, prune
from pgcrond.storage.leases import LeaseStore
from pgcrond.storage.requests import prune_requests

# The exit codes are pgcrond.cli.ExitCode, one enum for every command.
EXIT_OK = ExitCode.OK
# The command ran but did not change anything: the operator said no, or the
# row moved on between showing and changing it.
EXIT_NOT_DONE = ExitCode.FAILED
EXIT_ERROR = ExitCode.ERROR
ERROR_WIDTH = 60
# How long a command waits for its connection before it gives up.
CONNECT_TIMEOUT_S = 5.0
POOL_LOGGER = "psycopg.pool"


class CommandError(PgcrondError):
    """The command cannot go on; the message says what to do instead."""


@dataclass(frozen=True)
class Target:
    """Which database and lease table a command works on."""

    url: str
    schema: str
    table: str
    config: Config | None

    @property
    def table_name(self) -> str:
        return f"{self.schema}.{self.table}"


Body = Callable[[argparse.Namespace, Target, LeaseStore], Awaitable[int]]


def migrate_command(args: argparse.Namespace) -> int:
    return _run(args, _migrate, needs_table=False)


def status_command(args: argparse.Namespace) -> int:
    return _run(args, _status)


def history_command(args: argparse.Namespace) -> int:
    return _run(args, _history)


def trigger_command(args: argparse.Namespace) -> int:
    configure(args.log_format, args.log_level)
    return _run(args, _trigger, needs_table=False)


def unlock_command(args: argparse.Namespace) -> int:
    return _run(args, _unlock)


def prune_command(args: argparse.Namespace) -> int:
    return _run(args, _prune)


def _run(args: argparse.Namespace, body: Body, *, needs_table: bool = True) -> int:
    url: str | None = None
    with _PoolErrors() as pool_errors:
        try:
            target = _target(args)
            url = target.url
            return asyncio.run(_with_store(args, target, body, needs_table=needs_table))
        except ConfigError as exc:
            # One issue per line is the config's own format; each names file:line.
            return _error(f"{exc}\n(run `pgcrond check -c ...` to validate the config alone)")
        except DatabaseUnavailable as exc:
            return _error(
                f"cannot reach the database at {redact(url or '?')}: "
                f"{pool_errors.last or exc}; check --database-url, {DATABASE_URL_ENV} "
                "or database.url, and that PostgreSQL is running"
            )
        except PgcrondError as exc:
            return _error(str(exc))


class _PoolErrors(logging.Handler):
    """Keeps the pool's last connection error for the one-line message.

    Otherwise Python's last-resort handler prints every reconnect attempt to
    stderr, and the final error only says that the pool timed out.
    """

    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.last: str | None = None
        self._logger = logging.getLogger(POOL_LOGGER)
        self._propagate = self._logger.propagate

    def emit(self, record: logging.LogRecord) -> None:
        text = record.getMessage().splitlines()[0]
        self.last = text.split(": ", 1)[1] if text.startswith("error connecting") else text

    def __enter__(self) -> _PoolErrors:
        self._logger.addHandler(self)
        self._logger.propagate = False
        return self

    def __exit__(self, *exc_info: object) -> None:
        self._logger.removeHandler(self)
        self._logger.propagate = self._propagate


def _error(message: str) -> int:
    # A driver message can quote the connection string; never let a password out.
    print(f"pgcrond: error: {redact(message)}", file=sys.stderr)
    return EXIT_ERROR


def _target(args: argparse.Namespace) -> Target:
    if args.config:
        config = load_config(args.config, database_url=args.database_url)
        url = config.database.url
        if config.database.embedded:
            url = running_dsn(config.database.state_dir / "data")
        if url is None:
            raise CommandError(
                "the config uses an embedded server, and it is not running: start "
                "`pgcrond run` with this config first, or pass --database-url "
                f"(or set {DATABASE_URL_ENV})"
            )
        return Target(url, config.database.schema, config.database.table, config)
    url = args.database_url or os.environ.get(DATABASE_URL_ENV)
    if not url:
        raise CommandError(
            f"no database: pass --database-url URL, set {DATABASE_URL_ENV}, "
            "or pass -c CONFIG to use its database.url"
        )
    return Target(url, "pgcrond", "leases", None)


async def _with_store(
    args: argparse.Namespace, target: Target, body: Body, *, needs_table: bool
) -> int:
    db = Database(target.url, min_size=1, max_size=1, timeout=CONNECT_TIMEOUT_S)
    await db.open()
    try:
        store = LeaseStore(db, schema=target.schema, table=target.table)
        if needs_table and not await records.table_exists(store):
            raise CommandError(
                f"the lease table {target.table_name} does not exist in this database: "
                "run `pgcrond migrate` first (with the same -c or --database-url)"
            )
        return await body(args, target, store)
    finally:
        await db.close()


# -- trigger ------------------------------------------------------------------------------

# What `pgcrond trigger` exits with when this process did not run the job.
EXIT_NOT_RUN_HERE = ExitCode.NOT_RUN_HERE


def manual_run_key(now: datetime) -> str:
    """``manual:<UTC minute>``: shells triggering the same job in the same minute agree."""
    return "manual:" + now.astimezone(UTC).strftime("%Y-%m-%dT%H:%MZ")


async def _trigger(args: argparse.Namespace, target: Target, store: LeaseStore) -> int:
    if target.config is None:
        raise CommandError("trigger needs -c CONFIG: the job's definition comes from it")
    job = target.config.jobs.get(args.code)
    if job is None:
        known = ", ".join(sorted(target.config.jobs)) or "none"
        raise CommandError(f"no job {args.code!r} in the config (jobs: {known})")
    await store.migrate()
    now = datetime.now(UTC)
    if getattr(args, "detach", False):
        # Recorded for the daemons (pgcrond.ops.requests); nothing runs here.
        from pgcrond.ops.requests import detach

        return await detach(job, args.run_key or manual_run_key(now), store)
    identity = Identity.schedule(job.code, args.run_key or manual_run_key(now))
    firing = Firing(guards=Guards(store, store.db).for_job, metrics=Metrics(), replica=store.owner)
    outcome = await firing.fire(job, now, identity, follow=False)
    print(f"{job.code} {identity.run_key}: {TRIGGER_OUTCOMES.get(outcome, outcome)}")
    if outcome == "success":
        return EXIT_OK
    return EXIT_NOT_RUN_HERE if outcome in ("lose", "skip", "misfire") else EXIT_NOT_DONE


TRIGGER_OUTCOMES = {
    "success": "ran here: success",
    "lose": "not run here: this run key is running or done elsewhere (pass --run-key to run again)",
    "skip": "not run: the previous run of this job is still going (concurrency: forbid)",
    "misfire": "not run: the database could not be reached",
    "fail": "ran here: failed (see the log above; retried here if the job has retries)",
    "timeout": "ran here: stopped at its timeout",
    "cancelled": "ran here: stopped before it finished",
    "lease_lost": "ran here, but its lease was lost before it finished: "
    "the outcome is not recorded",
}


# -- migrate ------------------------------------------------------------------------------


async def _migrate(args: argparse.Namespace, target: Target, store: LeaseStore) -> int:
    applied = await store.migrate()
    for version in applied:
        print(f"applied migration {version} ({target.table_name})")
    if not applied:
        print(f"up to date ({target.table_name})")
    return EXIT_OK


# -- status -------------------------------------------------------------------------------


async def _status(args: argparse.Namespace, target: Target, store: LeaseStore) -> int:
    config = target.config
    # argparse makes -c required for status, so the config is always there.
    assert config is not None
    rows = await records.job_status(store, list(config.jobs))
    now = datetime.now(UTC)
    entries = [report.status_entry(config.jobs[row["code"]], row, now) for row in rows]
    await _add_ticks(store, config, entries)
    if args.json:
        print(report.to_json(entries))
        return EXIT_OK
    print(
        report.table(
            ["JOB", "SCHEDULE", "GUARD", "NEXT FIRE", "LAST RUN", "RUNNING NOW", "FAILS",
             "LAST TICK", "LAST SUCCESS", "LAST FAILURE", "MISSED 24H", "PAUSED"],
            [_status_cells(entry, now) + _tick_cells(entry) for entry in entries],
        )
    )  # fmt: skip
    return EXIT_OK


async def _add_ticks(store: LeaseStore, config: Config, entries: list[dict[str, Any]]) -> None:
    """Per job: last tick, last success and failure, misses in 24 h, and its pause if any."""
    from pgcrond.storage import jobstate, ticks

    by_code = {row["code"]: row for row in await ticks.job_ticks(store, list(config.jobs))}
    pauses = await jobstate.paused(store)
    for entry in entries:
        row, job = by_code[entry["job"]], config.jobs[entry["job"]]
        pause = jobstate.pause_of(pauses, job.code)
        entry.update(
            last_tick={"run_key": row["last_tick"], "status": row["last_tick_status"]},
            last_success={"run_key": row["last_success_run_key"], "at": row["last_success_at"]},
            last_failure={"run_key": row["last_failure_run_key"], "at": row["last_failure_at"]},
            misses_24h=row["recent_misses"],
            paused=report.pause_entry(job, pause),
        )  # fmt: skip


def _tick_cells(entry: dict[str, Any]) -> list[str]:
    tick, ok, bad, paused = (
        entry["last_tick"], entry["last_success"], entry["last_failure"], entry["paused"]
    )  # fmt: skip
    pause_text = report.NONE
    if paused is not None:
        pause_text = (
            "suspended (config)"
            if paused["source"] == "config"
            else f"{'all, ' if paused['code'] == '*' else ''}by {paused['by']}"
            + (f": {paused['reason']}" if paused["reason"] else "")
        )
    return [
        f"{tick['run_key']} {tick['status']}" if tick["run_key"] else report.NONE,
        report.when(ok["at"]) if ok["at"] else report.NONE,
        report.when(bad["at"]) if bad["at"] else report.NONE,
        str(entry["misses_24h"]),
        pause_text,
    ]


def _status_cells(entry: dict[str, Any], now: datetime) -> list[str]:
    if entry["runs_at_start"]:
        next_fire = "at start"
    elif entry["next_fire"] is None:
        next_fire = "never"
    else:
        fire: datetime = entry["next_fire"]
        next_fire = f"{report.when(fire)} ({report.relative(fire - now)})"
    last = entry["last_run"]
    last_text = report.NONE
    if last is not None:
        outcome = last["status"] + (f"/{last['reason']}" if last["reason"] else "")
        last_text = (
            f"{outcome} {report.when(last['finished_at'])} on {last['owner']} "
            f"({report.took(last['duration_s'])})"
        )
    running = entry["running"]
    running_text = report.NONE
    if running is not None:
        expiry = "expired" if running["stale"] else "until"
        running_text = (
            f"{'STALE ' if running['stale'] else ''}{running['owner']} "
            f"since {report.when(running['since'])}, lease {expiry} "
            f"{report.when(running['expires_at'])}"
        )
    return [
        entry["job"],
        entry["schedule"],
        entry["guard"],
        next_fire,
        last_text,
        running_text,
        str(entry["consecutive_failures"]),
    ]


# -- history ------------------------------------------------------------------------------


async def _history(args: argparse.Namespace, target: Target, store: LeaseStore) -> int:
    if args.limit < 1:
        raise CommandError(f"--limit must be at least 1, got {args.limit}")
    since = None if args.since is None else _since(args.since, datetime.now(UTC))
    rows = await records.history(
        store, code=args.job, since=since, status=args.status, limit=args.limit
    )
    entries = [report.history_entry(row) for row in rows]
    if args.json:
        print(report.to_json(entries))
        return EXIT_OK
    if not entries:
        print(f"no runs in {target.table_name} match")
        return EXIT_OK
    print(
        report.table(
            ["JOB", "RUN KEY", "STATUS", "REASON", "ATTEMPT", "OWNER", "ACQUIRED", "TOOK", "ERROR"],
            [
                [
                    entry["job"],
                    entry["run_key"] or "(initial)",
                    entry["status"],
                    entry["reason"] or report.NONE,
                    str(entry["attempt"]),
                    entry["owner"],
                    report.when(entry["acquired_at"]),
                    report.took(entry["duration_s"]),
                    report.first_line(entry["error"], ERROR_WIDTH),
                ]
                for entry in entries
            ],
        )
    )
    return EXIT_OK


def _since(text: str, now: datetime) -> datetime:
    """An ISO-8601 instant (UTC when it has no offset) or a duration back from now."""
    try:
        instant = datetime.fromisoformat(text)
    except ValueError:
        pass
    else:
        return instant if instant.tzinfo else instant.replace(tzinfo=UTC)
    try:
        return now - parse_duration(text)
    except ValueError as exc:
        raise CommandError(
            f"--since {text!r}: not an ISO-8601 instant (2026-11-30T00:00Z) "
            f"and not a duration: {exc}"
        ) from exc


# -- unlock -------------------------------------------------------------------------------


async def _unlock(args: argparse.Namespace, target: Target, store: LeaseStore) -> int:
    try:
        identity = (
            Identity.initial(args.code)
            if args.initial
            else Identity.schedule(args.code, args.run_key)
        )
    except ValidationError as exc:
        raise CommandError(str(exc)) from exc
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
            else "it was skipped (concurrency: forbid), and a skipped tick is history"
        )
        raise CommandError(
            f"not releasing job {identity.code!r}, {which}: {why}; "
            f"use `pgcrond trigger {identity.code}` to run the job again"
        )
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


# -- prune --------------------------------------------------------------------------------


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

    def progress(deleted: int) -> None:
        print(f"deleted {deleted} rows…", flush=True)

    abandoned = await abandon_stale(store, floor)
    if abandoned:
        print(f"closed {abandoned} RUNNING rows whose owner vanished (now FAIL/abandoned)")
    # --older-than is one age for every job; otherwise each job's history_retention.
    rules = (
        prune_rules(target.config)
        if args.older_than is None and target.config is not None
        else [PruneRule(older_than)]
    )
    for rule in rules:
        total = await prune(
            store, rule.older_than, on_batch=progress, only=rule.only, excluding=rule.excluding
        )
        which = "" if rule.only is None else f" of {', '.join(rule.only)}"
        print(
            f"deleted {total} finished rows{which} older than "
            f"{format_duration(rule.older_than)} from {target.table_name}"
        )
    # Finished `trigger --detach` requests go with the history of the same age.
    requests = await prune_requests(store, older_than)
    if requests:
        print(f"deleted {requests} finished requests older than {format_duration(older_than)}")
    return EXIT_OK
