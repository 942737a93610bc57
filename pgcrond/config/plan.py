"""What applying a config changes against what the cluster runs: ``pgcrond plan``'s logic.

Pure: the cluster's side is the canonical definitions the live replicas
stored in the registry (:mod:`pgcrond.config.definition`), and the open ticks
per job; the clock is passed in. The command (:mod:`pgcrond.ops.plan`) reads
those and prints the result.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any
from zoneinfo import ZoneInfo

from pgcrond.config.definition import Definition, definition
from pgcrond.config.models import Config
from pgcrond.core.schedule import Schedule, from_definition, run_key_for, skip_reason

NEXT_FIRES = 5
# Fields whose change alters which ticks exist.
_SCHEDULE_FIELDS = ("schedule", "timezone")
# Not a change of what the job does: renamed_from moves rows once, at start.
_NOT_COMPARED = frozenset({"renamed_from"})


@dataclass(frozen=True)
class FieldChange:
    field: str
    before: Any
    after: Any


@dataclass(frozen=True)
class JobChange:
    """One job of the plan: ``kind`` is added, removed, renamed or changed."""

    code: str
    kind: str
    # What happens, in a sentence or two: shown under the job.
    consequence: str
    changes: list[FieldChange] = field(default_factory=list)
    renamed_from: list[str] = field(default_factory=list)
    # Schedule changes: the next fires (run keys) before and after, from now.
    fires_before: list[str] | None = None
    fires_after: list[str] | None = None
    # What produced each of fires_after: its form, and a clock change's note.
    fire_forms: list[str] | None = None
    # Of the fires up to the later list's horizon: those only after, those only before.
    fires_appearing: list[str] = field(default_factory=list)
    fires_disappearing: list[str] = field(default_factory=list)
    # Of those disappearing, each a calendar of the new schedule skips: its
    # run key -> calendar:<name> (recorded SKIPPED with it, not run).
    fires_skipped: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class Plan:
    jobs: list[JobChange]
    warnings: list[str]
    # The live replicas compared against, and the config hashes they run.
    replicas: list[str]
    config_hashes: list[str]

    @property
    def has_changes(self) -> bool:
        return bool(self.jobs)


def make_plan(
    new: Config,
    running: Mapping[str, Sequence[Definition]],
    open_ticks: Mapping[str, int],
    now: datetime,
    *,
    replicas: Sequence[str] = (),
    config_hashes: Sequence[str] = (),
    known: Collection[str] = (),
) -> Plan:
    """``running``: code -> the distinct definitions live replicas run (several during drift).

    ``open_ticks``: code -> ticks RUNNING or with a retry pending. ``known``: codes
    the cluster has history of though no definition of them was recorded: not new.
    """
    wanted = {code: definition(job) for code, job in new.jobs.items()}
    moved = {old: code for code, job in new.jobs.items() for old in job.renamed_from}
    jobs: list[JobChange] = []
    warnings: list[str] = []
    if len(config_hashes) > 1:
        warnings.append(
            f"the live replicas run {len(config_hashes)} configs (drift): a job is shown as "
            "changed when any of them runs it otherwise"
        )
    for code, after in wanted.items():
        olds = [old for old in new.jobs[code].renamed_from if old in running]
        befores = list(running.get(code, ()))
        if not befores and olds:
            befores = list(running[olds[0]])
        if not befores:
            if not olds and code not in known:
                jobs.append(_added(code, after, now))
            continue
        changes = _changes(befores, after)
        if olds and code not in running:
            jobs.append(
                _renamed(code, olds, changes=changes, before=befores[0], after=after, now=now)
            )
        elif changes:
            jobs.append(_changed(code, changes, befores[0], after, now))
        guard = next((c for c in changes if c.field == "guard"), None)
        if guard is not None and open_ticks.get(code):
            warnings.append(
                f"job {code}: guard {guard.before} -> {guard.after} while "
                f"{open_ticks[code]} tick(s) are open: the new guard does not see the old "
                "one's claims, so they may run again; let them finish (or pause the job) first"
            )
    for code in running:
        if code in wanted or code in moved:
            continue
        jobs.append(_removed(code, open_ticks.get(code, 0)))
    if unseen := sorted(set(known) & set(wanted) - set(running)):
        warnings.append(
            f"{len(unseen)} job(s) have history but no recorded definition, so what changes "
            f"in them cannot be shown: {', '.join(unseen)}"
        )
    warnings += _lookalikes(wanted, new, running)
    return Plan(jobs, warnings, list(replicas), list(config_hashes))


def _changes(befores: Sequence[Definition], after: Definition) -> list[FieldChange]:
    """Field changes against the first definition that differs (all differ alike, mostly)."""
    for before in befores:
        found = [
            FieldChange(name, before.get(name), after.get(name))
            for name in sorted(set(before) | set(after))
            if name not in _NOT_COMPARED and before.get(name) != after.get(name)
        ]
        if found:
            return found
    return []


def _added(code: str, after: Definition, now: datetime) -> JobChange:
    fires = next_fires(after, now)
    if fires is None:
        consequence = "new run-once job: runs once, at the next start of a replica with it"
    else:
        first = fires[0] if fires else "none (no tick left)"
        consequence = f"new job: its first tick is {first}, run by a replica that has it"
    return JobChange(code, "added", consequence, fires_after=fires, fire_forms=_forms(after, now))


def _removed(code: str, open_count: int) -> JobChange:
    consequence = "replicas stop firing it as they get this config; its history is kept. " + (
        f"Its {open_count} open tick(s) are followed only while a replica still has the "
        "job: after that a running one is marked FAIL/abandoned by pruning and a pending "
        "retry never runs"
        if open_count
        else "No tick of it is open"
    )
    return JobChange(code, "removed", consequence)


def _renamed(
    code: str,
    olds: list[str],
    *,
    changes: list[FieldChange],
    before: Definition,
    after: Definition,
    now: datetime,
) -> JobChange:
    consequence = (
        f"renamed from {', '.join(olds)}: its history, open ticks (with their idempotency "
        "keys), pause and run-once state move to the new code at each replica's start; "
        + (
            # storage/renames.py marks the old codes' run-once keys done.
            "a replica still on the old config finds the run-once job done under the old code "
            "and does not run it again"
            if after.get("schedule") == {"once": True}
            else "until the last old replica stops, ticks can run under both codes"
        )
    )
    job = JobChange(code, "renamed", consequence, changes, renamed_from=olds)
    return _with_fires(job, before, after, now)


def _changed(
    code: str, changes: list[FieldChange], before: Definition, after: Definition, now: datetime
) -> JobChange:
    names = ", ".join(c.field for c in changes)
    consequence = f"changed: {names}; each replica applies it at its next start or reload"
    if any(c.field in _SCHEDULE_FIELDS for c in changes):
        consequence += (
            ". While replicas disagree, each fires its own schedule: both schedules' ticks can run"
        )
    if any(c.field == "guard" for c in changes):
        consequence += (
            ". While replicas disagree, the two guards do not see each other: a tick can run twice"
        )
    return _with_fires(JobChange(code, "changed", consequence, changes), before, after, now)


def _with_fires(job: JobChange, before: Definition, after: Definition, now: datetime) -> JobChange:
    if not any(c.field in _SCHEDULE_FIELDS for c in job.changes):
        return job
    fires_before, fires_after = next_fires(before, now), next_fires(after, now)
    appearing, disappearing = _difference(before, after, now)
    schedule = _schedule(after)
    skipped = {
        fire: reason
        for fire in disappearing
        if (reason := skip_reason(schedule, datetime.fromisoformat(fire))) is not None
    }
    return JobChange(
        job.code,
        job.kind,
        job.consequence,
        job.changes,
        job.renamed_from,
        fires_before,
        fires_after,
        _forms(after, now),
        appearing,
        disappearing,
        skipped,
    )


def _schedule(job: Definition) -> Schedule:
    return from_definition(job["schedule"], ZoneInfo(job["timezone"]))


def next_fires(job: Definition, now: datetime, count: int = NEXT_FIRES) -> list[str] | None:
    """The next ``count`` ticks (run keys) of a canonical definition; None for run-once."""
    if "once" in job["schedule"]:
        return None
    fires: list[str] = []
    schedule = _schedule(job)
    moment: datetime | None = now
    while moment is not None and len(fires) < count:
        moment = schedule.next_after(moment)
        if moment is not None:
            fires.append(run_key_for(moment))
    return fires


def _forms(job: Definition, now: datetime) -> list[str] | None:
    """What made each of :func:`next_fires`: the form, and a clock change's note."""
    if "once" in job["schedule"]:
        return None
    fires = next_fires(job, now) or []
    schedule = _schedule(job)
    forms = []
    for fire in fires:
        tick = datetime.fromisoformat(fire)
        occasion = schedule.occasion_after(tick - timedelta(seconds=1))
        assert occasion is not None and occasion.tick == tick
        forms.append(occasion.form + (f"; {occasion.dst}" if occasion.dst else ""))
    return forms


