"""`pgcrond check`, `next` and `calendars`: look at a config without a database.

`next` walks ``schedule.occasion_after`` exactly as the daemon does, so the
times it prints are the ticks the daemon will fire, DST included, and those
on a calendar's day marked SKIPPED as their claims will record them.
"""

from __future__ import annotations

import argparse
import json
import sys
from datetime import UTC, date, datetime, timedelta
from typing import Any

from pgcrond.config.loader import load_config
from pgcrond.config.models import Config, JobConfig
from pgcrond.core.actions import Action, CommandAction, HttpAction, ShellAction, SqlAction
from pgcrond.core.box import BASE_PASSTHROUGH, runs_a_process
from pgcrond.core.durations import format_duration
from pgcrond.core.jitter import jitter_shift
from pgcrond.core.redaction import redact
from pgcrond.core.schedule import (
    AnyOf,
    Between,
    Occasion,
    Schedule,
    Skipping,
    calendars_of,
    day_end,
    run_key_for,
    window_of,
)
from pgcrond.errors import ConfigError, ConfigIssue, ExitCode
from pgcrond.run.box import detect

# A calendar's days shown by `next` before it stops looking: a long freeze ends the list.
SKIPPED_DAYS_SHOWN = 60


def check_command(args: argparse.Namespace) -> int:
    config = _load(args, allow_unset=not getattr(args, "strict", False))
    if config is None:
        return ExitCode.ERROR
    if args.output == "json":
        document = {
            "warnings": [_issue_json(w) for w in config.warnings],
            "files": list(config.files),
            "database": {
                "url": config.database.redacted_url,
                "embedded": config.database.embedded,
                "schema": config.database.schema,
                "table": config.database.table,
            },
            "jobs": [_job_json(job) for job in config.jobs.values()],
        }
        if getattr(args, "explain", False):
            document["boxes"] = _host_json(config)
        print(json.dumps(document, indent=2))
        return ExitCode.OK
    for warning in config.warnings:
        print(f"warning: {redact(str(warning))}", file=sys.stderr)
    count = len(config.jobs)
    print(f"config OK: {count} job{'s' if count != 1 else ''} in {', '.join(config.files)}")
    rows = [
        (job.code, job.schedule.describe(), job.guard, _action_summary(job.action))
        for job in config.jobs.values()
    ]
    widths = [max(len(row[i]) for row in rows) for i in range(3)]
    for row in rows:
        print(
            "  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=False))
            + "  "
            + row[3]
        )
    if getattr(args, "explain", False):
        _explain(config)
    return ExitCode.OK


def _host_json(config: Config) -> dict[str, Any]:
    # Only looked at: `check` makes no cgroup and moves no process.
    found = detect(config.cgroups, prepare=False)
    return {"by": found.mode, "reason": found.reason, "limits": found.enforcement()}


def _explain(config: Config) -> None:
    """How each job is boxed on this machine: what it runs as, its limits and how
    they are enforced here, what it inherits."""
    found = _host_json(config)
    print(f"\njobs are boxed here by {found['by']}: {found['reason']}")
    for name, how in found["limits"].items():
        print(f"  {name:<10} {how}")
    for job in config.jobs.values():
        shown = _box_json(job)
        print(f"job {job.code!r}:")
        if shown["runs_inside_pgcrond"]:
            print("  runs inside pgcrond: no user, group or limits of its own")
        else:
            who = shown["user"] or "pgcrond's own user"
            print(f"  runs as  {who}" + (f", group {shown['group']}" if shown["group"] else ""))
            limits = ", ".join(f"{k} {v}" for k, v in shown["limits"].items()) or "none"
            print(f"  limits   {limits}")
        print(f"  inherits {', '.join(shown['inherits'])} (secrets never)")
        if shown["env_file"]:
            print(f"  env_file {', '.join(shown['env_file'])}")


