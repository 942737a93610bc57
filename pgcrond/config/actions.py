"""What a job runs: ``command:``, ``shell:``, ``entrypoint:``, ``sql:`` or ``http:``.

An entrypoint is imported here, at load, so that a typo is a config error at
start rather than a failed run at 3 a.m.
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import timedelta

from pgcrond.config.database import is_lease_database
from pgcrond.config.fields import ACTION_KEYS, JOB, Guard
from pgcrond.config.reading import Reading
from pgcrond.config.yamlnodes import Section
from pgcrond.core.actions import Action, CommandAction, EntrypointAction, ShellAction, SqlAction
from pgcrond.core.durations import format_duration
from pgcrond.core.entrypoints import resolve
from pgcrond.core.timing import LeaseTiming
from pgcrond.errors import EntrypointError


def read_action(
    reading: Reading,
    section: Section,
    merged: Mapping[str, object],
    timing: LeaseTiming | None,
    guard: Guard,
) -> Action | None:
    given = [k for k in ACTION_KEYS if k in section.values]
    isolate = reading.read(section, "isolate", JOB["isolate"].convert)
    if isolate is not None and given != ["entrypoint"]:
        reading.report(section, "isolate", "only used with entrypoint:")
    for name in ("role", "database"):
        if name in section.values and given != ["sql"]:
            reading.report(section, name, "only used with sql:")
    if len(given) != 1:
        reading.one_of(
            section,
            given,
            "action",
            "command: [argv...], shell: '...', entrypoint:, sql: '...' or http: {url: ...}",
        )
        return None
    if given == ["sql"]:
        return read_sql_action(reading, section, merged, timing, guard)
    if given == ["http"]:
        return reading.read(section, "http", JOB["http"].convert)
    if given == ["command"]:
        argv = reading.read(section, "command", JOB["command"].convert)
        return None if argv is None else CommandAction(argv)
    if given == ["shell"]:
        script = reading.read(section, "shell", JOB["shell"].convert)
        return None if script is None else ShellAction(script)
    target = reading.read(section, "entrypoint", JOB["entrypoint"].convert)
    if target is None:
        return None
    try:
        resolve(target)
    except EntrypointError as exc:
        reading.report(section, "entrypoint", str(exc))
        return None
    return EntrypointAction(target, isolate=bool(isolate))


def read_sql_action(
    reading: Reading,
    section: Section,
    merged: Mapping[str, object],
    timing: LeaseTiming | None,
    guard: Guard,
) -> SqlAction | None:
    """``sql:``: only under the lease guard, on the lease database, within the lease.

    The statements commit in the transaction that records the lease row's
    SUCCESS, so they need that row (no advisory lock has one) and that
    database. The row stays locked while they run, so the run's own
    heartbeats wait: it must end within its lease, less the heartbeat
    interval and the stop grace, which is also its default timeout.
    """
    text = reading.read(section, "sql", JOB["sql"].convert)
    role = reading.read(section, "role", JOB["role"].convert)
    database = reading.read(section, "database", JOB["database"].convert)
    ok = text is not None
    if guard != "lease":
        reading.report(
            section,
            "guard" if "guard" in section.values else "sql",
            "sql: needs guard: lease: its statements commit in the same transaction as the "
            "lease row's SUCCESS, and an advisory lock has no row to commit with",
        )
        ok = False
    if database is not None and not is_lease_database(reading, database):
        reading.report(
            section,
            "database",
            "an sql: job runs on the lease database only (database.url): its statements "
            "commit in the transaction that records the run's SUCCESS, which is what makes "
            "them exactly-once; leave database: out, or for another database use an "
            "entrypoint keyed by the idempotency key (docs/exactly-once.md)",
        )
        ok = False
    if timing is None or not ok or text is None:
        return None
    window = timing.lease - timing.heartbeat - timing.stop_budget
    if window <= timedelta(0):
        reading.report(
            section,
            "lease",
            f"lease {format_duration(timing.lease)} is too short for an sql: job: it must "
            "exceed the heartbeat interval plus the stop grace",
        )
        return None
    timeout = merged.get("timeout")
    if isinstance(timeout, timedelta) and timeout > window:
        reading.report(
            section,
            "timeout" if "timeout" in section.values else "lease",
            f"timeout {format_duration(timeout)} is longer than an sql: job can run: its "
            "lease row stays locked while the statements run, so heartbeats wait and the "
            f"run must end within lease - heartbeat - stop grace ({format_duration(window)}); "
            "raise lease or lower timeout",
        )
        return None
    limit = timeout if isinstance(timeout, timedelta) else window
    return SqlAction(text, statement_timeout=limit, role=role)
