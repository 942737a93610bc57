"""One job's definition -> :class:`JobConfig`: its fields over ``defaults:``, and its own rules.

A job inherits every default-able field from ``defaults:`` (``env:`` merged
key by key); a rule that the defaults alone break is reported once, at the
defaults, not once per job.
"""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path
from types import MappingProxyType
from typing import cast
from zoneinfo import ZoneInfo

from pgcrond.config.actions import read_action
from pgcrond.config.fields import JOB, MIN_HISTORY_RETENTION, CatchUp, Guard, LateTicks
from pgcrond.config.models import (
    DEFAULT_JOB_LEASE,
    DEFAULT_MIN_HOLD,
    DEFAULT_MISFIRE_GRACE,
    DEFAULT_RETRY_DELAY,
    DEFAULT_TIMEZONE,
    JobConfig,
)
from pgcrond.config.process import read_box, read_environment
from pgcrond.config.reading import INVALID, Reading
from pgcrond.config.schedules import read_schedule
from pgcrond.config.yamlnodes import Located, Section
from pgcrond.core.durations import format_duration
from pgcrond.core.hooks import Hook, Ping
from pgcrond.core.keys import KeyHash
from pgcrond.core.overlap import Concurrency
from pgcrond.core.schedule import OnceSchedule
from pgcrond.core.timing import LeaseTiming
from pgcrond.errors import ValidationError

_TIMING_FIELDS = ("lease", "heartbeat")
# The environment of most jobs: one object for all of them.
NO_ENV: MappingProxyType[str, str] = MappingProxyType({})