def next_command(args: argparse.Namespace) -> int:
    config = _load(args)
    if config is None:
        return ExitCode.ERROR
    if args.n < 1:
        print("pgcrond next: -n must be 1 or more", file=sys.stderr)
        return ExitCode.ERROR
    try:
        start = _parse_start(args.start)
    except ValueError as exc:
        print(f"pgcrond next: --from: {exc}", file=sys.stderr)
        return ExitCode.ERROR
    jobs = list(config.jobs.values())
    if args.job is not None:
        if args.job not in config.jobs:
            known = ", ".join(config.jobs)
            print(f"pgcrond next: no job {args.job!r}; known jobs: {known}", file=sys.stderr)
            return ExitCode.ERROR
        jobs = [config.jobs[args.job]]
    listing = [(job, _occasions(job, start, args.n)) for job in jobs]
    if args.output == "json":
        document = {
            "from": start.isoformat().replace("+00:00", "Z"),
            "jobs": [
                {
                    "code": job.code,
                    "schedule": job.schedule.describe(),
                    "timezone": job.timezone.key,
                    "once": job.is_once,
                    **_window_json(job),
                    "ticks": [
                        {
                            "utc": run_key_for(o.tick),
                            "local": o.tick.astimezone(job.timezone).isoformat(),
                            **_jittered_json(job, o.tick),
                            **_occasion_json(job, o),
                        }
                        for o in ticks
                    ],
                }
                for job, ticks in listing
            ],
        }
        print(json.dumps(document, indent=2))
        return ExitCode.OK
    for job, ticks in listing:
        print(f"{job.code}: {job.schedule.describe()}")
        opens, closes = window_of(job.schedule)
        if opens is not None and opens > start:
            print(f"  the window opens at {run_key_for(opens)}")
        if job.is_once:
            print("  at start (run-once)")
        elif not ticks:
            print(
                f"  the window closed at {run_key_for(closes)}"
                if closes is not None and closes <= start
                else f"  no tick after {run_key_for(start)}"
            )
        for o in ticks:
            local = o.tick.astimezone(job.timezone)
            print(
                f"  {run_key_for(o.tick)}  {local:%Y-%m-%d %H:%M:%S %Z (%z)}"
                f"{_jittered(job, o.tick)}{_occasion_text(job, o)}"
            )
    return ExitCode.OK


def schema_command(args: argparse.Namespace) -> int:
    """``pgcrond schema``: the JSON Schema of the config files, as in docs/config.schema.json."""
    from pgcrond.config.schema import schema_text

    sys.stdout.write(schema_text())
    return ExitCode.OK


def _issue_json(issue: ConfigIssue) -> dict[str, Any]:
    return {
        "file": issue.file,
        "line": issue.line,
        "job": issue.job,
        "field": issue.field,
        "message": redact(issue.message),
    }


def _load(args: argparse.Namespace, *, allow_unset: bool = True) -> Config | None:
    """The config, or None after printing every issue (never a traceback, never a password)."""
    try:
        return load_config(args.config, allow_unset=allow_unset)
    except ConfigError as exc:
        if getattr(args, "output", "text") == "json":
            print(json.dumps({"errors": [_issue_json(i) for i in exc.issues]}, indent=2))
        else:
            for issue in exc.issues:
                print(redact(str(issue)), file=sys.stderr)
            count = len(exc.issues)
            print(
                f"{count} problem{'s' if count != 1 else ''}: "
                "fix these and run pgcrond check again",
                file=sys.stderr,
            )
        return None


def _parse_start(text: str | None) -> datetime:
    """Default now; a time without offset is read as UTC, the zone ticks are named in."""
    if text is None:
        return datetime.now(UTC)
    try:
        start = datetime.fromisoformat(text)
    except ValueError:
        raise ValueError(f"{text!r} is not an ISO datetime like 2026-03-29T00:00:00Z") from None
    return start.replace(tzinfo=UTC) if start.tzinfo is None else start


def _jittered(job: JobConfig, tick: datetime) -> str:
    """With ``jitter``: where the daemon fires the tick (the run key stays the tick's)."""
    if not job.jitter:
        return ""
    shift = jitter_shift(job.code, tick, job.jitter)
    ms = shift // timedelta(milliseconds=1)  # cut, as the instant is
    return f"  fires {_instant(tick + shift)} (+{ms // 1000}.{ms % 1000:03d}s)"


def _jittered_json(job: JobConfig, tick: datetime) -> dict[str, Any]:
    if not job.jitter:
        return {}
    shift = jitter_shift(job.code, tick, job.jitter)
    return {"fires": _instant(tick + shift), "shift_s": round(shift.total_seconds(), 6)}


