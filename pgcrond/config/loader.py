"""YAML files -> frozen, validated :class:`Config`.

Everything the rest of pgcrond trusts is checked here, once, at start: a
mistake found later (an entrypoint that does not import, a heartbeat that lets
a lease expire, a lease no replica could take over in time) would surface at
3 a.m. instead. The loader keeps going after a problem so that one run of
``pgcrond check`` reports all of them, sorted by file and line.

The pieces: :mod:`~pgcrond.config.yamlnodes` (nodes with locations),
:mod:`~pgcrond.config.converters` (node -> value, naming what is allowed),
:mod:`~pgcrond.config.fields` (the one field table), :mod:`~pgcrond.config.models`
(the frozen results). Callers import from here as before.
"""

from __future__ import annotations

import grp
import os
import pwd
import re
import sys
from collections.abc import Mapping, Sequence
from datetime import timedelta
from ipaddress import IPv4Network, IPv6Network
from pathlib import Path
from types import MappingProxyType
from typing import TypeVar, cast
from zoneinfo import ZoneInfo

import yaml

from pgcrond.config.converters import Converter, Problems, zone_problem
from pgcrond.config.envfiles import Read, fill_file_references, read_env_files
from pgcrond.config.fields import (
    ACTION_KEYS,
    DATABASE,
    DATABASE_URL_ENV,
    DEFAULTABLE,
    HTTP,
    JOB,
    MIN_HISTORY_RETENTION,
    SCHEDULE_KEYS,
    TOP,
    TOP_SECTIONS,
    CatchUp,
    Concurrency,
    Guard,
    LateTicks,
)
from pgcrond.config.models import (
    DEFAULT_CATCH_UP_WINDOW,
    DEFAULT_HISTORY_RETENTION,
    DEFAULT_HTTP_LISTEN,
    DEFAULT_JOB_LEASE,
    DEFAULT_MIN_HOLD,
    DEFAULT_MISFIRE_GRACE,
    DEFAULT_RETRY_DELAY,
    DEFAULT_SHUTDOWN_GRACE,
    DEFAULT_SPREAD,
    DEFAULT_TIMEZONE,
    Config,
    DatabaseConfig,
    JobConfig,
    PageAccess,
    min_history_retention,
)
from pgcrond.config.yamlnodes import Issues, Located, Section, compose, mapping_expected
from pgcrond.core.actions import (
    Action,
    CommandAction,
    EntrypointAction,
    HttpAction,
    ShellAction,
    SqlAction,
)
from pgcrond.core.box import Account, Box, Cgroups, Limits, runs_a_process
from pgcrond.core.durations import format_duration
from pgcrond.core.hooks import FailureHook
from pgcrond.core.keys import Identity, KeyHash
from pgcrond.core.redaction import url_problems
from pgcrond.core.schedule import AtSchedule, CronSchedule, OnceSchedule, Schedule, local_to_instant
from pgcrond.core.timing import LeaseTiming
from pgcrond.errors import ConfigError, ConfigIssue, EntrypointError, ValidationError
from pgcrond.run.entrypoints import resolve

__all__ = [
    "DATABASE_URL_ENV",
    "DEFAULT_HISTORY_RETENTION",
    "DEFAULT_HTTP_LISTEN",
    "DEFAULT_JOB_LEASE",
    "DEFAULT_MIN_HOLD",
    "DEFAULT_MISFIRE_GRACE",
    "DEFAULT_RETRY_DELAY",
    "DEFAULT_SHUTDOWN_GRACE",
    "MIN_HISTORY_RETENTION",
    "STDIN",
    "Action",
    "CommandAction",
    "Config",
    "DatabaseConfig",
    "EntrypointAction",
    "HttpAction",
    "JobConfig",
    "ShellAction",
    "SqlAction",
    "load_config",
    "min_history_retention",
]

# `pgcrond check -` reads the config from standard input, named so in messages.
STDIN = "-"
STDIN_NAME = "<stdin>"
# $$, ${VAR}, ${VAR:-default}, ${file:/path} (group 3), and a malformed "${".
_INTERPOLATION = re.compile(r"\$\$|\$\{([^}:]*)(?::-([^}]*))?\}|\$\{file:([^}]*)\}|\$\{")
_VARIABLE = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
# cronie's and Vixie cron's per-line zone prefix: "CRON_TZ=Europe/Berlin 30 2 * * *".
_CRON_TZ = re.compile(r"^\s*(?:CRON_TZ|TZ)=(\S*)\s*(.*)$", re.DOTALL)
_TIMING_FIELDS = ("lease", "heartbeat")
T = TypeVar("T")