def read_job(reading: Reading, code: str, key: Located, definition: Located) -> JobConfig | None:
    defaults, default_values = reading.defaults, reading.default_values
    before = len(reading.issues)
    section = reading.issues.section(definition, key.line, code, "", tuple(JOB))
    if section is None:
        return None
    own = reading.read_all(section)
    merged = {**default_values, **own}
    if isinstance(merged.get("env"), dict) and isinstance(default_values.get("env"), dict):
        merged["env"] = {
            **cast(dict[str, str], default_values["env"]),
            **cast(dict[str, str], merged["env"]),
        }
    zone = merged.get("timezone")
    zone = zone if isinstance(zone, ZoneInfo) else None
    if own.keys() & set(_TIMING_FIELDS) or not default_values.keys() & set(_TIMING_FIELDS):
        timing = read_timing(reading, own, default_values, section, defaults)
    else:
        timing = reading.default_timing  # its problems were reported once, at the defaults
    schedule, zone = read_schedule(reading, section, zone, "timezone" in own, merged)
    guard = cast(Guard, merged.get("guard", JOB["guard"].default))
    action = read_action(reading, section, merged, timing, guard)
    key_hash = reading.read(section, "key_hash", JOB["key_hash"].convert)
    lock_key = reading.read(section, "lock_key", JOB["lock_key"].convert)
    description = reading.read(section, "description", JOB["description"].convert)
    ping = reading.read(section, "ping", JOB["ping"].convert)
    suspended = reading.read(section, "suspended", JOB["suspended"].convert)
    params = cast(tuple[str, ...] | None, reading.read(section, "params", JOB["params"].convert))
    renamed_from = reading.read(section, "renamed_from", JOB["renamed_from"].convert) or ()
    if renamed_from:
        reading.renames[code] = (section, renamed_from)
    jitter = merged.get("jitter", JOB["jitter"].default)
    grace = merged.get("misfire_grace", DEFAULT_MISFIRE_GRACE)
    if isinstance(jitter, timedelta) and isinstance(grace, timedelta) and jitter >= grace:
        # A fire moved past the misfire window would never run.
        reading.report(
            section if "jitter" in own else (defaults or section),
            "jitter",
            f"must be shorter than misfire_grace ({format_duration(grace)})",
            job=code,
        )
    deadline = merged.get("start_deadline")
    if isinstance(deadline, timedelta) and isinstance(grace, timedelta) and deadline >= grace:
        # A start later than misfire_grace is no start: the tick is MISSED (on_missed).
        reading.report(
            section if "start_deadline" in own else (defaults or section),
            "start_deadline",
            f"must be shorter than misfire_grace ({format_duration(grace)})",
            job=code,
        )
    if guard == "advisory" and merged.get("pause_after_failures") is not None:
        # The count is the lease table's: an advisory guard keeps no outcomes.
        reading.report(
            section if "pause_after_failures" in own else (defaults or section),
            "pause_after_failures",
            "needs guard: lease (an advisory guard keeps no outcomes to count)",
            job=code,
        )
    concurrency = read_concurrency(reading, section, own, merged, guard)
    if guard != "advisory":
        for name in ("key_hash", "lock_key"):
            if name in section.values:
                reading.report(section, name, "only used with guard: advisory")
    misfire_grace = merged.get("misfire_grace", DEFAULT_MISFIRE_GRACE)
    if (
        timing is not None
        and isinstance(misfire_grace, timedelta)
        and guard == "lease"
        and not isinstance(schedule, OnceSchedule)
    ):
        check_takeover(reading, section, own, timing, misfire_grace)
    retention = merged.get("history_retention")
    if isinstance(retention, timedelta) and timing is not None:
        floor = max(MIN_HISTORY_RETENTION, cast(timedelta, misfire_grace) + timing.lease)
        if retention < floor:
            reading.report(
                section if "history_retention" in own else (defaults or section),
                "history_retention",
                f"must be at least {format_duration(floor)} (the floor, or misfire_grace "
                "+ lease): a finished run deleted sooner can be claimed afresh by a late "
                "replica and run twice",
                job=code,
            )
    env = read_environment(reading, section, own, merged)
    box = read_box(reading, section, own, merged, action)
    if (
        len(reading.issues) > before
        or INVALID in merged.values()
        or schedule is None
        or action is None
        or timing is None
        or env is None
        or box is None
    ):
        return None
    return JobConfig(
        code=code,
        schedule=schedule,
        action=reading.shared(action),
        guard=guard,
        timezone=zone or DEFAULT_TIMEZONE,
        timing=reading.shared(timing),
        timeout=cast(timedelta | None, merged.get("timeout", JOB["timeout"].default)),
        retries=cast(int, merged.get("retries", JOB["retries"].default)),
        on_start=cast(Hook | None, merged.get("on_start")),
        on_success=cast(Hook | None, merged.get("on_success")),
        on_failure=cast(Hook | None, merged.get("on_failure")),
        on_recovery=cast(Hook | None, merged.get("on_recovery")),
        on_missed=cast(Hook | None, merged.get("on_missed")),
        ping=cast(Ping | None, ping),
        max_duration=cast(timedelta | None, merged.get("max_duration")),
        start_deadline=cast(timedelta | None, merged.get("start_deadline")),
        pause_after_failures=cast(int | None, merged.get("pause_after_failures")),
        retry_delay=cast(timedelta, merged.get("retry_delay", DEFAULT_RETRY_DELAY)),
        min_hold=cast(timedelta, merged.get("min_hold", DEFAULT_MIN_HOLD)),
        misfire_grace=cast(timedelta, misfire_grace),
        concurrency=concurrency,
        max_concurrent=cast(int | None, merged.get("max_concurrent")),
        env=reading.shared(MappingProxyType(env)) if env else NO_ENV,
        cwd=cast(Path | None, merged.get("cwd", JOB["cwd"].default)),
        params=params,
        box=reading.shared(box),
        env_file=cast(tuple[Path, ...], merged.get("env_file", ())),
        key_hash=cast(KeyHash, key_hash or JOB["key_hash"].default),
        lock_key=code if lock_key is None else lock_key,
        description=description,
        suspended=bool(suspended),
        catch_up=cast(CatchUp, merged.get("catch_up", JOB["catch_up"].default)),
        max_catch_up=cast(int, merged.get("max_catch_up", JOB["max_catch_up"].default)),
        late_ticks=cast(LateTicks, merged.get("late_ticks", JOB["late_ticks"].default)),
        alert_after=cast(timedelta | None, merged.get("alert_after", JOB["alert_after"].default)),
        jitter=cast(timedelta, jitter),
        renamed_from=renamed_from,
        history_retention=cast(timedelta | None, merged.get("history_retention")),
        source_file=key.file,
        source_line=key.line,
    )


