"""The only place SQL lives: the lease table's migrations and named queries.

Identifiers (schema, table) are configurable, so statements are templates
filled in with :mod:`psycopg.sql`; values are always bound parameters.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from functools import cache
from importlib import resources

from psycopg import sql

from pgcrond.errors import ValidationError

IDENTIFIER = re.compile(r"^[a-z_][a-z0-9_]{0,62}$")
_NAME_LINE = re.compile(r"^-- name: (\w+)\s*$", re.MULTILINE)


@cache
def named_queries() -> dict[str, str]:
    """Each named query's template, its leading comment lines included.

    The comments travel with the statement, so a statement seen on the server
    (``pg_stat_activity``, ``pg_stat_statements``) starts with its own.
    """
    text = resources.files(__package__).joinpath("queries.sql").read_text("utf-8")
    parts = _NAME_LINE.split(text)
    return {name: body.strip() for name, body in zip(parts[1::2], parts[2::2], strict=True)}


@cache
def migrations() -> tuple[tuple[int, str], ...]:
    """(version, SQL template) in order, from ``migrations/NNNN_*.sql``."""
    folder = resources.files(__package__).joinpath("migrations")
    found = sorted(
        (int(entry.name.split("_", 1)[0]), entry.read_text("utf-8"))
        for entry in folder.iterdir()
        if entry.name.endswith(".sql")
    )
    return tuple(found)


@dataclass(frozen=True)
class Queries:
    """The statements for one lease table, ready to execute."""

    schema: str
    table: str

    def __post_init__(self) -> None:
        for field in ("schema", "table"):
            value = getattr(self, field)
            if not IDENTIFIER.match(value):
                raise ValidationError(
                    field, f"{value!r} must match {IDENTIFIER.pattern} (lower-case SQL identifier)"
                )

    def _names(self) -> dict[str, sql.Composable]:
        def own(suffix: str) -> sql.Identifier:
            return sql.Identifier(f"{self.table}_{suffix}")

        return {
            "table": sql.Identifier(self.schema, self.table),
            "migrations": sql.Identifier(self.schema, f"{self.table}_migrations"),
            "fencing_seq": sql.Identifier(self.schema, f"{self.table}_fencing_seq"),
            "fencing_seq_name": sql.Literal(f'"{self.schema}"."{self.table}_fencing_seq"'),
            "lock_key_unique": own("lock_key_key"),
            "run_key_by_type": own("run_key_by_type"),
            "code_index": own("code_acquired_idx"),
            "running_index": own("running_idx"),
            "finished_index": own("finished_idx"),
            "waiting_index": own("waiting_idx"),
            "status_check": own("status_check"),
            "reason_check": own("reason_by_status"),
            "job_state": sql.Identifier(self.schema, f"{self.table}_job_state"),
            "requests": sql.Identifier(self.schema, f"{self.table}_requests"),
            "forbid_rows": sql.Identifier(self.schema, f"{self.table}_forbid"),
            "requests_pending": own("requests_pending_idx"),
            "requests_backfill": own("requests_backfill_idx"),
            "requests_trigger_check": own("requests_trigger_check"),
            "backfills": sql.Identifier(self.schema, f"{self.table}_backfills"),
            "replicas": sql.Identifier(self.schema, f"{self.table}_replicas"),
            "attempts": sql.Identifier(self.schema, f"{self.table}_attempts"),
            "attempts_status_check": own("attempts_status_check"),
        }

    @property
    def table_name(self) -> str:
        """The lease table as a quoted name, for ``to_regclass``."""
        return f'"{self.schema}"."{self.table}"'

    @property
    def migrations_name(self) -> str:
        """The migrations table as a quoted name, for ``to_regclass``."""
        return f'"{self.schema}"."{self.table}_migrations"'

    # Composed once per (table, query): statements are on the per-fire path.
    @cache  # noqa: B019 - a handful of long-lived, hashable Queries instances
    def get(self, name: str) -> sql.Composed:
        return sql.SQL(named_queries()[name]).format(**self._names())

    def migration(self, template: str) -> sql.Composed:
        return sql.SQL(template).format(**self._names())

    def create_schema(self) -> sql.Composed:
        return sql.SQL("CREATE SCHEMA IF NOT EXISTS {}").format(sql.Identifier(self.schema))
