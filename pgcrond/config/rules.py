"""Rules across jobs and the top level: renamed codes, and the history kept long enough."""

from __future__ import annotations

from collections.abc import Mapping
from datetime import timedelta

from pgcrond.config.fields import MIN_HISTORY_RETENTION
from pgcrond.config.models import DEFAULT_HISTORY_RETENTION, JobConfig, min_history_retention
from pgcrond.config.reading import Reading
from pgcrond.config.sources import code_problem
from pgcrond.config.yamlnodes import Located, Section
from pgcrond.core.durations import format_duration


def check_renames(reading: Reading, jobs: Mapping[str, tuple[Located, Located]]) -> None:
    """Each old code moves to one job, is no job of this config, and leads to no cycle.

    A rename runs at start (storage/renames.py): an old code that is still a
    job, or that two jobs claim, would move one job's history under another.
    """
    claimed: dict[str, str] = {}
    for code, (section, olds) in reading.renames.items():
        for old in olds:
            problem = code_problem(old)
            if problem is not None:
                reading.report(section, "renamed_from", f"{old!r}: {problem}", job=code)
            elif old == code:
                reading.report(section, "renamed_from", "names this job's own code", job=code)
            elif code in _renamed_chain(reading, old):
                reading.report(
                    section,
                    "renamed_from",
                    f"{old!r} is a cycle: {old!r} is renamed from {code!r} in turn; "
                    "a job code can only move forward to a new one",
                    job=code,
                )
            elif old in jobs:
                at = jobs[old][0]
                reading.report(
                    section,
                    "renamed_from",
                    f"{old!r} is still a job of this config ({at.file}:{at.line}): "
                    "remove that job, or this entry, since its history would move here",
                    job=code,
                )
            elif old in claimed:
                first = jobs[claimed[old]][0]
                reading.report(
                    section,
                    "renamed_from",
                    f"{old!r} is also in the renamed_from of job {claimed[old]!r} "
                    f"({first.file}:{first.line}): an old code can move to one job only",
                    job=code,
                )
            else:
                claimed[old] = code


def _renamed_chain(reading: Reading, code: str) -> set[str]:
    """Every code that ``code`` is renamed from, directly or through others."""
    seen: set[str] = set()
    todo = [code]
    while todo:
        for old in reading.renames.get(todo.pop(), (None, ()))[1]:
            if old not in seen:
                seen.add(old)
                todo.append(old)
    return seen


def check_retention(
    reading: Reading, top: Section, retention: timedelta | None, jobs: Mapping[str, JobConfig]
) -> None:
    """Refuse a history_retention that would let pruning run a tick twice.

    The default is checked too (then blamed on the first file): a job whose
    misfire_grace is weeks long needs a longer retention than 30 days.
    Jobs that failed to load are not counted; their issues come first anyway.
    """
    minimum = min_history_retention(jobs)
    value = DEFAULT_HISTORY_RETENTION if retention is None else retention
    if value >= minimum:
        return
    if minimum == MIN_HISTORY_RETENTION:
        why = "the floor"
    else:
        longest = max(jobs.values(), key=lambda job: job.misfire_grace + job.timing.lease)
        why = f"misfire_grace + lease of job {longest.code!r}"
    shown = format_duration(value)
    default = "" if retention is not None else f"the default {shown} is short; "
    reading.report(
        top,
        "history_retention",
        f"{default}must be at least {format_duration(minimum)} ({why}): a finished run "
        "deleted sooner can be claimed afresh by a late replica and run twice",
    )