def read_concurrency(
    reading: Reading,
    section: Section,
    own: dict[str, object],
    merged: dict[str, object],
    guard: Guard,
) -> Concurrency:
    """The job's overlap policy; ``max_concurrent`` bounds ``allow``, which it implies."""
    bound = merged.get("max_concurrent")
    given = merged.get("concurrency")
    if INVALID in (bound, given):
        return "forbid"  # reported already; the job is not built
    concurrency = cast(
        Concurrency, given if given is not None else "allow" if bound is not None else "forbid"
    )

    def report(name: str, message: str) -> None:
        blamed = reading.blame(section, own, name)
        if blamed is not section:
            # Set by the defaults: said once there, not once per job.
            if f"overlap:{name}" in reading.reported_at_defaults:
                return
            reading.reported_at_defaults.add(f"overlap:{name}")
        reading.report(blamed, name, message, job=section.job)

    if bound is not None and concurrency != "allow":
        report(
            "max_concurrent",
            f"bounds concurrency: allow; under concurrency: {concurrency} one tick of the job "
            "runs at a time",
        )
    elif guard == "advisory" and (bound is not None or concurrency in ("replace", "buffer_one")):
        # The count of a job's running ticks, and the waiting or replaced
        # tick, are rows of the lease table: an advisory lock has none.
        report(
            "max_concurrent" if bound is not None else "concurrency",
            "needs guard: lease (the running ticks are counted in the lease table)",
        )
    return concurrency


def read_timing(
    reading: Reading,
    values: dict[str, object],
    default_values: dict[str, object],
    section: Section,
    defaults: Section | None,
) -> LeaseTiming | None:
    """Validate lease and heartbeat together, blaming whichever level set the culprit."""
    merged = {**default_values, **values}
    lease, heartbeat = merged.get("lease", DEFAULT_JOB_LEASE), merged.get("heartbeat")
    if lease is INVALID or heartbeat is INVALID:
        return None
    try:
        return LeaseTiming.build(cast(timedelta | None, lease), cast(timedelta | None, heartbeat))
    except ValidationError as exc:
        blamed = section
        if defaults is not None and exc.field not in section.values:
            blamed = defaults if exc.field in defaults.values else section
        message = str(exc).removeprefix(f"{exc.field}: ")
        reading.report(blamed, exc.field, message, job=section.job)
        return None


def check_takeover(
    reading: Reading,
    section: Section,
    own: dict[str, object],
    timing: LeaseTiming,
    grace: timedelta,
) -> None:
    """Refuse a lease that outlives the tick's window: no replica could ever take it over.

    A survivor may reclaim a tick only once the dead winner's lease has run
    out, and only until ``misfire_grace`` after the tick. The claim is made
    at the tick at the earliest, so the lease must end before the grace does.
    """
    if timing.lease < grace:
        return
    message = (
        f"lease {format_duration(timing.lease)} is not shorter than misfire_grace "
        f"{format_duration(grace)}: if the replica running a tick dies, its lease outlives "
        "the tick's window and no other replica can take the tick over, so the tick is "
        f"lost; set lease below {format_duration(grace)} or misfire_grace above "
        f"{format_duration(timing.lease)}"
    )
    blamed = next((name for name in ("lease", "misfire_grace") if name in own), None)
    if blamed is not None:
        reading.report(section, blamed, message)
        return
    defaults = reading.defaults
    set_by_defaults = [n for n in ("lease", "misfire_grace") if defaults and n in defaults.values]
    if defaults is not None and set_by_defaults:
        if "takeover" not in reading.reported_at_defaults:
            reading.reported_at_defaults.add("takeover")
            reading.report(defaults, set_by_defaults[0], message)
        return
    reading.report(section, "lease", message)
