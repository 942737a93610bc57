"""Operator commands that read the lease table: migrate, status, history.

They read the same table as the daemon; :mod:`pgcrond.ops.session` says which.
"""

from __future__ import annotations

import argparse
from datetime import UTC, datetime, timedelta
from typing import Any

from pgcrond import report
from pgcrond.config.models import Config, JobConfig
from pgcrond.core.durations import format_duration, parse_duration
from pgcrond.errors import CommandError, ExitCode
from pgcrond.ops.session import EXIT_OK, Target, run_command
from pgcrond.storage import attempts, jobstate, registry, ticks
from pgcrond.storage import history as records
from pgcrond.storage.leases import LeaseStore
from pgcrond.storage.migrate import migrate

ERROR_WIDTH = 60
# `status --check`: drift is a problem once it outlasts a rolling deploy.
DRIFT_TOLERATED = timedelta(minutes=15)
# `status --check` found a problem (listed); 2 stays "could not tell" (no database, ...).
EXIT_UNHEALTHY = ExitCode.FAILED


def migrate_command(args: argparse.Namespace) -> int:
    return run_command(args, _migrate, needs_table=False)


def status_command(args: argparse.Namespace) -> int:
    return run_command(args, _status)


def history_command(args: argparse.Namespace) -> int:
    return run_command(args, _history)


async def _migrate(args: argparse.Namespace, target: Target, store: LeaseStore) -> int:
    applied = await migrate(store)
    if args.output == "json":
        print(report.to_json({"table": target.table_name, "applied": list(applied)}))
        return EXIT_OK
    for version in applied:
        print(f"applied migration {version} ({target.table_name})")
    if not applied:
        print(f"up to date ({target.table_name})")
    return EXIT_OK


async def _status(args: argparse.Namespace, target: Target, store: LeaseStore) -> int:
    config = target.config
    # The CLI refuses status without a config (cli.NEEDS_CONFIG).
    assert config is not None
    rows = await records.job_status(store, list(config.jobs))
    now = datetime.now(UTC)
    entries = [report.status_entry(config.jobs[row["code"]], row, now) for row in rows]
    pauses = await jobstate.paused(store)
    await _add_ticks(store, config, entries, pauses)
    replicas = await registry.live(store)
    found = registry.drift(replicas)
    problems = _problems(config, entries, replicas, found, now)
    if args.output == "json":
        # Everything the text shows, in one document: the jobs as the status
        # page's /status.json has them, the replicas and drift as
        # /status/replicas.json, and what --check judges.
        print(
            report.to_json(
                {
                    "generated_at": now,
                    "jobs": entries,
                    "replicas": [report.replica_entry(replica) for replica in replicas],
                    "drift": report.drift_entry(found),
                    "pauses": [
                        {"code": p.code, "by": p.paused_by, "at": p.paused_at, "reason": p.reason}
                        for p in pauses.values()
                    ],
                    "problems": problems,
                }
            )
        )
    else:
        _print_status(args.output, config, entries, now)
        print()
        print(report.replicas_text(replicas, found, now))
        if args.check:
            print()
            print(
                "\n".join(f"problem: {p['detail']}" for p in problems)
                if problems
                else "healthy: a replica is live, no lasting drift, no job failing or stale"
            )
    return EXIT_UNHEALTHY if args.check and problems else EXIT_OK


def _print_status(
    output: str, config: Config, entries: list[dict[str, Any]], now: datetime
) -> None:
    if output == "wide":
        print(
            report.table(
                ["JOB", "SCHEDULE", "GUARD", "NEXT FIRE", "LAST RUN", "RUNNING NOW", "FAILS",
                 "LAST TICK", "LAST SUCCESS", "LAST FAILURE", "MISSED 24H", "PAUSED"],
                [_status_cells(entry, now) + _tick_cells(entry) for entry in entries],
            )
        )  # fmt: skip
        return
    print(
        report.table(
            ["JOB", "SCHEDULE", "GUARD", "NEXT FIRE", "LAST RUN", "RUNNING", "FAILS"],
            [_narrow_cells(config.jobs[entry["job"]], entry, now) for entry in entries],
        )
    )


def _problems(
    config: Config,
    entries: list[dict[str, Any]],
    replicas: list[registry.LiveReplica],
    found: registry.Drift | None,
    now: datetime,
) -> list[dict[str, Any]]:
    """What `status --check` fails on, like ``systemctl is-active``: no live replica, drift
    that outlasts a rolling deploy, a job whose last run failed for good, a stale job."""
    problems: list[dict[str, Any]] = []
    if not replicas:
        problems.append(
            {"kind": "no_replica", "job": None, "detail": "no live replica in the registry"}
        )
    if found is not None and now - found.since > DRIFT_TOLERATED:
        problems.append(
            {
                "kind": "drift",
                "job": None,
                "detail": f"{len(found.configs)} configs live since {report.when(found.since)}, "
                f"longer than {format_duration(DRIFT_TOLERATED)}",
            }
        )
    # A job that never succeeded is counted from the oldest live replica's start,
    # as the daemon's pgcrond_job_stale counts it from its own.
    up_since = min((r.started_at for r in replicas), default=now)
    for entry in entries:
        job = config.jobs[entry["job"]]
        if entry["consecutive_failures"]:
            problems.append(
                {
                    "kind": "failing",
                    "job": job.code,
                    "detail": f"{job.code}: {entry['consecutive_failures']} failed run(s) in a row",
                }
            )
        success = entry["last_success"]["at"] or up_since
        if job.alert_after is not None and now - success > job.alert_after:
            problems.append(
                {
                    "kind": "stale",
                    "job": job.code,
                    "detail": f"{job.code}: no success for {report.span(now - success)} "
                    f"(alert_after {format_duration(job.alert_after)})",
                }
            )
    return problems


