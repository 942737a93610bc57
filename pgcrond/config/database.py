"""The ``database:`` section: where the lease table lives, and its URL.

The URL comes from ``--database-url``, ``PGCROND_DATABASE_URL``, ``database.url``
(with ``${VAR}``s and ``${file:PATH}`` secrets filled in) or libpq's own
variables, in that order; it is checked as libpq would read it, and never quoted.
"""

from __future__ import annotations

import re

from pgcrond.config.envfiles import Read, fill_file_references
from pgcrond.config.fields import DATABASE, DATABASE_URL_ENV
from pgcrond.config.models import DatabaseConfig
from pgcrond.config.reading import Reading
from pgcrond.config.yamlnodes import Section
from pgcrond.core.redaction import url_problems

# $$, ${VAR}, ${VAR:-default}, ${file:/path} (group 3), and a malformed "${".
_INTERPOLATION = re.compile(r"\$\$|\$\{([^}:]*)(?::-([^}]*))?\}|\$\{file:([^}]*)\}|\$\{")
_VARIABLE = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")

# libpq variables that name a server or a service: any of them set, and no URL
# given, means "connect the way libpq would".
LIBPQ_TARGET_ENV = ("PGHOST", "PGHOSTADDR", "PGSERVICE", "PGSERVICEFILE")


def read_database(
    reading: Reading, section: Section | None, database_url: str | None, *, unreadable: bool
) -> DatabaseConfig | None:
    if section is None:
        return None
    file_url = reading.read(section, "url", DATABASE["url"].convert)
    embedded = reading.read(section, "embedded", DATABASE["embedded"].convert)
    schema = reading.read(section, "schema", DATABASE["schema"].convert)
    table = reading.read(section, "table", DATABASE["table"].convert)
    state_dir = reading.read(section, "state_dir", DATABASE["state_dir"].convert)
    prepared = reading.read(section, "prepared_statements", DATABASE["prepared_statements"].convert)
    sql_connections = reading.read(section, "sql_connections", DATABASE["sql_connections"].convert)
    # An override wins over the whole file choice, embedded included: the
    # same config then serves a laptop (embedded) and production (URL in env).
    flag_url = database_url or None
    env_url = None if flag_url else reading.environ.get(DATABASE_URL_ENV) or None
    override = flag_url or env_url
    url = override
    variables: tuple[str, ...] = ()
    if embedded and file_url is not None:
        reading.report(section, "url", "set either url or embedded: true, not both")
    elif override is None and file_url is not None:
        url = interpolate(reading, section, file_url)
        variables = tuple(m.group(1) for m in _INTERPOLATION.finditer(file_url) if m.group(1))
        if not reading.url_unset:
            check_url(reading, section, url, interpolated="${" in file_url)
    elif (
        override is None
        and not embedded
        and "url" not in section.values
        and any(reading.environ.get(name) for name in LIBPQ_TARGET_ENV)
    ):
        # No URL anywhere, but libpq's own variables say where to connect
        # (PGHOST, PGSERVICE, ...): an empty conninfo lets libpq read them.
        url = ""
    elif override is None and not embedded and "url" not in section.values and not unreadable:
        reading.issue(
            section.file,
            section.line,
            None,
            "database",
            f"no database: set database.url (e.g. url: ${{{DATABASE_URL_ENV}}}), "
            f"set {DATABASE_URL_ENV}, pass --database-url, set libpq's PGHOST or "
            "PGSERVICE, or use embedded: true for a local server pgcrond starts itself",
        )
    if flag_url is not None:
        check_url(reading, None, flag_url, source="--database-url")
    elif env_url is not None:
        check_url(reading, None, env_url, source=DATABASE_URL_ENV)
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
    reading: Reading,
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
            reading.report(section, "url", f"the URL{after}: {problem}")
        else:
            reading.issue(
                source or "<arguments>", None, None, "database.url", f"the URL: {problem}"
            )


def interpolate(reading: Reading, section: Section, text: str) -> str | None:
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
        value = reading.environ.get(name)
        if value:
            return value
        if default is not None:
            return default
        if value is None:
            missing.append(name)
        return ""

    result = _INTERPOLATION.sub(substitute, text)
    reading.read_problems(section, "url", files)
    for bad in malformed:
        reading.report(
            section,
            "url",
            f"malformed {bad!r}: write ${{NAME}} or ${{NAME:-default}} ($$ for $)",
        )
    for name in missing:
        message = f"environment variable {name} is not set; set it, or write ${{{name}:-default}}"
        if reading.allow_unset:
            located = section.values["url"]
            reading.issues.warn(
                located.file,
                located.line,
                None,
                section.prefix + "url",
                f"environment variable {name} is not set (fine for linting; "
                "`pgcrond run` needs it, `check --strict` refuses it)",
            )
        else:
            reading.report(section, "url", message)
    if malformed or files.problems:
        return None
    reading.url_unset = bool(missing or files.missing)
    if files.missing:
        # Never the URL as written: its ${file:/path} would be remembered as a
        # password, and every path fragment of it masked in every message.
        return None
    if reading.url_unset:
        # Linting: keep the URL as written, never a half-interpolated one.
        return text if reading.allow_unset else None
    return result


def is_lease_database(reading: Reading, text: str) -> bool:
    """Whether a job's ``database:`` (``${VAR}``s read) is the lease database's URL."""
    wanted = reading.lease_url
    if wanted is None:
        return False

    def substitute(match: re.Match[str]) -> str:
        if match.group(0) == "$$":
            return "$"
        name, default = match.group(1), match.group(2)
        return reading.environ.get(name or "") or (default or "")

    return wanted in (text, _INTERPOLATION.sub(substitute, text))
