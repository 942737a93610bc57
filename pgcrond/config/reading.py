"""One load's reading: its issues, the defaults jobs inherit, and how a field is read.

Every part of the loader reads fields through :class:`Reading`, so that a
wrong value is reported once, with its file and line, and then stands as
:data:`INVALID` (no default may hide it), and a problem is blamed on the level
that set it: the job, or ``defaults:``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TypeVar, cast

from pgcrond.config.converters import Converter, Problems
from pgcrond.config.envfiles import Read
from pgcrond.config.fields import DEFAULTABLE, JOB
from pgcrond.config.models import DEFAULT_JOB_LEASE
from pgcrond.config.yamlnodes import Issues, Section
from pgcrond.core.schedule import Calendar
from pgcrond.core.timing import LeaseTiming

T = TypeVar("T")


class Invalid:
    """Marks a value that was wrong and has been reported: no default may hide it."""


INVALID = Invalid()


class Reading:
    """What every part of one load shares: the environment, the issues, the defaults."""

    def __init__(self, environ: Mapping[str, str], *, allow_unset: bool = False) -> None:
        self.environ = environ
        self.allow_unset = allow_unset
        self.issues = Issues()
        # code -> (its section, its renamed_from): checked across jobs once all are read.
        self.renames: dict[str, tuple[Section, tuple[str, ...]]] = {}
        # Read once, so that a wrong default is reported once, not once per job.
        self.defaults: Section | None = None
        self.default_values: dict[str, object] = {}
        self.default_timing: LeaseTiming | None = LeaseTiming.build(DEFAULT_JOB_LEASE)
        # A rule broken by the defaults alone is reported once, at the defaults.
        self.reported_at_defaults: set[str] = set()
        # Linting with ${VAR}s unset: the URL is kept as written, and not checked.
        self.url_unset = False
        # The lease database's URL as the jobs will use it (an sql: job's database: must match).
        self.lease_url: str | None = None
        # The calendars: section, read before the jobs (their skip_on: names them).
        self.calendars: Mapping[str, Calendar] = {}
        self._shared: dict[object, object] = {}

    def shared(self, value: T) -> T:
        """The first equal value this load saw: equal parts of jobs (an action, a box,
        a lease timing, an environment) are one object, not one per job."""
        try:
            return cast(T, self._shared.setdefault(value, value))
        except TypeError:  # unhashable: a mapping inside
            return value

    def issue(
        self, file: str, line: int | None, job: str | None, name: str | None, message: str
    ) -> None:
        self.issues.add(file, line, job, name, message)

    def convert(self, section: Section, key: str, convert: Converter[T]) -> T | Invalid | None:
        """One field's value; None when absent, ``INVALID`` when wrong (then reported)."""
        located = section.values.get(key)
        if located is None:
            return None
        try:
            return convert(located.node)
        except Problems as exc:
            for node, message in exc.problems:
                line = int(node.start_mark.line) + 1
                self.issue(located.file, line, section.job, section.prefix + key, message)
        except ValueError as exc:
            self.issue(located.file, located.line, section.job, section.prefix + key, str(exc))
        return INVALID

    def read(self, section: Section, key: str, convert: Converter[T]) -> T | None:
        """The converted value of one field, or None when absent or wrong (then reported)."""
        value = self.convert(section, key, convert)
        return None if isinstance(value, Invalid) else value

    def read_all(self, section: Section) -> dict[str, object]:
        """The default-able fields a section sets; a wrong one becomes ``INVALID``."""
        values: dict[str, object] = {}
        for key in DEFAULTABLE:
            if key in section.values:
                values[key] = self.convert(section, key, JOB[key].convert)
        return values

    def report(self, section: Section, key: str, message: str, job: str | None = None) -> None:
        self.issues.at(section, key, message, job)

    def blame(self, section: Section, own: Mapping[str, object], name: str) -> Section:
        """The section that set ``name``: the job's own, else ``defaults:``."""
        defaults = self.defaults
        return defaults if defaults and name not in own and name in defaults.values else section

    def machine_issue(self, section: Section, name: str, message: str) -> None:
        """A problem of the machine, not of the text (a user, a file that is not here):
        an error for `run` and `check --strict`, a warning while linting."""
        if not self.allow_unset:
            self.report(section, name, message)
            return
        located = section.values.get(name)
        line = section.line if located is None else located.line
        self.issues.warn(section.file, line, section.job, section.prefix + name, message)

    def read_problems(self, section: Section, name: str, read: Read, prefix: str = "") -> bool:
        for problem in read.problems:
            self.report(section, name, prefix + problem)
        for missing in read.missing:
            self.machine_issue(section, name, prefix + missing)
        return not read.problems and not (read.missing and not self.allow_unset)

    def one_of(self, section: Section, given: list[str], what: str, allowed: str) -> None:
        if given:
            both = " and ".join(given)
            self.report(section, given[1], f"has {both}; a job has exactly one {what}: {allowed}")
        else:
            self.issue(
                section.file, section.line, section.job, what, f"no {what}: add one of {allowed}"
            )