def load_config(
    paths: Sequence[str | Path],
    *,
    environ: Mapping[str, str] = os.environ,
    database_url: str | None = None,
    allow_unset: bool = False,
) -> Config:
    """Read, merge and validate config files; raise :class:`ConfigError` with ALL issues.

    ``database_url`` (from ``--database-url``) beats ``PGCROND_DATABASE_URL``
    in ``environ``, which beats ``database.url`` in the files. A path ``-``
    reads standard input. With ``allow_unset`` (``check`` without
    ``--strict``) an unset ``${VAR}`` is a warning in :attr:`Config.warnings`,
    and the URL is kept as written.
    """
    loader = _Loader(environ, allow_unset=allow_unset)
    files = loader.expand(paths)
    for path in files:
        loader.read_file(path)
    config = loader.build(files, database_url)
    if loader.issues or config is None:
        raise ConfigError(_sorted(loader.issues.found, loader.names))
    return config


def _sorted(issues: list[ConfigIssue], files: Sequence[str]) -> list[ConfigIssue]:
    """By file, in the order the files were given, then by line.

    Problems with the arguments themselves (a missing path, a bad
    ``--database-url``) come first, as found; issues without a line (a whole
    file, an absent section) come first in their file.
    """
    order = {name: index for index, name in enumerate(files)}
    return sorted(issues, key=lambda i: (order.get(i.file, -1), i.line or 0))


# libpq variables that name a server or a service: any of them set, and no URL
# given, means "connect the way libpq would".
LIBPQ_TARGET_ENV = ("PGHOST", "PGHOSTADDR", "PGSERVICE", "PGSERVICEFILE")


class _Invalid:
    """Marks a value that was wrong and has been reported: no default may hide it."""


_INVALID = _Invalid()


