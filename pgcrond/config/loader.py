"""YAML files -> frozen, validated :class:`Config`.

Everything the rest of pgcrond trusts is checked here, once, at start: a
mistake found later (an entrypoint that does not import, a heartbeat that lets
a lease expire) would surface at 3 a.m. instead. The loader works on YAML
nodes rather than plain values so that every problem can name its file and
line, and it keeps going after a problem so that one run of ``pgcrond check``
reports all of them.
"""

from __future__ import annotations

import difflib
import os
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from pathlib import Path
from types import MappingProxyType
from typing import Literal, TypeVar, cast, get_args
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError, available_timezones

import yaml

from pgcrond.core.actions import Action, CommandAction, EntrypointAction, ShellAction
from pgcrond.core.durations import format_duration, parse_duration
from pgcrond.core.keys import BIGINT_MAX, BIGINT_MIN, Identity, KeyHash
from pgcrond.core.redaction import redact
from pgcrond.core.schedule import (
    AtSchedule,
    CronSchedule,
    OnceSchedule,
    Schedule,
    local_to_instant,
)
from pgcrond.core.timing import LeaseTiming
from pgcrond.errors import ConfigError, ConfigIssue, ValidationError
from pgcrond.run.entrypoints import EntrypointError, resolve

__all__ = [
    "Action",
    "CommandAction",
    "Config",
    "DatabaseConfig",
    "EntrypointAction",
    "JobConfig",
    "ShellAction",
    "load_config",
    "min_history_retention",
]

Guard = Literal["lease", "advisory"]
Concurrency = Literal["forbid", "allow"]

DATABASE_URL_ENV = "PGCROND_DATABASE_URL"
DEFAULT_HTTP_LISTEN = "127.0.0.1:9464"
DEFAULT_SHUTDOWN_GRACE = timedelta(seconds=30)
DEFAULT_HISTORY_RETENTION = timedelta(days=30)
DEFAULT_RETRY_DELAY = timedelta(seconds=30)
DEFAULT_MIN_HOLD = timedelta(seconds=5)
# A job's lease must be able to run out within its misfire grace, or a dead
# winner's tick could never be taken over: 1 min lease (heartbeat every 20 s),
# 5 min grace. The library's own default lease stays the reference's 15 min.
DEFAULT_JOB_LEASE = timedelta(minutes=1)
DEFAULT_MISFIRE_GRACE = timedelta(minutes=5)
# The floor of history_retention whatever the jobs say; see min_history_retention.
MIN_HISTORY_RETENTION = timedelta(hours=1)
_IDENTIFIER = re.compile(r"^[a-z_][a-z0-9_]{0,62}$")
_MERGE_TAG = "tag:yaml.org,2002:merge"
_INTERPOLATION = re.compile(r"\$\$|\$\{([^}:]*)(?::-([^}]*))?\}|\$\{")

TOP_KEYS = ("database", "defaults", "jobs", "http", "shutdown_grace", "history_retention")
DATABASE_KEYS = ("url", "embedded", "state_dir", "schema", "table")
HTTP_KEYS = ("listen",)
DEFAULT_KEYS = (
    "guard",
    "timezone",
    "lease",
    "heartbeat",
    "timeout",
    "retries",
    "retry_delay",
    "min_hold",
    "misfire_grace",
    "concurrency",
    "env",
    "cwd",
)
SCHEDULE_KEYS = ("cron", "once", "at")
ACTION_KEYS = ("command", "shell", "entrypoint")
JOB_KEYS = (
    *SCHEDULE_KEYS,
    *ACTION_KEYS,
    *DEFAULT_KEYS,
    "isolate",
    "key_hash",
    "lock_key",
    "description",
)


@dataclass(frozen=True)
class DatabaseConfig:
    """Where the lease table lives: a URL, or a local server pgcrond starts (``embedded``)."""

    url: str | None
    embedded: bool = False
    state_dir: Path = Path(".pgcrond")
    schema: str = "pgcrond"
    table: str = "leases"

    @property
    def redacted_url(self) -> str | None:
        """The URL with its password replaced by ``***``: the only form fit for logs."""
        return None if self.url is None else redact(self.url)

    def __repr__(self) -> str:
        # The default repr would print the password into any log or traceback.
        return (
            f"DatabaseConfig(url={self.redacted_url!r}, embedded={self.embedded!r}, "
            f"state_dir={self.state_dir!r}, schema={self.schema!r}, table={self.table!r})"
        )


