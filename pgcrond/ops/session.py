"""What every operator command shares: which database and table, one connection, one-line errors.

The database is ``--database-url``, else ``PGCROND_DATABASE_URL``, else the
config's ``database.url``; the table is the config's ``database.schema``/``table``
with ``-c``, ``pgcrond.leases`` without. A failure is one line on stderr that says
what to do next, exit 2. The exit codes are :class:`pgcrond.errors.ExitCode`.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import sys
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from pgcrond.config.fields import DATABASE_URL_ENV
from pgcrond.config.loader import load_config
from pgcrond.config.models import Config
from pgcrond.core.redaction import redact
from pgcrond.errors import CommandError, ConfigError, DatabaseUnavailable, ExitCode, PgcrondError
from pgcrond.storage import history as records
from pgcrond.storage.db import Database
from pgcrond.storage.embedded import running_dsn, state_home
from pgcrond.storage.leases import LeaseStore

# The exit codes are pgcrond.errors.ExitCode, one enum for every command.
EXIT_OK = ExitCode.OK


# The command ran but did not change anything: the operator said no, or the
# row moved on between showing and changing it.
EXIT_NOT_DONE = ExitCode.FAILED


EXIT_ERROR = ExitCode.ERROR


# How long a command waits for its connection before it gives up.
CONNECT_TIMEOUT_S = 5.0


POOL_LOGGER = "psycopg.pool"


@dataclass(frozen=True)
class Target:
    """Which database and lease table a command works on."""

    url: str
    schema: str
    table: str
    config: Config | None

    @property
    def table_name(self) -> str:
        return f"{self.schema}.{self.table}"


Body = Callable[[argparse.Namespace, Target, LeaseStore], Awaitable[int]]


def run_command(args: argparse.Namespace, body: Body, *, needs_table: bool = True) -> int:
    url: str | None = None
    with _PoolErrors() as pool_errors:
        try:
            target = _target(args)
            url = target.url
            return asyncio.run(_with_store(args, target, body, needs_table=needs_table))
        except ConfigError as exc:
            # One issue per line is the config's own format; each names file:line.
            return _error(f"{exc}\n(run `pgcrond check -c ...` to validate the config alone)")
        except DatabaseUnavailable as exc:
            return _error(
                f"cannot reach the database at {redact(url or '?')}: "
                f"{pool_errors.last or exc}; check --database-url, {DATABASE_URL_ENV} "
                "or database.url, and that PostgreSQL is running"
            )
        except PgcrondError as exc:
            return _error(str(exc))


class _PoolErrors(logging.Handler):
    """Keeps the pool's last connection error for the one-line message.

    Otherwise Python's last-resort handler prints every reconnect attempt to
    stderr, and the final error only says that the pool timed out.
    """

    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.last: str | None = None
        self._logger = logging.getLogger(POOL_LOGGER)
        self._propagate = self._logger.propagate

    def emit(self, record: logging.LogRecord) -> None:
        text = record.getMessage().splitlines()[0]
        self.last = text.split(": ", 1)[1] if text.startswith("error connecting") else text

    def __enter__(self) -> _PoolErrors:
        self._logger.addHandler(self)
        self._logger.propagate = False
        return self

    def __exit__(self, *exc_info: object) -> None:
        self._logger.removeHandler(self)
        self._logger.propagate = self._propagate


def _error(message: str) -> int:
    # A driver message can quote the connection string; never let a password out.
    print(f"pgcrond: error: {redact(message)}", file=sys.stderr)
    return EXIT_ERROR


def _target(args: argparse.Namespace) -> Target:
    if args.config:
        config = load_config(args.config, database_url=args.database_url)
        url = config.database.url
        if config.database.embedded:
            url = running_dsn(state_home(config.database.state_dir)[0] / "data")
        if url is None:
            raise CommandError(
                "the config uses an embedded server, and it is not running: start "
                "`pgcrond run` with this config first, or pass --database-url "
                f"(or set {DATABASE_URL_ENV})"
            )
        return Target(url, config.database.schema, config.database.table, config)
    url = args.database_url or os.environ.get(DATABASE_URL_ENV)
    if not url:
        raise CommandError(
            f"no database: pass --database-url URL, set {DATABASE_URL_ENV}, "
            "or pass -c CONFIG to use its database.url"
        )
    return Target(url, "pgcrond", "leases", None)


async def _with_store(
    args: argparse.Namespace, target: Target, body: Body, *, needs_table: bool
) -> int:
    db = Database(target.url, min_size=1, max_size=1, timeout=CONNECT_TIMEOUT_S)
    await db.open()
    try:
        store = LeaseStore(db, schema=target.schema, table=target.table)
        if needs_table and not await records.table_exists(store):
            raise CommandError(
                f"the lease table {target.table_name} does not exist in this database: "
                "run `pgcrond migrate` first (with the same -c or --database-url)"
            )
        return await body(args, target, store)
    finally:
        await db.close()
