"""YAML files -> frozen, validated :class:`Config`.

Everything the rest of pgcrond trusts is checked here, once, at start: a
mistake found later (an entrypoint that does not import, a heartbeat that lets
a lease expire, a lease no replica could take over in time) would surface at
3 a.m. instead. The loader keeps going after a problem so that one run of
``pgcrond check`` reports all of them, sorted by file and line.

The pieces, in the order a load uses them: :mod:`~pgcrond.config.sources`
(files -> sections and jobs), :mod:`~pgcrond.config.reading` (how a field is
read and a problem blamed), :mod:`~pgcrond.config.database` (the URL),
:mod:`~pgcrond.config.jobs` (each job, over ``defaults:``; with
:mod:`~pgcrond.config.schedules`, :mod:`~pgcrond.config.actions`,
:mod:`~pgcrond.config.process`), :mod:`~pgcrond.config.rules` (rules across
jobs). Here: the top level, assembled into :class:`Config`.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from datetime import timedelta
from ipaddress import IPv4Network, IPv6Network
from pathlib import Path
from types import MappingProxyType
from typing import cast

import yaml

from pgcrond.config.calendars import read_calendars
from pgcrond.config.database import read_database
from pgcrond.config.fields import DATABASE, DEFAULTABLE, HTTP, TOP
from pgcrond.config.jobs import read_job, read_timing
from pgcrond.config.listen import is_loopback, parse_listen
from pgcrond.config.models import (
    DEFAULT_CATCH_UP_WINDOW,
    DEFAULT_HISTORY_RETENTION,
    DEFAULT_HTTP_LISTEN,
    DEFAULT_SHUTDOWN_GRACE,
    DEFAULT_SPREAD,
    Config,
    HttpLimits,
    JobConfig,
    PageAccess,
)
from pgcrond.config.reading import Reading
from pgcrond.config.rules import check_renames, check_retention
from pgcrond.config.sources import STDIN, STDIN_NAME, Sources
from pgcrond.config.yamlnodes import Section
from pgcrond.core.access import PageUser, Role, TlsFiles
from pgcrond.core.box import Cgroups
from pgcrond.errors import ConfigError, ConfigIssue, ValidationError


def load_config(
    paths: Sequence[str | Path],
    *,
    environ: Mapping[str, str] = os.environ,
    database_url: str | None = None,
    listen: str | None = None,
    allow_unset: bool = False,
) -> Config:
    """Read, merge and validate config files; raise :class:`ConfigError` with ALL issues.

    ``database_url`` (from ``--database-url``) beats ``PGCROND_DATABASE_URL``
    in ``environ``, which beats ``database.url`` in the files. ``listen``
    (from ``run --http``) beats ``http.listen``: the rules on the listener
    (passwords over plain HTTP) judge the one the daemon binds. A path ``-``
    reads standard input. With ``allow_unset`` (``check`` without
    ``--strict``) an unset ``${VAR}`` is a warning in :attr:`Config.warnings`,
    and the URL is kept as written.
    """
    reading = Reading(environ, allow_unset=allow_unset)
    sources = Sources(reading.issues)
    files = sources.expand(paths)
    for path in files:
        sources.read_file(path)
    # The files as issues name them, in the order given.
    names = [STDIN_NAME if f == STDIN else f for f in files]
    config = _build(reading, sources, names, database_url, listen)
    if reading.issues or config is None:
        raise ConfigError(_sorted(reading.issues.found, names))
    return config


def load_document(
    document: Mapping[str, object], *, name: str, environ: Mapping[str, str] = os.environ
) -> Config:
    """What :func:`load_config` makes of a file holding ``document``, without the file.

    ``name`` stands for the file in issues (their lines are those of the
    document dumped as YAML): :func:`pgcrond.testing.job` builds a job with it.
    """
    reading = Reading(environ)
    sources = Sources(reading.issues)
    sources.read_text(name, yaml.safe_dump(dict(document), sort_keys=False))
    config = _build(reading, sources, [name], None, None)
    if reading.issues or config is None:
        raise ConfigError(_sorted(reading.issues.found, [name]))
    return config


def _sorted(issues: list[ConfigIssue], files: Sequence[str]) -> list[ConfigIssue]:
    """By file, in the order the files were given, then by line.

    Problems with the arguments themselves (a missing path, a bad
    ``--database-url``) come first, as found; issues without a line (a whole
    file, an absent section) come first in their file.
    """
    order = {name: index for index, name in enumerate(files)}
    return sorted(issues, key=lambda i: (order.get(i.file, -1), i.line or 0))


def _build(
    reading: Reading,
    sources: Sources,
    names: list[str],
    database_url: str | None,
    listen: str | None,
) -> Config | None:
    first_file = names[0] if names else "<arguments>"

    def top_section(key: str, allowed: Sequence[str]) -> Section | None:
        value = sources.top.get(key)
        if value is None:
            return Section(first_file, None, None, f"{key}.", {})
        return reading.issues.section(value, value.line, None, f"{key}.", allowed)

    database = read_database(
        reading,
        top_section("database", tuple(DATABASE)),
        database_url,
        unreadable=sources.unreadable,
    )
    reading.lease_url = None if database is None else database.url
    defaults = top_section("defaults", DEFAULTABLE)
    http = top_section("http", tuple(HTTP))
    top = Section(first_file, None, None, "", sources.top)
    http_listen = DEFAULT_HTTP_LISTEN
    if http is not None and "listen" in http.values:
        http_listen = reading.read(http, "listen", HTTP["listen"].convert) or ""
    if listen is not None:
        http_listen = listen
    page_access = _page_access(
        reading, http, http_listen, "http.listen" if listen is None else "run --http"
    )
    http_limits = _http_limits(reading, http)
    http_tls = cast(TlsFiles | None, _http_value(reading, http, "tls"))
    shutdown_grace = reading.read(top, "shutdown_grace", TOP["shutdown_grace"].convert)
    history_retention = reading.read(top, "history_retention", TOP["history_retention"].convert)
    catch_up_window = reading.read(top, "catch_up_window", TOP["catch_up_window"].convert)
    spread = reading.read(top, "spread", TOP["spread"].convert)
    cgroups = reading.read(top, "cgroups", TOP["cgroups"].convert)

    calendars = read_calendars(reading, sources.top.get("calendars"))
    reading.calendars = calendars
    reading.defaults = defaults
    if defaults is not None:
        reading.default_values = reading.read_all(defaults)
        reading.default_timing = read_timing(
            reading, reading.default_values, {}, defaults, defaults
        )
    jobs: dict[str, JobConfig] = {}
    for code, (key, value) in sources.jobs.items():
        job = read_job(reading, code, key, value)
        if job is not None:
            jobs[code] = job
    check_renames(reading, sources.jobs)
    if not sources.jobs and not reading.issues and not sources.unreadable:
        reading.issue(
            first_file, None, None, "jobs", "no jobs defined; add at least one under jobs:"
        )
    # A wrong value (reported already) is not also "too short" as the default would be.
    if history_retention is not None or "history_retention" not in top.values:
        # Jobs with their own history_retention were checked against it.
        by_top = {code: job for code, job in jobs.items() if job.history_retention is None}
        check_retention(reading, top, history_retention, by_top)
    if reading.issues or database is None:
        return None
    return Config(
        files=tuple(names),
        database=database,
        jobs=MappingProxyType(jobs),
        http_listen=http_listen,
        page_access=page_access,
        http_limits=http_limits,
        http_tls=http_tls,
        shutdown_grace=DEFAULT_SHUTDOWN_GRACE if shutdown_grace is None else shutdown_grace,
        history_retention=history_retention or DEFAULT_HISTORY_RETENTION,
        catch_up_window=catch_up_window or DEFAULT_CATCH_UP_WINDOW,
        spread=DEFAULT_SPREAD if spread is None else spread,
        cgroups=cast(Cgroups, cgroups or TOP["cgroups"].default),
        calendars=MappingProxyType(calendars),
        warnings=tuple(_sorted(reading.issues.warnings, names)),
    )


def _http_value(reading: Reading, http: Section | None, name: str) -> object:
    """One ``http:`` field, or its default when absent or wrong (then reported)."""
    found = None
    if http is not None and name in http.values:
        found = reading.read(http, name, HTTP[name].convert)
    return HTTP[name].default if found is None else found


def _page_access(
    reading: Reading, http: Section | None, listen: str, listen_from: str
) -> PageAccess:
    """The status page's access fields; a wrong one is reported (the config is refused).

    ``listen_from`` names where ``listen`` was given, for the messages about it.
    """
    if http is None:
        return PageAccess()

    def value(name: str) -> object:
        return _http_value(reading, http, name)

    switch = value("status_page")
    access = PageAccess(
        enabled=switch is not False,
        public=switch == "public",
        users=cast(Mapping[str, PageUser], value("users")),
        trusted_proxies=cast(tuple[IPv4Network | IPv6Network, ...], value("trusted_proxies")),
        proxy_header=str(value("proxy_header")),
        proxy_role=cast(Role, value("proxy_role")),
        csrf_secret=cast(str | None, value("csrf_secret")),
    )
    try:
        address = parse_listen(listen)
    except ValidationError:
        return access  # reported where listen was read
    exposed = address is not None and not is_loopback(address.host)
    if access.public and exposed and not access.authenticated:
        reading.issues.warn(
            http.file,
            http.values["status_page"].line,
            None,
            "http.status_page",
            f"public: anyone who reaches {address} reads every job's page: its schedule, "
            "errors, idempotency keys and the recent output (stdout and stderr) of its runs",
        )
    passwords = any(user.password for user in access.users.values())
    plain = value("tls") is None and not access.trusted_proxies
    if exposed and passwords and plain and not value("allow_plaintext_passwords"):
        reading.report(
            http,
            "users",
            f"passwords would cross the network readable: {address} ({listen_from}) is not "
            "loopback and serves plain HTTP. Set http.tls, put the TLS proxy in front of it in "
            "http.trusted_proxies, or set http.allow_plaintext_passwords: true to accept the risk",
        )
    return access


def _http_limits(reading: Reading, http: Section | None) -> HttpLimits:
    return HttpLimits(
        max_connections=cast(int, _http_value(reading, http, "max_connections")),
        idle_timeout=cast(timedelta, _http_value(reading, http, "idle_timeout")),
    )