@dataclass(frozen=True)
class JobConfig:
    """One job, with the defaults already applied."""

    code: str
    schedule: Schedule
    action: Action
    guard: Guard = "lease"
    timezone: ZoneInfo = field(default_factory=lambda: ZoneInfo("UTC"))
    timing: LeaseTiming = field(default_factory=lambda: LeaseTiming.build(DEFAULT_JOB_LEASE))
    timeout: timedelta | None = None
    retries: int = 0
    retry_delay: timedelta = DEFAULT_RETRY_DELAY
    min_hold: timedelta = DEFAULT_MIN_HOLD
    misfire_grace: timedelta = DEFAULT_MISFIRE_GRACE
    concurrency: Concurrency = "forbid"
    env: Mapping[str, str] = field(default_factory=lambda: MappingProxyType({}))
    cwd: Path | None = None
    key_hash: KeyHash = "pgcrond"
    # None means "the job code"; filled in below so that users of the field never see None.
    lock_key: str | int | None = None
    description: str | None = None
    source: str = "<code>"

    def __post_init__(self) -> None:
        if self.lock_key is None:
            object.__setattr__(self, "lock_key", self.code)

    @property
    def is_once(self) -> bool:
        """A run-once job: attempted at start under the INITIAL identity, never on a tick."""
        return isinstance(self.schedule, OnceSchedule)


@dataclass(frozen=True)
class Config:
    files: tuple[str, ...]
    database: DatabaseConfig
    jobs: Mapping[str, JobConfig]
    http_listen: str = DEFAULT_HTTP_LISTEN
    shutdown_grace: timedelta = DEFAULT_SHUTDOWN_GRACE
    history_retention: timedelta = DEFAULT_HISTORY_RETENTION


def min_history_retention(jobs: Mapping[str, JobConfig]) -> timedelta:
    """The shortest safe ``history_retention``: pruning younger rows can run a tick twice.

    A replica may still claim a tick up to ``misfire_grace`` after it (a late
    fire, or a takeover once the holder's ``lease`` ran out). If the finished
    row of that tick is gone by then, the claim finds no row and runs the tick
    afresh. So a row must outlive the longest ``misfire_grace + lease`` of any
    job, and never less than :data:`MIN_HISTORY_RETENTION` (1 hour).
    """
    return max(
        [MIN_HISTORY_RETENTION, *(job.misfire_grace + job.timing.lease for job in jobs.values())]
    )


def load_config(
    paths: Sequence[str | Path],
    *,
    environ: Mapping[str, str] = os.environ,
    database_url: str | None = None,
) -> Config:
    """Read, merge and validate config files; raise :class:`ConfigError` with ALL issues.

    ``database_url`` (from ``--database-url``) beats ``PGCROND_DATABASE_URL``
    in ``environ``, which beats ``database.url`` in the files.
    """
    loader = _Loader(environ)
    files = loader.expand(paths)
    for path in files:
        loader.read_file(path)
    config = loader.build(files, database_url)
    if loader.issues or config is None:
        raise ConfigError(loader.issues)
    return config


# --------------------------------------------------------------------------------------
# Reading nodes


@dataclass(frozen=True)
class _Located:
    """A YAML node and the file it was read from."""

    file: str
    node: yaml.Node

    @property
    def line(self) -> int:
        return int(self.node.start_mark.line) + 1


@dataclass(frozen=True)
class _Section:
    """The known fields of one mapping (unknown and duplicate keys already reported).

    ``line`` is where a missing field is blamed: the job's key, the section's
    key, or None when the whole section is absent.
    """

    file: str
    line: int | None
    job: str | None
    prefix: str
    values: dict[str, _Located]


class _Invalid:
    """Marks a value that was wrong and has been reported: no default may hide it."""


_INVALID = _Invalid()
T = TypeVar("T")