def _narrow_cells(job: JobConfig, entry: dict[str, Any], now: datetime) -> list[str]:
    """Times relative to now and no hosts, so that a row fits 100 characters (-o wide has them)."""
    if entry["paused"] is not None:
        next_fire = "paused"
    elif entry["runs_at_start"]:
        next_fire = "at start"
    elif entry["next_fire"] is None:
        next_fire = "never"
    else:
        next_fire = report.relative(entry["next_fire"] - now)
    last, running = entry["last_run"], entry["running"]
    last_text = report.NONE
    if last is not None:
        outcome = last["status"] + (f"/{last['reason']}" if last["reason"] else "")
        last_text = f"{outcome} {report.relative(last['finished_at'] - now)}"
    running_text = report.NONE
    if running is not None:
        running_text = running["owner"] + (" (STALE)" if running["stale"] else "")
    return [
        entry["job"],
        report.schedule_text(job),
        entry["guard"],
        next_fire,
        last_text,
        running_text,
        str(entry["consecutive_failures"]),
    ]


async def _add_ticks(
    store: LeaseStore,
    config: Config,
    entries: list[dict[str, Any]],
    pauses: dict[str, jobstate.Pause],
) -> None:
    """Per job: last tick, last success and failure, misses in 24 h, and its pause if any."""
    by_code = {row["code"]: row for row in await ticks.job_ticks(store, list(config.jobs))}
    for entry in entries:
        row, job = by_code[entry["job"]], config.jobs[entry["job"]]
        pause = jobstate.pause_of(pauses, job.code)
        entry.update(
            last_tick={
                "run_key": row["last_tick"],
                "status": row["last_tick_status"],
                "reason": row["last_tick_reason"],
            },
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
    # A tick that did not run says why (SKIPPED/calendar:holidays, MISSED/late).
    why = f"/{tick['reason']}" if tick["status"] in ("SKIPPED", "MISSED") else ""
    return [
        f"{tick['run_key']} {tick['status']}{why}" if tick["run_key"] else report.NONE,
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


async def _history(args: argparse.Namespace, target: Target, store: LeaseStore) -> int:
    if args.limit < 1:
        raise CommandError(f"--limit must be at least 1, got {args.limit}")
    since = None if args.since is None else _since(args.since, datetime.now(UTC))
    # pgcrond's own rows (catch-up scans, prunes) are noise in a job's history;
    # asking for one of them by --job shows it.
    rows = await records.history(
        store,
        code=args.job,
        since=since,
        status=args.status,
        limit=args.limit,
        internal=args.all or args.job is not None,
    )
    entries = [report.history_entry(row) for row in rows]
    kept = await attempts.of_rows(store, [entry["id"] for entry in entries], output=True)
    for entry in entries:
        entry["attempts"] = [report.attempt_entry(row, output=True) for row in kept[entry["id"]]]
    if args.output == "json":
        print(report.to_json(entries))
        return EXIT_OK
    if not entries:
        print(f"no runs in {target.table_name} match")
        return EXIT_OK
    print(
        report.table(
            ["JOB", "RUN KEY", "STATUS", "REASON", "ATTEMPT", "OWNER", "ACQUIRED", "TOOK", "ERROR"],
            [row for entry in entries for row in _history_rows(entry)],
        )
    )
    return EXIT_OK


def _history_rows(entry: dict[str, Any]) -> list[list[str]]:
    """A tick's row; under it, when it took more than one attempt or did not succeed, a row
    per attempt record: how it ended and the last line it printed (``pgcrond logs`` has
    the whole kept output)."""
    rows = [
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
    ]
    kept_attempts = entry["attempts"]
    if len(kept_attempts) == 1 and kept_attempts[0]["status"] in ("success", "running"):
        return rows
    for kept in kept_attempts:
        exit_code = kept["exit_code"]
        rows.append(
            [
                "",
                "",
                f"└ {kept['status']}",
                report.NONE if exit_code is None else f"exit {exit_code}",
                str(kept["attempt"]),
                kept["replica"],
                report.when(kept["started_at"]),
                report.took(kept["duration_s"]),
                report.first_line(_attempt_note(kept), ERROR_WIDTH),
            ]
        )
    return rows


def _attempt_note(kept: dict[str, Any]) -> str | None:
    """An attempt's error and the last line it printed (stderr first when it failed)."""
    failed = kept["status"] not in ("success", "running")
    streams = ("stderr", "stdout") if failed else ("stdout", "stderr")
    last = next(
        (
            line.strip()
            for name in streams
            for line in reversed(kept["output"][name]["text"].splitlines())
            if line.strip()
        ),
        None,
    )
    parts = [part for part in (kept["error"], last and f"› {last}") if part]
    return " ".join(parts) or None


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