def _instant(moment: datetime) -> str:
    """UTC to the millisecond, as --json spells instants."""
    return moment.astimezone(UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def _occasions(job: JobConfig, start: datetime, count: int) -> list[Occasion]:
    """The next ``count`` ticks that run, and between them the first tick of each day a
    calendar skips (the rest of such a day is skipped too)."""
    found: list[Occasion] = []
    runs = skipped_days = 0
    moment = start
    while runs < count and skipped_days < SKIPPED_DAYS_SHOWN:
        occasion = job.schedule.occasion_after(moment)
        if occasion is None:
            break
        found.append(occasion)
        if occasion.skipped_by is None:
            runs += 1
            moment = occasion.tick
        else:
            skipped_days += 1
            moment = max(occasion.tick, day_end(occasion.tick, job.timezone))
    return found


def _occasion_text(job: JobConfig, occasion: Occasion) -> str:
    """The form, when the job has several; a clock change's rule; a calendar's skip."""
    parts = [occasion.form] if isinstance(_base(job.schedule), AnyOf) else []
    if occasion.dst:
        parts.append(occasion.dst)
    if occasion.skipped_by:
        parts.append(f"SKIPPED calendar:{occasion.skipped_by} (and the rest of that day)")
    return "".join(f"  {part}" for part in parts)


def _occasion_json(job: JobConfig, occasion: Occasion) -> dict[str, Any]:
    found: dict[str, Any] = {"form": occasion.form}
    if occasion.dst:
        found["dst"] = occasion.dst
    if occasion.skipped_by:
        found["skipped"] = f"calendar:{occasion.skipped_by}"
    return found


def _window_json(job: JobConfig) -> dict[str, Any]:
    opens, closes = window_of(job.schedule)
    if opens is None and closes is None:
        return {}
    shown = {"start": opens, "end": closes}
    return {"window": {k: None if v is None else run_key_for(v) for k, v in shown.items()}}


def _base(schedule: Schedule) -> Schedule:
    while isinstance(schedule, Skipping | Between):
        schedule = schedule.inner
    return schedule


def _box_json(job: JobConfig) -> dict[str, Any]:
    box = job.box
    return {
        "runs_inside_pgcrond": not runs_a_process(job.action),
        "user": None if box.user is None else f"{box.user.name} (uid {box.user.id})",
        "group": None if box.group is None else f"{box.group.name} (gid {box.group.id})",
        "limits": box.limits.describe(),
        "inherits": [*BASE_PASSTHROUGH, *box.env_passthrough],
        "env_file": [str(path) for path in job.env_file],
    }


def _action_summary(action: Action) -> str:
    if isinstance(action, CommandAction):
        return "command: " + " ".join(action.argv)
    if isinstance(action, ShellAction):
        return f"shell: {action.script}"
    if isinstance(action, SqlAction):
        return "sql: " + " ".join(action.text.split())
    if isinstance(action, HttpAction):
        return f"http: {action.method} {action.shown_url}"
    return f"entrypoint: {action.target}" + (" (isolated)" if action.isolate else "")


def _job_json(job: JobConfig) -> dict[str, Any]:
    action: dict[str, Any]
    if isinstance(job.action, CommandAction):
        action = {"type": "command", "argv": list(job.action.argv)}
    elif isinstance(job.action, ShellAction):
        action = {"type": "shell", "script": job.action.script}
    elif isinstance(job.action, SqlAction):
        action = {"type": "sql", "sql": job.action.text, "role": job.action.role}
    elif isinstance(job.action, HttpAction):
        action = {"type": "http", "method": job.action.method, "url": job.action.shown_url}
    else:
        action = {"type": "entrypoint", "target": job.action.target, "isolate": job.action.isolate}
    return {
        "code": job.code,
        "schedule": job.schedule.describe(),
        "once": job.is_once,
        "timezone": job.timezone.key,
        "guard": job.guard,
        "action": action,
        "lease": format_duration(job.timing.lease),
        "heartbeat": format_duration(job.timing.heartbeat),
        "timeout": None if job.timeout is None else format_duration(job.timeout),
        "retries": job.retries,
        "retry_delay": format_duration(job.retry_delay),
        "min_hold": format_duration(job.min_hold),
        "misfire_grace": format_duration(job.misfire_grace),
        "concurrency": job.concurrency,
        "max_concurrent": job.max_concurrent,
        # Values read from secret files are remembered secrets: redact() masks them.
        "env": {name: redact(value) for name, value in job.env.items()},
        "box": _box_json(job),
        "cwd": None if job.cwd is None else str(job.cwd),
        "key_hash": job.key_hash,
        "lock_key": job.lock_key,
        "description": job.description,
        "source": job.source,
    }


def calendars_command(args: argparse.Namespace) -> int:
    """``pgcrond calendars``: each calendar's days to come, and the jobs that skip them."""
    config = _load(args)
    if config is None:
        return ExitCode.ERROR
    if args.days < 1:
        print("pgcrond calendars: --days must be 1 or more", file=sys.stderr)
        return ExitCode.ERROR
    try:
        first = date.fromisoformat(args.start) if args.start else datetime.now(UTC).date()
    except ValueError:
        print(
            f"pgcrond calendars: --from: {args.start!r} is not a date like 2026-12-01",
            file=sys.stderr,
        )
        return ExitCode.ERROR
    last = first + timedelta(days=args.days - 1)
    skipping: dict[str, list[str]] = {name: [] for name in config.calendars}
    for job in config.jobs.values():
        for calendar in calendars_of(job.schedule):
            skipping[calendar.name].append(job.code)
    listing = [(c, c.days(first, last)) for c in config.calendars.values()]
    if args.output == "json":
        document = {
            "from": first.isoformat(),
            "to": last.isoformat(),
            "calendars": [
                {"name": c.name, "jobs": skipping[c.name], "days": [d.isoformat() for d in days]}
                for c, days in listing
            ],
        }
        print(json.dumps(document, indent=2))
        return ExitCode.OK
    if not listing:
        print("no calendars: in the config")
    for calendar, days in listing:
        print(f"{calendar.name}: skipped by {', '.join(skipping[calendar.name]) or 'no job'}")
        print(f"  {len(days)} day(s) from {first} to {last}")
        for day in days:
            print(f"  {day}  {day:%a}")
    return ExitCode.OK