def _difference(
    before: Definition, after: Definition, now: datetime
) -> tuple[list[str], list[str]]:
    """The fires only the new schedule has, and those only the old one had.

    Compared up to the nearer of the two lists' horizons, so that a fire
    beyond one list's end is not taken for a change.
    """
    old, new = next_fires(before, now) or [], next_fires(after, now) or []
    horizon = min([fires[-1] for fires in (old, new) if len(fires) == NEXT_FIRES], default="9999")
    appearing = [f for f in new if f <= horizon and f not in old]
    disappearing = [f for f in old if f <= horizon and f not in new]
    return appearing, disappearing


def _lookalikes(
    wanted: Mapping[str, Definition], new: Config, running: Mapping[str, Sequence[Definition]]
) -> list[str]:
    """Added jobs that look like a removed one renamed without ``renamed_from``."""
    named = {old for job in new.jobs.values() for old in job.renamed_from}
    removed = {
        code: defs for code, defs in running.items() if code not in wanted and code not in named
    }
    warnings = []
    for code, after in wanted.items():
        if code in running or new.jobs[code].renamed_from:
            continue
        for old, befores in removed.items():
            if not any(before["action"] == after["action"] for before in befores):
                continue
            if "once" in after["schedule"]:
                warnings.append(
                    f"job {code}: a run-once job with the action of removed job {old}: without "
                    f"renamed_from: [{old}] it runs again at the next start"
                )
            else:
                warnings.append(
                    f"job {code}: has the action of removed job {old}: if it is a rename, add "
                    f"renamed_from: [{old}] to keep its history and pause"
                )
    return warnings