class _Loader:
    def __init__(self, environ: Mapping[str, str]) -> None:
        self.environ = environ
        self.issues: list[ConfigIssue] = []
        self.top: dict[str, _Located] = {}
        self.jobs: dict[str, tuple[_Located, _Located]] = {}  # code -> (key, definition)
        # Read once, so that a wrong default is reported once, not once per job.
        self.defaults: _Section | None = None
        self.default_values: dict[str, object] = {}
        self.default_timing: LeaseTiming | None = LeaseTiming.build(DEFAULT_JOB_LEASE)
        # A file that cannot be read may hold the database section: do not also claim it is missing.
        self.unreadable = False

    def issue(
        self, file: str, line: int | None, job: str | None, name: str | None, message: str
    ) -> None:
        self.issues.append(ConfigIssue(file, line, job, name, message))

    # -- files -----------------------------------------------------------------------

    def expand(self, paths: Sequence[str | Path]) -> list[str]:
        """Files in the order given; a directory contributes its ``*.yaml``/``*.yml``, sorted."""
        files: list[str] = []
        if not paths:
            self.issue("<arguments>", None, None, None, "no config file given; pass -c PATH")
        for raw in paths:
            path = Path(raw)
            if path.is_dir():
                found = sorted(p for p in path.iterdir() if p.suffix in (".yaml", ".yml"))
                if not found:
                    self.issue(str(path), None, None, None, "directory has no *.yaml or *.yml file")
                files.extend(str(p) for p in found)
            elif path.exists():
                files.append(str(path))
            else:
                self.issue(str(path), None, None, None, "no such file or directory")
        return files

    def read_file(self, file: str) -> None:
        try:
            text = Path(file).read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as exc:
            self.issue(file, None, None, None, f"cannot read: {exc}")
            self.unreadable = True
            return
        try:
            root = yaml.compose(text, Loader=yaml.SafeLoader)
        except yaml.YAMLError as exc:
            mark = getattr(exc, "problem_mark", None)
            line = None if mark is None else int(mark.line) + 1
            problem = getattr(exc, "problem", None) or str(exc)
            self.issue(file, line, None, None, f"YAML syntax error: {problem}")
            self.unreadable = True
            return
        if root is None:
            return  # an empty file adds nothing, which is fine in a directory of files
        top = self.section(_Located(file, root), 1, None, "", TOP_KEYS)
        if top is None:
            return
        for key, value in top.values.items():
            if key == "jobs":
                self.collect_jobs(value)
            elif key in self.top:
                first = self.top[key]
                self.issue(
                    file,
                    value.line,
                    None,
                    key,
                    f"already set in {first.file}:{first.line}; top-level sections other "
                    "than jobs may appear in one file only",
                )
            else:
                self.top[key] = value

    def collect_jobs(self, jobs: _Located) -> None:
        if not isinstance(jobs.node, yaml.MappingNode):
            self.issue(jobs.file, jobs.line, None, "jobs", _mapping_expected(jobs.node, "code"))
            return
        for key, value in self.pairs(jobs, None, "jobs"):
            code = str(key.node.value)
            message = _code_problem(code)
            if message is not None:
                self.issue(key.file, key.line, code, None, message)
            elif code in self.jobs:
                first = self.jobs[code][0]
                self.issue(
                    key.file,
                    key.line,
                    code,
                    None,
                    f"job code defined twice: first at {first.file}:{first.line}, "
                    f"again at {key.file}:{key.line}; job codes must be unique across files",
                )
            else:
                self.jobs[code] = (key, value)

    def pairs(
        self, mapping: _Located, job: str | None, name: str | None
    ) -> list[tuple[_Located, _Located]]:
        """Key and value nodes of a mapping node, YAML merge keys (``<<``) applied.

        Keys written in the mapping win over merged ones, as the merge-key spec
        says; only they can be duplicates worth reporting.
        """
        explicit: list[tuple[_Located, _Located]] = []
        merged: list[tuple[_Located, _Located]] = []
        node = mapping.node
        if not isinstance(node, yaml.MappingNode):
            return explicit
        for key_node, value_node in node.value:
            key, value = _Located(mapping.file, key_node), _Located(mapping.file, value_node)
            if key_node.tag == _MERGE_TAG:
                sources = (
                    value_node.value if isinstance(value_node, yaml.SequenceNode) else [value_node]
                )
                for source in sources:
                    if isinstance(source, yaml.MappingNode):
                        merged.extend(self.pairs(_Located(mapping.file, source), job, name))
                    else:
                        self.issue(mapping.file, key.line, job, name, "<< must merge a mapping")
            elif isinstance(key_node, yaml.ScalarNode):
                explicit.append((key, value))
            else:
                self.issue(mapping.file, key.line, job, name, "keys must be plain text")
        seen = {str(key.node.value) for key, _ in explicit}
        for key, value in merged:
            if str(key.node.value) not in seen:
                seen.add(str(key.node.value))
                explicit.append((key, value))
        return explicit

    def section(
        self,
        mapping: _Located,
        line: int | None,
        job: str | None,
        prefix: str,
        allowed: Sequence[str],
    ) -> _Section | None:
        name = prefix.rstrip(".") or None
        if not isinstance(mapping.node, yaml.MappingNode):
            self.issue(mapping.file, mapping.line, job, name, _mapping_expected(mapping.node))
            return None
        values: dict[str, _Located] = {}
        lines: dict[str, int] = {}
        for key, value in self.pairs(mapping, job, name):
            text = str(key.node.value)
            if text in lines:
                message = f"duplicate key {text!r} (first at line {lines[text]})"
                self.issue(mapping.file, key.line, job, prefix + text, message)
            elif text in allowed:
                values[text] = value
                lines[text] = key.line
            else:
                close = difflib.get_close_matches(text, allowed, n=1)
                hint = f"did you mean {close[0]!r}?" if close else f"allowed: {', '.join(allowed)}"
                self.issue(
                    mapping.file, key.line, job, prefix + text, f"unknown key {text!r}; {hint}"
                )
        return _Section(mapping.file, line, job, prefix, values)

    def read(self, section: _Section, key: str, convert: Callable[[yaml.Node], T]) -> T | None:
        """The converted value of one field, or None when absent or wrong (then reported)."""
        located = section.values.get(key)
        if located is None:
            return None
        try:
            return convert(located.node)
        except ValueError as exc:
            self.issue(located.file, located.line, section.job, section.prefix + key, str(exc))
            return None

    def read_all(self, section: _Section) -> dict[str, object]:
        """The default-able fields a section sets; a wrong one becomes ``_INVALID``."""
        values: dict[str, object] = {}
        for key, convert in _DEFAULT_CONVERTERS.items():
            located = section.values.get(key)
            if located is None:
                continue
            try:
                values[key] = convert(located.node)
            except ValueError as exc:
                self.issue(located.file, located.line, section.job, section.prefix + key, str(exc))
                values[key] = _INVALID
        return values

    def report(self, section: _Section, key: str, message: str, job: str | None = None) -> None:
        located = section.values.get(key)
        file, line = (
            (section.file, section.line) if located is None else (located.file, located.line)
        )
        self.issue(file, line, job or section.job, section.prefix + key, message)

    # -- building ----------------------------------------------------------------------

    def build(self, files: list[str], database_url: str | None) -> Config | None:
        first_file = files[0] if files else "<arguments>"

        def top_section(key: str, allowed: Sequence[str]) -> _Section | None:
            value = self.top.get(key)
            if value is None:
                return _Section(first_file, None, None, f"{key}.", {})
            return self.section(value, value.line, None, f"{key}.", allowed)

        database = self.database(top_section("database", DATABASE_KEYS), database_url)
        defaults = top_section("defaults", DEFAULT_KEYS)
        http = top_section("http", HTTP_KEYS)
        top = _Section(first_file, None, None, "", self.top)
        http_listen = DEFAULT_HTTP_LISTEN
        if http is not None and "listen" in http.values:
            http_listen = self.read(http, "listen", _listen) or ""
        shutdown_grace = self.read(top, "shutdown_grace", _duration)
        history_retention = self.read(top, "history_retention", _positive_duration)

        self.defaults = defaults
        if defaults is not None:
            self.default_values = self.read_all(defaults)
            self.default_timing = self.timing(self.default_values, {}, defaults, defaults)
        jobs: dict[str, JobConfig] = {}
        for code, (key, value) in self.jobs.items():
            job = self.job(code, key, value)
            if job is not None:
                jobs[code] = job
        if not self.jobs and not self.issues:
            self.issue(
                first_file, None, None, "jobs", "no jobs defined; add at least one under jobs:"
            )
        # A wrong value (reported already) is not also "too short" as the default would be.
        if history_retention is not None or "history_retention" not in top.values:
            self.check_retention(top, history_retention, jobs)
        if self.issues or database is None:
            return None
        return Config(
            files=tuple(files),
            database=database,
            jobs=MappingProxyType(jobs),
            http_listen=http_listen,
            shutdown_grace=shutdown_grace or DEFAULT_SHUTDOWN_GRACE,
            history_retention=history_retention or DEFAULT_HISTORY_RETENTION,
        )

    def check_retention(
        self, top: _Section, retention: timedelta | None, jobs: Mapping[str, JobConfig]
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
        self.report(
            top,
            "history_retention",
            f"{default}must be at least {format_duration(minimum)} ({why}): a finished run "
            "deleted sooner can be claimed afresh by a late replica and run twice",
        )

    def database(self, section: _Section | None, database_url: str | None) -> DatabaseConfig | None:
        if section is None:
            return None
        file_url = self.read(section, "url", _string)
        embedded = self.read(section, "embedded", _bool) or False
        schema = self.read(section, "schema", _identifier) or "pgcrond"
        table = self.read(section, "table", _identifier) or "leases"
        state_dir = self.read(section, "state_dir", _path) or Path(".pgcrond")
        # An override wins over the whole file choice, embedded included: the
        # same config then serves a laptop (embedded) and production (URL in env).
        override = database_url or self.environ.get(DATABASE_URL_ENV) or None
        url = override
        if embedded and file_url is not None:
            self.report(section, "url", "set either url or embedded: true, not both")
        elif override is None and file_url is not None:
            url = self.interpolate(section, file_url)
        elif (
            override is None
            and not embedded
            and "url" not in section.values
            and not self.unreadable
        ):
            self.issue(
                section.file,
                section.line,
                None,
                "database",
                f"no database: set database.url (e.g. url: ${{{DATABASE_URL_ENV}}}), "
                f"set {DATABASE_URL_ENV}, pass --database-url, or use embedded: true "
                "for a local server pgcrond starts itself",
            )
        return DatabaseConfig(
            url=url,
            embedded=embedded and override is None,
            state_dir=state_dir,
            schema=schema,
            table=table,
        )

    def interpolate(self, section: _Section, text: str) -> str | None:
        """``${VAR}``, ``${VAR:-default}`` and ``$$`` (a literal ``$``), from ``environ``."""
        missing: list[str] = []
        malformed: list[str] = []

        def substitute(match: re.Match[str]) -> str:
            if match.group(0) == "$$":
                return "$"
            name, default = match.group(1), match.group(2)
            if name is None or not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", name):
                malformed.append(match.group(0))
                return ""
            value = self.environ.get(name)
            if value:
                return value
            if default is not None:
                return default
            if value is None:
                missing.append(name)
            return ""

        result = _INTERPOLATION.sub(substitute, text)
        for bad in malformed:
            self.report(
                section,
                "url",
                f"malformed {bad!r}: write ${{NAME}} or ${{NAME:-default}} ($$ for $)",
            )
        for name in missing:
            self.report(
                section,
                "url",
                f"environment variable {name} is not set; set it, or write ${{{name}:-default}}",
            )
        return None if missing or malformed else result

    def timing(
        self,
        values: dict[str, object],
        default_values: dict[str, object],
        section: _Section,
        defaults: _Section | None,
    ) -> LeaseTiming | None:
        """Validate lease and heartbeat together, blaming whichever level set the culprit."""
        merged = {**default_values, **values}
        lease, heartbeat = merged.get("lease", DEFAULT_JOB_LEASE), merged.get("heartbeat")
        if lease is _INVALID or heartbeat is _INVALID:
            return None
        try:
            return LeaseTiming.build(
                cast(timedelta | None, lease), cast(timedelta | None, heartbeat)
            )
        except ValidationError as exc:
            blamed = section
            if defaults is not None and exc.field not in section.values:
                blamed = defaults if exc.field in defaults.values else section
            message = str(exc).removeprefix(f"{exc.field}: ")
            self.report(blamed, exc.field, message, job=section.job)
            return None

    def job(self, code: str, key: _Located, definition: _Located) -> JobConfig | None:
        defaults, default_values = self.defaults, self.default_values
        before = len(self.issues)
        section = self.section(definition, key.line, code, "", JOB_KEYS)
        if section is None:
            return None
        own = self.read_all(section)
        merged = {**default_values, **own}
        if isinstance(merged.get("env"), dict) and isinstance(default_values.get("env"), dict):
            merged["env"] = {
                **cast(dict[str, str], default_values["env"]),
                **cast(dict[str, str], merged["env"]),
            }
        zone = merged.get("timezone")
        zone = zone if isinstance(zone, ZoneInfo) else None
        if own.keys() & {"lease", "heartbeat"} or not default_values.keys() & {
            "lease",
            "heartbeat",
        }:
            timing = self.timing(own, default_values, section, defaults)
        else:
            timing = self.default_timing  # its problems were reported once, at the defaults
        schedule = self.schedule(section, zone)
        action = self.action(section)
        guard = merged.get("guard", "lease")
        key_hash = self.read(section, "key_hash", _choice(KeyHash))
        lock_key = self.read(section, "lock_key", _lock_key)
        description = self.read(section, "description", _string)
        if guard != "advisory":
            for name in ("key_hash", "lock_key"):
                if name in section.values:
                    self.report(section, name, "only used with guard: advisory")
        if (
            len(self.issues) > before
            or _INVALID in merged.values()
            or schedule is None
            or action is None
            or timing is None
        ):
            return None
        return JobConfig(
            code=code,
            schedule=schedule,
            action=action,
            guard=cast(Guard, guard),
            timezone=zone or ZoneInfo("UTC"),
            timing=timing,
            timeout=cast(timedelta | None, merged.get("timeout")),
            retries=cast(int, merged.get("retries", 0)),
            retry_delay=cast(timedelta, merged.get("retry_delay", DEFAULT_RETRY_DELAY)),
            min_hold=cast(timedelta, merged.get("min_hold", DEFAULT_MIN_HOLD)),
            misfire_grace=cast(timedelta, merged.get("misfire_grace", DEFAULT_MISFIRE_GRACE)),
            concurrency=cast(Concurrency, merged.get("concurrency", "forbid")),
            env=MappingProxyType(cast(dict[str, str], merged.get("env", {}))),
            cwd=cast(Path | None, merged.get("cwd")),
            key_hash=cast(KeyHash, key_hash or "pgcrond"),
            lock_key=code if lock_key is None else lock_key,
            description=description,
            source=f"{key.file}:{key.line}",
        )

    def schedule(self, section: _Section, zone: ZoneInfo | None) -> Schedule | None:
        given = [k for k in SCHEDULE_KEYS if k in section.values]
        if len(given) != 1:
            self.one_of(section, given, "schedule", "cron: '...', once: true or at: <ISO datetime>")
            return None
        # With a bad time zone (reported already) the expression is still worth checking.
        effective = zone or ZoneInfo("UTC")
        if given == ["cron"]:
            expression = self.read(section, "cron", _string)
            if expression is None:
                return None
            try:
                return CronSchedule.parse(expression, effective)
            except ValueError as exc:
                self.report(section, "cron", str(exc))
                return None
        if given == ["once"]:
            once = self.read(section, "once", _bool)
            if once is False:
                self.report(section, "once", "once: false is no schedule; remove it or use cron:")
            return OnceSchedule() if once else None
        at = self.read(section, "at", _datetime)
        if at is None:
            return None
        return AtSchedule(local_to_instant(at, effective) if at.tzinfo is None else at)

    def action(self, section: _Section) -> Action | None:
        given = [k for k in ACTION_KEYS if k in section.values]
        isolate = self.read(section, "isolate", _bool)
        if isolate is not None and given != ["entrypoint"]:
            self.report(section, "isolate", "only used with entrypoint:")
        if len(given) != 1:
            self.one_of(section, given, "action", "command: [argv...], shell: '...' or entrypoint:")
            return None
        if given == ["command"]:
            argv = self.read(section, "command", _argv)
            return None if argv is None else CommandAction(argv)
        if given == ["shell"]:
            script = self.read(section, "shell", _nonempty_string)
            return None if script is None else ShellAction(script)
        target = self.read(section, "entrypoint", _nonempty_string)
        if target is None:
            return None
        try:
            resolve(target)
        except EntrypointError as exc:
            self.report(section, "entrypoint", str(exc))
            return None
        return EntrypointAction(target, isolate=bool(isolate))

    def one_of(self, section: _Section, given: list[str], what: str, allowed: str) -> None:
        if given:
            both = " and ".join(given)
            self.report(section, given[1], f"has {both}; a job has exactly one {what}: {allowed}")
        else:
            self.issue(
                section.file, section.line, section.job, what, f"no {what}: add one of {allowed}"
            )


# --------------------------------------------------------------------------------------
# Converters: node -> value, raising ValueError with a message that says what is allowed.


def _scalar(node: yaml.Node) -> object:
    if not isinstance(node, yaml.ScalarNode):
        raise ValueError(f"expected a single value, got {_kind(node)}")
    return yaml.SafeLoader("").construct_object(node)


def _kind(node: yaml.Node | object) -> str:
    if isinstance(node, yaml.MappingNode):
        return "a mapping"
    if isinstance(node, yaml.SequenceNode):
        return "a list"
    if isinstance(node, yaml.ScalarNode):
        node = yaml.SafeLoader("").construct_object(node)
    if node is None:
        return "nothing (null)"
    if isinstance(node, bool):
        return f"a boolean ({str(node).lower()})"
    if isinstance(node, int | float):
        return f"a number ({node})"
    if isinstance(node, str):
        return "text"
    return f"a {type(node).__name__}"


def _string(node: yaml.Node) -> str:
    value = _scalar(node)
    if not isinstance(value, str):
        raise ValueError(f"must be text, got {_kind(node)}; quote it")
    return value


def _nonempty_string(node: yaml.Node) -> str:
    value = _string(node)
    if not value.strip():
        raise ValueError("must not be empty")
    return value


def _bool(node: yaml.Node) -> bool:
    value = _scalar(node)
    if not isinstance(value, bool):
        raise ValueError(f"must be true or false, got {_kind(node)}")
    return value


def _count(node: yaml.Node) -> int:
    value = _scalar(node)
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ValueError(f"must be a whole number 0 or more, got {_kind(node)}")
    return value


def _duration(node: yaml.Node) -> timedelta:
    return parse_duration(_scalar(node))


def _positive_duration(node: yaml.Node) -> timedelta:
    value = _duration(node)
    if value <= timedelta(0):
        raise ValueError("must be longer than 0")
    return value


def _timeout(node: yaml.Node) -> timedelta | None:
    if _scalar(node) is None:
        return None
    value = _duration(node)
    if value <= timedelta(0):
        raise ValueError("must be longer than 0; leave it out (or null) for no timeout")
    return value


def _choice(kind: object) -> Callable[[yaml.Node], str]:
    options: tuple[str, ...] = get_args(kind)

    def convert(node: yaml.Node) -> str:
        value = _scalar(node)
        if value not in options:
            shown = repr(value) if isinstance(value, str) else _kind(node)
            raise ValueError(f"{shown} is not one of: {', '.join(options)}")
        return value

    return convert


def _zone(node: yaml.Node) -> ZoneInfo:
    name = _string(node)
    try:
        return ZoneInfo(name)
    except (ZoneInfoNotFoundError, ValueError):
        close = difflib.get_close_matches(name, available_timezones(), n=1)
        hint = f"did you mean {close[0]!r}?" if close else "e.g. 'Europe/Berlin' or 'UTC'"
        raise ValueError(f"unknown time zone {name!r}; use an IANA name, {hint}") from None


def _path(node: yaml.Node) -> Path:
    return Path(_nonempty_string(node))


def _identifier(node: yaml.Node) -> str:
    value = _string(node)
    if not _IDENTIFIER.match(value):
        raise ValueError(
            f"{value!r} is not a plain SQL identifier: lower-case letters, digits and _, "
            "not starting with a digit, at most 63 characters"
        )
    return value


def _listen(node: yaml.Node) -> str:
    value = _string(node)
    if value == "":
        return value
    host, colon, port = value.rpartition(":")
    if not colon or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise ValueError(f"{value!r} is not HOST:PORT (e.g. 127.0.0.1:9464); '' turns HTTP off")
    return value


def _env(node: yaml.Node) -> dict[str, str]:
    if not isinstance(node, yaml.MappingNode):
        raise ValueError(f"must be a mapping of NAME: value, got {_kind(node)}")
    env: dict[str, str] = {}
    for key_node, value_node in node.value:
        name = str(key_node.value)
        if not name or "=" in name or "\0" in name:
            raise ValueError(f"{name!r} is not a valid variable name")
        value = _scalar(value_node)
        if not isinstance(value, str):
            raise ValueError(f"{name}: must be text, got {_kind(value_node)}; quote it")
        env[name] = value
    return env


def _argv(node: yaml.Node) -> tuple[str, ...]:
    if not isinstance(node, yaml.SequenceNode):
        raise ValueError(
            f"must be a list of arguments like ['/bin/echo', 'hi'], got {_kind(node)}; "
            "use shell: for a command line"
        )
    argv = []
    for index, item in enumerate(node.value):
        value = _scalar(item)
        if not isinstance(value, str):
            raise ValueError(f"argument {index} must be text, got {_kind(item)}; quote it")
        argv.append(value)
    if not argv or not argv[0]:
        raise ValueError("must name a program: ['/bin/echo', 'hi']")
    return tuple(argv)


def _lock_key(node: yaml.Node) -> str | int:
    value = _scalar(node)
    if isinstance(value, bool) or not isinstance(value, str | int):
        raise ValueError(f"must be text or a whole number, got {_kind(node)}")
    if isinstance(value, int) and not BIGINT_MIN <= value <= BIGINT_MAX:
        raise ValueError("must fit a signed 64-bit integer")
    if isinstance(value, str) and not value:
        raise ValueError("must not be empty")
    return value


def _datetime(node: yaml.Node) -> datetime:
    if not isinstance(node, yaml.ScalarNode):
        raise ValueError(f"expected an ISO datetime, got {_kind(node)}")
    # The raw text, not PyYAML's own timestamp reading, so that offsets and 'Z' behave.
    text = str(node.value).strip()
    try:
        return datetime.fromisoformat(text)
    except ValueError:
        raise ValueError(
            f"{text!r} is not an ISO datetime like 2026-05-01T12:00:00Z, "
            "2026-05-01T12:00:00+02:00, or 2026-05-01T12:00:00 (the job's time zone)"
        ) from None


def _code_problem(code: str) -> str | None:
    """What is wrong with a job code, by the rule of :class:`Identity` (the one the keys use).

    A code the identity would trim is refused rather than trimmed: ``"bom\\ufeff"``
    and ``"bom"`` would otherwise be two jobs sharing one idempotency key.
    """
    try:
        trimmed = Identity.initial(code).code
    except ValidationError as exc:
        return "job code " + str(exc).removeprefix(f"{exc.field}: ")
    if trimmed != code:
        return "job code must not start or end with whitespace"
    return None


def _mapping_expected(node: yaml.Node, what: str = "key") -> str:
    return f"must be a mapping of {what}: value, got {_kind(node)}"


# The fields `defaults:` may set; a job may set them too, and its value wins.
_DEFAULT_CONVERTERS: dict[str, Callable[[yaml.Node], object]] = {
    "guard": _choice(Guard),
    "timezone": _zone,
    "lease": _duration,
    "heartbeat": _duration,
    "timeout": _timeout,
    "retries": _count,
    "retry_delay": _positive_duration,
    "min_hold": _duration,
    "misfire_grace": _positive_duration,
    "concurrency": _choice(Concurrency),
    "env": _env,
    "cwd": _path,
}