class _Loader:
    def __init__(self, environ: Mapping[str, str], *, allow_unset: bool = False) -> None:
        self.environ = environ
        self.allow_unset = allow_unset
        self.issues = Issues()
        self.top: dict[str, Located] = {}
        self.jobs: dict[str, tuple[Located, Located]] = {}  # code -> (key, definition)
        # code -> (its section, its renamed_from): checked across jobs once all are read.
        self.renames: dict[str, tuple[Section, tuple[str, ...]]] = {}
        # Read once, so that a wrong default is reported once, not once per job.
        self.defaults: Section | None = None
        self.default_values: dict[str, object] = {}
        self.default_timing: LeaseTiming | None = LeaseTiming.build(DEFAULT_JOB_LEASE)
        # A rule broken by the defaults alone is reported once, at the defaults.
        self.reported_at_defaults: set[str] = set()
        # The files as issues name them, in the order given.
        self.names: list[str] = []
        # Linting with ${VAR}s unset: the URL is kept as written, and not checked.
        self.url_unset = False
        # A file that cannot be read may hold the database section: do not also claim it is missing.
        self.unreadable = False
        # The lease database's URL as the jobs will use it (an sql: job's database: must match).
        self.lease_url: str | None = None

    def issue(
        self, file: str, line: int | None, job: str | None, name: str | None, message: str
    ) -> None:
        self.issues.add(file, line, job, name, message)

    # -- files -----------------------------------------------------------------------

    def expand(self, paths: Sequence[str | Path]) -> list[str]:
        """Files in the order given; a directory contributes its ``*.yaml``/``*.yml``, sorted."""
        files: list[str] = []
        if not paths:
            self.issue("<arguments>", None, None, None, "no config file given; pass -c PATH")
        for raw in paths:
            if str(raw) == STDIN:
                files.append(STDIN)
                continue
            path = Path(raw)
            try:
                if path.is_dir():
                    found = sorted(p for p in path.iterdir() if p.suffix in (".yaml", ".yml"))
                    if not found:
                        self.issue(
                            str(path), None, None, None, "directory has no *.yaml or *.yml file"
                        )
                    files.extend(str(p) for p in found)
                elif path.exists():
                    files.append(str(path))
                else:
                    self.issue(str(path), None, None, None, "no such file or directory")
                    self.unreadable = True
            except OSError as exc:
                self.issue(str(path), None, None, None, f"cannot read: {exc.strerror or exc}")
                self.unreadable = True
        return files

    def read_file(self, file: str) -> None:
        name = STDIN_NAME if file == STDIN else file
        try:
            text = sys.stdin.read() if file == STDIN else Path(file).read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as exc:
            self.issue(name, None, None, None, f"cannot read: {exc}")
            self.unreadable = True
            return
        try:
            root = compose(text)
        except yaml.YAMLError as exc:
            mark = getattr(exc, "problem_mark", None)
            line = None if mark is None else int(mark.line) + 1
            problem = getattr(exc, "problem", None) or str(exc)
            self.issue(name, line, None, None, f"YAML syntax error: {problem}")
            self.unreadable = True
            return
        if root is None:
            return  # an empty file adds nothing, which is fine in a directory of files
        top = self.issues.section(Located(name, root), 1, None, "", (*TOP_SECTIONS, *TOP))
        if top is None:
            return
        for key, value in top.values.items():
            if key == "jobs":
                self.collect_jobs(value)
            elif key in self.top:
                first = self.top[key]
                self.issue(
                    name,
                    value.line,
                    None,
                    key,
                    f"already set in {first.file}:{first.line}; top-level sections other "
                    "than jobs may appear in one file only",
                )
            else:
                self.top[key] = value

    def collect_jobs(self, jobs: Located) -> None:
        if not isinstance(jobs.node, yaml.MappingNode):
            self.issue(jobs.file, jobs.line, None, "jobs", mapping_expected(jobs.node, "code"))
            return
        for key, value in self.issues.pairs(jobs, None, "jobs"):
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

    # -- fields ------------------------------------------------------------------------

    def convert(self, section: Section, key: str, convert: Converter[T]) -> T | _Invalid | None:
        """One field's value; None when absent, ``_INVALID`` when wrong (then reported)."""
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
        return _INVALID

    def read(self, section: Section, key: str, convert: Converter[T]) -> T | None:
        """The converted value of one field, or None when absent or wrong (then reported)."""
        value = self.convert(section, key, convert)
        return None if isinstance(value, _Invalid) else value

    def read_all(self, section: Section) -> dict[str, object]:
        """The default-able fields a section sets; a wrong one becomes ``_INVALID``."""
        values: dict[str, object] = {}
        for key in DEFAULTABLE:
            if key in section.values:
                values[key] = self.convert(section, key, JOB[key].convert)
        return values

    def report(self, section: Section, key: str, message: str, job: str | None = None) -> None:
        self.issues.at(section, key, message, job)

    # -- building ----------------------------------------------------------------------

    def build(self, files: list[str], database_url: str | None) -> Config | None:
        names = self.names = [STDIN_NAME if f == STDIN else f for f in files]
        first_file = names[0] if names else "<arguments>"

        def top_section(key: str, allowed: Sequence[str]) -> Section | None:
            value = self.top.get(key)
            if value is None:
                return Section(first_file, None, None, f"{key}.", {})
            return self.issues.section(value, value.line, None, f"{key}.", allowed)

        database = self.database(top_section("database", tuple(DATABASE)), database_url)
        self.lease_url = None if database is None else database.url
        defaults = top_section("defaults", DEFAULTABLE)
        http = top_section("http", tuple(HTTP))
        top = Section(first_file, None, None, "", self.top)
        http_listen = DEFAULT_HTTP_LISTEN
        if http is not None and "listen" in http.values:
            http_listen = self.read(http, "listen", HTTP["listen"].convert) or ""
        page_access = self.page_access(http)
        shutdown_grace = self.read(top, "shutdown_grace", TOP["shutdown_grace"].convert)
        history_retention = self.read(top, "history_retention", TOP["history_retention"].convert)
        catch_up_window = self.read(top, "catch_up_window", TOP["catch_up_window"].convert)
        spread = self.read(top, "spread", TOP["spread"].convert)
        cgroups = self.read(top, "cgroups", TOP["cgroups"].convert)

        self.defaults = defaults
        if defaults is not None:
            self.default_values = self.read_all(defaults)
            self.default_timing = self.timing(self.default_values, {}, defaults, defaults)
        jobs: dict[str, JobConfig] = {}
        for code, (key, value) in self.jobs.items():
            job = self.job(code, key, value)
            if job is not None:
                jobs[code] = job
        self.check_renames()
        if not self.jobs and not self.issues and not self.unreadable:
            self.issue(
                first_file, None, None, "jobs", "no jobs defined; add at least one under jobs:"
            )
        # A wrong value (reported already) is not also "too short" as the default would be.
        if history_retention is not None or "history_retention" not in top.values:
            # Jobs with their own history_retention were checked against it.
            by_top = {code: job for code, job in jobs.items() if job.history_retention is None}
            self.check_retention(top, history_retention, by_top)
        if self.issues or database is None:
            return None
        return Config(
            files=tuple(names),
            database=database,
            jobs=MappingProxyType(jobs),
            http_listen=http_listen,
            page_access=page_access,
            shutdown_grace=DEFAULT_SHUTDOWN_GRACE if shutdown_grace is None else shutdown_grace,
            history_retention=history_retention or DEFAULT_HISTORY_RETENTION,
            catch_up_window=catch_up_window or DEFAULT_CATCH_UP_WINDOW,
            spread=DEFAULT_SPREAD if spread is None else spread,
            cgroups=cast(Cgroups, cgroups or TOP["cgroups"].default),
            warnings=tuple(_sorted(self.issues.warnings, self.names)),
        )

    def check_renames(self) -> None:
        """Each old code moves to one job, is no job of this config, and leads to no cycle.

        A rename runs at start (storage/renames.py): an old code that is still a
        job, or that two jobs claim, would move one job's history under another.
        """
        claimed: dict[str, str] = {}
        for code, (section, olds) in self.renames.items():
            for old in olds:
                problem = _code_problem(old)
                if problem is not None:
                    self.report(section, "renamed_from", f"{old!r}: {problem}", job=code)
                elif old == code:
                    self.report(section, "renamed_from", "names this job's own code", job=code)
                elif code in self._renamed_chain(old):
                    self.report(
                        section,
                        "renamed_from",
                        f"{old!r} is a cycle: {old!r} is renamed from {code!r} in turn; "
                        "a job code can only move forward to a new one",
                        job=code,
                    )
                elif old in self.jobs:
                    at = self.jobs[old][0]
                    self.report(
                        section,
                        "renamed_from",
                        f"{old!r} is still a job of this config ({at.file}:{at.line}): "
                        "remove that job, or this entry, since its history would move here",
                        job=code,
                    )
                elif old in claimed:
                    first = self.jobs[claimed[old]][0]
                    self.report(
                        section,
                        "renamed_from",
                        f"{old!r} is also in the renamed_from of job {claimed[old]!r} "
                        f"({first.file}:{first.line}): an old code can move to one job only",
                        job=code,
                    )
                else:
                    claimed[old] = code

    def _renamed_chain(self, code: str) -> set[str]:
        """Every code that ``code`` is renamed from, directly or through others."""
        seen: set[str] = set()
        todo = [code]
        while todo:
            for old in self.renames.get(todo.pop(), (None, ()))[1]:
                if old not in seen:
                    seen.add(old)
                    todo.append(old)
        return seen

    def page_access(self, http: Section | None) -> PageAccess:
        """The status page's access fields; a wrong one is reported (the config is refused)."""
        if http is None:
            return PageAccess()

        def value(name: str) -> object:
            found = self.read(http, name, HTTP[name].convert) if name in http.values else None
            return HTTP[name].default if found is None else found

        return PageAccess(
            enabled=bool(value("status_page")),
            users=cast(Mapping[str, str], value("users")),
            trusted_proxies=cast(tuple[IPv4Network | IPv6Network, ...], value("trusted_proxies")),
            proxy_header=str(value("proxy_header")),
        )

    def check_retention(
        self, top: Section, retention: timedelta | None, jobs: Mapping[str, JobConfig]
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

    def database(self, section: Section | None, database_url: str | None) -> DatabaseConfig | None:
        if section is None:
            return None
        file_url = self.read(section, "url", DATABASE["url"].convert)
        embedded = self.read(section, "embedded", DATABASE["embedded"].convert)
        schema = self.read(section, "schema", DATABASE["schema"].convert)
        table = self.read(section, "table", DATABASE["table"].convert)
        state_dir = self.read(section, "state_dir", DATABASE["state_dir"].convert)
        prepared = self.read(
            section, "prepared_statements", DATABASE["prepared_statements"].convert
        )
        sql_connections = self.read(section, "sql_connections", DATABASE["sql_connections"].convert)
        # An override wins over the whole file choice, embedded included: the
        # same config then serves a laptop (embedded) and production (URL in env).
        flag_url = database_url or None
        env_url = None if flag_url else self.environ.get(DATABASE_URL_ENV) or None
        override = flag_url or env_url
        url = override
        variables: tuple[str, ...] = ()
        if embedded and file_url is not None:
            self.report(section, "url", "set either url or embedded: true, not both")
        elif override is None and file_url is not None:
            url = self.interpolate(section, file_url)
            variables = tuple(m.group(1) for m in _INTERPOLATION.finditer(file_url) if m.group(1))
            if not self.url_unset:
                self.check_url(section, url, interpolated="${" in file_url)
        elif (
            override is None
            and not embedded
            and "url" not in section.values
            and any(self.environ.get(name) for name in LIBPQ_TARGET_ENV)
        ):
            # No URL anywhere, but libpq's own variables say where to connect
            # (PGHOST, PGSERVICE, ...): an empty conninfo lets libpq read them.
            url = ""
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
                f"set {DATABASE_URL_ENV}, pass --database-url, set libpq's PGHOST or "
                "PGSERVICE, or use embedded: true for a local server pgcrond starts itself",
            )
        if flag_url is not None:
            self.check_url(None, flag_url, source="--database-url")
        elif env_url is not None:
            self.check_url(None, env_url, source=DATABASE_URL_ENV)
        return DatabaseConfig(
            url=url,
            embedded=bool(embedded) and override is None,
            state_dir=DatabaseConfig.state_dir if state_dir is None else state_dir,
            schema=schema or DatabaseConfig.schema,
            table=table or DatabaseConfig.table,
            prepared_statements=bool(prepared),
            sql_connections=sql_connections or DatabaseConfig.sql_connections,
            url_variables=variables,
        )

    def check_url(
        self,
        section: Section | None,
        url: str | None,
        *,
        interpolated: bool = False,
        source: str | None = None,
    ) -> None:
        """Refuse a URL libpq would misread; the messages never quote it (it holds the password)."""
        if url is None:
            return
        for problem in url_problems(url):
            if section is not None:
                after = " (after ${VAR} interpolation)" if interpolated else ""
                self.report(section, "url", f"the URL{after}: {problem}")
            else:
                self.issue(
                    source or "<arguments>", None, None, "database.url", f"the URL: {problem}"
                )

    def interpolate(self, section: Section, text: str) -> str | None:
        """``${VAR}``, ``${VAR:-default}`` and ``$$`` (a literal ``$``), from ``environ``;
        ``${file:/path}`` from a file (a secret mounted by Kubernetes or Docker)."""
        missing: list[str] = []
        malformed: list[str] = []
        files = Read()

        def substitute(match: re.Match[str]) -> str:
            if match.group(0) == "$$":
                return "$"
            if match.group(3) is not None:
                return fill_file_references(match.group(0), files)
            name, default = match.group(1), match.group(2)
            if name is None or not _VARIABLE.fullmatch(name):
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
        self.read_problems(section, "url", files)
        for bad in malformed:
            self.report(
                section,
                "url",
                f"malformed {bad!r}: write ${{NAME}} or ${{NAME:-default}} ($$ for $)",
            )
        for name in missing:
            message = (
                f"environment variable {name} is not set; set it, or write ${{{name}:-default}}"
            )
            if self.allow_unset:
                located = section.values["url"]
                self.issues.warn(
                    located.file,
                    located.line,
                    None,
                    section.prefix + "url",
                    f"environment variable {name} is not set (fine for linting; "
                    "`pgcrond run` needs it, `check --strict` refuses it)",
                )
            else:
                self.report(section, "url", message)
        if malformed or files.problems:
            return None
        self.url_unset = bool(missing or files.missing)
        if files.missing:
            # Never the URL as written: its ${file:/path} would be remembered as a
            # password, and every path fragment of it masked in every message.
            return None
        if self.url_unset:
            # Linting: keep the URL as written, never a half-interpolated one.
            return text if self.allow_unset else None
        return result

    def timing(
        self,
        values: dict[str, object],
        default_values: dict[str, object],
        section: Section,
        defaults: Section | None,
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

    def job(self, code: str, key: Located, definition: Located) -> JobConfig | None:
        defaults, default_values = self.defaults, self.default_values
        before = len(self.issues)
        section = self.issues.section(definition, key.line, code, "", tuple(JOB))
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
        if own.keys() & set(_TIMING_FIELDS) or not default_values.keys() & set(_TIMING_FIELDS):
            timing = self.timing(own, default_values, section, defaults)
        else:
            timing = self.default_timing  # its problems were reported once, at the defaults
        schedule, zone = self.schedule(section, zone, "timezone" in own)
        guard = cast(Guard, merged.get("guard", JOB["guard"].default))
        action = self.action(section, merged, timing, guard)
        key_hash = self.read(section, "key_hash", JOB["key_hash"].convert)
        lock_key = self.read(section, "lock_key", JOB["lock_key"].convert)
        description = self.read(section, "description", JOB["description"].convert)
        suspended = self.read(section, "suspended", JOB["suspended"].convert)
        renamed_from = self.read(section, "renamed_from", JOB["renamed_from"].convert) or ()
        if renamed_from:
            self.renames[code] = (section, renamed_from)
        jitter = merged.get("jitter", JOB["jitter"].default)
        grace = merged.get("misfire_grace", DEFAULT_MISFIRE_GRACE)
        if isinstance(jitter, timedelta) and isinstance(grace, timedelta) and jitter >= grace:
            # A fire moved past the misfire window would never run.
            self.report(
                section if "jitter" in own else (defaults or section),
                "jitter",
                f"must be shorter than misfire_grace ({format_duration(grace)})",
                job=code,
            )
        if guard != "advisory":
            for name in ("key_hash", "lock_key"):
                if name in section.values:
                    self.report(section, name, "only used with guard: advisory")
        misfire_grace = merged.get("misfire_grace", DEFAULT_MISFIRE_GRACE)
        if (
            timing is not None
            and isinstance(misfire_grace, timedelta)
            and guard == "lease"
            and not isinstance(schedule, OnceSchedule)
        ):
            self.check_takeover(section, own, timing, misfire_grace)
        retention = merged.get("history_retention")
        if isinstance(retention, timedelta) and timing is not None:
            floor = max(MIN_HISTORY_RETENTION, cast(timedelta, misfire_grace) + timing.lease)
            if retention < floor:
                self.report(
                    section if "history_retention" in own else (defaults or section),
                    "history_retention",
                    f"must be at least {format_duration(floor)} (the floor, or misfire_grace "
                    "+ lease): a finished run deleted sooner can be claimed afresh by a late "
                    "replica and run twice",
                    job=code,
                )
        env = self.environment(section, own, merged)
        box = self.box(section, own, merged, action)
        if (
            len(self.issues) > before
            or _INVALID in merged.values()
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
            action=action,
            guard=guard,
            timezone=zone or DEFAULT_TIMEZONE,
            timing=timing,
            timeout=cast(timedelta | None, merged.get("timeout", JOB["timeout"].default)),
            retries=cast(int, merged.get("retries", JOB["retries"].default)),
            on_failure=cast(FailureHook | None, merged.get("on_failure")),
            retry_delay=cast(timedelta, merged.get("retry_delay", DEFAULT_RETRY_DELAY)),
            min_hold=cast(timedelta, merged.get("min_hold", DEFAULT_MIN_HOLD)),
            misfire_grace=cast(timedelta, misfire_grace),
            concurrency=cast(Concurrency, merged.get("concurrency", JOB["concurrency"].default)),
            env=MappingProxyType(env),
            cwd=cast(Path | None, merged.get("cwd", JOB["cwd"].default)),
            box=box,
            env_file=cast(tuple[Path, ...], merged.get("env_file", ())),
            key_hash=cast(KeyHash, key_hash or JOB["key_hash"].default),
            lock_key=code if lock_key is None else lock_key,
            description=description,
            suspended=bool(suspended),
            catch_up=cast(CatchUp, merged.get("catch_up", JOB["catch_up"].default)),
            max_catch_up=cast(int, merged.get("max_catch_up", JOB["max_catch_up"].default)),
            late_ticks=cast(LateTicks, merged.get("late_ticks", JOB["late_ticks"].default)),
            alert_after=cast(
                timedelta | None, merged.get("alert_after", JOB["alert_after"].default)
            ),
            jitter=cast(timedelta, jitter),
            renamed_from=renamed_from,
            history_retention=cast(timedelta | None, merged.get("history_retention")),
            source=f"{key.file}:{key.line}",
        )

    # -- a job's box and environment -----------------------------------------------

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

    def environment(
        self, section: Section, own: Mapping[str, object], merged: Mapping[str, object]
    ) -> dict[str, str] | None:
        """``env_file`` under ``env:``, then each ``${file:PATH}`` of ``env:`` read."""
        env: dict[str, str] = {}
        ok = True
        files = merged.get("env_file")
        if isinstance(files, tuple) and files:
            read = read_env_files(files)
            ok = self.read_problems(self.blame(section, own, "env_file"), "env_file", read)
            env.update(read.values)
        configured = merged.get("env", JOB["env"].default)
        if not isinstance(configured, Mapping):
            return None  # reported already
        own_env = own.get("env")
        for name, value in configured.items():
            read = Read()
            env[name] = fill_file_references(value, read)
            mine = isinstance(own_env, dict) and name in own_env
            blamed = section if mine or self.defaults is None else self.defaults
            ok = self.read_problems(blamed, "env", read, f"{name}: ") and ok
        return env if ok else None

    def read_problems(self, section: Section, name: str, read: Read, prefix: str = "") -> bool:
        for problem in read.problems:
            self.report(section, name, prefix + problem)
        for missing in read.missing:
            self.machine_issue(section, name, prefix + missing)
        return not read.problems and not (read.missing and not self.allow_unset)

    def box(
        self,
        section: Section,
        own: Mapping[str, object],
        merged: Mapping[str, object],
        action: Action | None,
    ) -> Box | None:
        """Whom the job's processes run as and their limits; only jobs with processes have them.

        ``defaults:`` may set them for every job: a job without a child process
        (an in-process entrypoint, ``sql:``, ``http:``) just does not take them,
        but setting them on such a job itself is an error.
        """
        spawns = action is not None and runs_a_process(action)
        passthrough = cast(tuple[str, ...], merged.get("env_passthrough", ()))
        if not spawns:
            for name in ("user", "group", "limits"):
                if name in own and action is not None:
                    self.report(
                        section,
                        name,
                        "only for jobs that run a process: command:, shell: or entrypoint: "
                        "with isolate: true (an in-process entrypoint, sql: or http: job runs "
                        "inside pgcrond)",
                    )
            return Box(env_passthrough=passthrough)
        user = merged.get("user")
        group = merged.get("group")
        account: Account | None = None
        home: str | None = None
        known = False
        gid: Account | None = None
        if isinstance(user, str | int):
            try:
                entry = pwd.getpwnam(user) if isinstance(user, str) else pwd.getpwuid(user)
            except KeyError:
                if isinstance(user, str):
                    self.machine_issue(
                        self.blame(section, own, "user"),
                        "user",
                        f"no user {user!r} on this machine (getent passwd {user})",
                    )
                    if not self.allow_unset:
                        return None
                else:
                    # No passwd entry: its own number as its group, never the daemon's (root).
                    account = Account(str(user), user)
                    gid = Account(str(user), user)
            else:
                account = Account(entry.pw_name, entry.pw_uid)
                home, known = entry.pw_dir, True
                gid = _group_of(entry.pw_gid)
        if isinstance(group, str | int):
            try:
                found = grp.getgrnam(group) if isinstance(group, str) else grp.getgrgid(group)
                gid = Account(found.gr_name, found.gr_gid)
            except KeyError:
                if isinstance(group, str):
                    self.machine_issue(
                        self.blame(section, own, "group"),
                        "group",
                        f"no group {group!r} on this machine (getent group {group})",
                    )
                    if not self.allow_unset:
                        return None
                else:
                    gid = Account(str(group), group)
        for name, wanted, current in (
            ("user", account, os.geteuid()),
            # The user's own group follows the user: said once, for the user.
            ("group", gid if "group" in merged else None, os.getegid()),
        ):
            if wanted is not None and wanted.id != current and os.geteuid() != 0:
                self.machine_issue(
                    self.blame(section, own, name),
                    name,
                    f"switching to {name} {wanted.name!r} needs pgcrond to run as root "
                    f"(it runs as uid {os.geteuid()}); run it as root, or leave {name}: out",
                )
                if not self.allow_unset:
                    return None
        return Box(
            user=account,
            group=gid,
            home=home,
            groups_known=known,
            limits=cast(Limits, merged.get("limits") or Limits()),
            env_passthrough=passthrough,
        )

    def check_takeover(
        self, section: Section, own: dict[str, object], timing: LeaseTiming, grace: timedelta
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
            self.report(section, blamed, message)
            return
        defaults = self.defaults
        set_by_defaults = [
            n for n in ("lease", "misfire_grace") if defaults and n in defaults.values
        ]
        if defaults is not None and set_by_defaults:
            if "takeover" not in self.reported_at_defaults:
                self.reported_at_defaults.add("takeover")
                self.report(defaults, set_by_defaults[0], message)
            return
        self.report(section, "lease", message)

    def schedule(
        self, section: Section, zone: ZoneInfo | None, zone_is_own: bool
    ) -> tuple[Schedule | None, ZoneInfo | None]:
        """The job's schedule, and its zone (a ``CRON_TZ=`` prefix sets it)."""
        given = [k for k in SCHEDULE_KEYS if k in section.values]
        if len(given) != 1:
            self.one_of(section, given, "schedule", "cron: '...', once: true or at: <ISO datetime>")
            return None, zone
        # With a bad time zone (reported already) the expression is still worth checking.
        if given == ["cron"]:
            expression = self.read(section, "cron", JOB["cron"].convert)
            if expression is None:
                return None, zone
            prefix = _CRON_TZ.match(expression)
            if prefix is not None:
                name, expression = prefix.groups()
                problem = zone_problem(name) if name else "CRON_TZ= names no time zone"
                if problem is not None:
                    self.report(section, "cron", f"CRON_TZ: {problem}")
                    return None, zone
                if zone_is_own and zone is not None and zone.key != name:
                    self.report(
                        section,
                        "cron",
                        f"CRON_TZ={name} disagrees with timezone: {zone.key}; keep one of them",
                    )
                    return None, zone
                zone = ZoneInfo(name)
            try:
                return CronSchedule.parse(expression, zone or DEFAULT_TIMEZONE), zone
            except ValueError as exc:
                self.report(section, "cron", str(exc))
                return None, zone
        if given == ["once"]:
            once = self.read(section, "once", JOB["once"].convert)
            if once is False:
                self.report(section, "once", "once: false is no schedule; remove it or use cron:")
            return (OnceSchedule() if once else None), zone
        at = self.read(section, "at", JOB["at"].convert)
        if at is None:
            return None, zone
        effective = zone or DEFAULT_TIMEZONE
        try:
            instant = local_to_instant(at, effective) if at.tzinfo is None else at
        except (OverflowError, ValueError):
            self.report(section, "at", "is too close to the end of the calendar to be a tick")
            return None, zone
        return AtSchedule(instant), zone

    def action(
        self,
        section: Section,
        merged: Mapping[str, object],
        timing: LeaseTiming | None,
        guard: Guard,
    ) -> Action | None:
        given = [k for k in ACTION_KEYS if k in section.values]
        isolate = self.read(section, "isolate", JOB["isolate"].convert)
        if isolate is not None and given != ["entrypoint"]:
            self.report(section, "isolate", "only used with entrypoint:")
        for name in ("role", "database"):
            if name in section.values and given != ["sql"]:
                self.report(section, name, "only used with sql:")
        if len(given) != 1:
            self.one_of(
                section,
                given,
                "action",
                "command: [argv...], shell: '...', entrypoint:, sql: '...' or http: {url: ...}",
            )
            return None
        if given == ["sql"]:
            return self.sql_action(section, merged, timing, guard)
        if given == ["http"]:
            return self.read(section, "http", JOB["http"].convert)
        if given == ["command"]:
            argv = self.read(section, "command", JOB["command"].convert)
            return None if argv is None else CommandAction(argv)
        if given == ["shell"]:
            script = self.read(section, "shell", JOB["shell"].convert)
            return None if script is None else ShellAction(script)
        target = self.read(section, "entrypoint", JOB["entrypoint"].convert)
        if target is None:
            return None
        try:
            resolve(target)
        except EntrypointError as exc:
            self.report(section, "entrypoint", str(exc))
            return None
        return EntrypointAction(target, isolate=bool(isolate))

    def sql_action(
        self,
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
        text = self.read(section, "sql", JOB["sql"].convert)
        role = self.read(section, "role", JOB["role"].convert)
        database = self.read(section, "database", JOB["database"].convert)
        ok = text is not None
        if guard != "lease":
            self.report(
                section,
                "guard" if "guard" in section.values else "sql",
                "sql: needs guard: lease: its statements commit in the same transaction as the "
                "lease row's SUCCESS, and an advisory lock has no row to commit with",
            )
            ok = False
        if database is not None and not self.is_lease_database(database):
            self.report(
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
            self.report(
                section,
                "lease",
                f"lease {format_duration(timing.lease)} is too short for an sql: job: it must "
                "exceed the heartbeat interval plus the stop grace",
            )
            return None
        timeout = merged.get("timeout")
        if isinstance(timeout, timedelta) and timeout > window:
            self.report(
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

    def is_lease_database(self, text: str) -> bool:
        """Whether a job's ``database:`` (``${VAR}``s read) is the lease database's URL."""
        wanted = self.lease_url
        if wanted is None:
            return False

        def substitute(match: re.Match[str]) -> str:
            if match.group(0) == "$$":
                return "$"
            name, default = match.group(1), match.group(2)
            return self.environ.get(name or "") or (default or "")

        return wanted in (text, _INTERPOLATION.sub(substitute, text))

    def one_of(self, section: Section, given: list[str], what: str, allowed: str) -> None:
        if given:
            both = " and ".join(given)
            self.report(section, given[1], f"has {both}; a job has exactly one {what}: {allowed}")
        else:
            self.issue(
                section.file, section.line, section.job, what, f"no {what}: add one of {allowed}"
            )


def _group_of(gid: int) -> Account:
    """A group by its id, named when the machine knows the name."""
    try:
        return Account(grp.getgrgid(gid).gr_name, gid)
    except KeyError:
        return Account(str(gid), gid)


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
