"""Every error pgcrond raises on purpose derives from :class:`PgcrondError`.

The docstring of each class is its default message, so ``raise LeaseLost()``
still says something useful. Driver errors (psycopg) are translated once, at
the storage boundary, and chained with ``from``.
"""

from __future__ import annotations

import enum
from collections.abc import Sequence
from dataclasses import dataclass


class ExitCode(enum.IntEnum):
    """What every pgcrond command exits with; handlers return one of these."""

    # Done: the config is valid, the daemon stopped cleanly, the run succeeded.
    OK = 0
    # The command ran but did not get it done: a triggered run failed, the
    # operator said no, the row moved on, the daemon stopped on an error.
    FAILED = 1
    # Nothing was done: a bad config or argument, or the database refused.
    ERROR = 2
    # `trigger`: not run here, because the run key runs or ran elsewhere.
    NOT_RUN_HERE = 3
    # `run`: a second SIGINT stopped it without draining (128 + SIGINT, as shells report).
    INTERRUPTED = 130
    # The reader of stdout went away (`pgcrond next | head -1`): 128 + SIGPIPE,
    # what a shell reports for `seq` or `cat` in the same place.
    PIPE_CLOSED = 141


class PgcrondError(Exception):
    """pgcrond failed."""

    def __init__(self, message: str | None = None) -> None:
        super().__init__(message or (self.__doc__ or "").strip())


class ValidationError(PgcrondError, ValueError):
    """A value is not allowed."""

    def __init__(self, field: str, message: str) -> None:
        self.field = field
        super().__init__(f"{field}: {message}")


@dataclass(frozen=True)
class ConfigIssue:
    """One problem in a configuration file, located as precisely as we can."""

    file: str
    line: int | None
    job: str | None
    field: str | None
    message: str

    def __str__(self) -> str:
        where = self.file if self.line is None else f"{self.file}:{self.line}"
        parts = [where]
        if self.job is not None:
            parts.append(f"job {self.job!r}")
        if self.field is not None:
            parts.append(f"field {self.field!r}")
        return ": ".join(parts) + f": {self.message}"


class ConfigError(PgcrondError):
    """The configuration is not valid."""

    def __init__(self, issues: Sequence[ConfigIssue]) -> None:
        self.issues = tuple(issues)
        count = len(self.issues)
        lines = "\n".join(f"  {issue}" for issue in self.issues)
        super().__init__(f"{count} configuration error{'s' if count != 1 else ''}:\n{lines}")


class DatabaseUnavailable(PgcrondError):
    """The database could not be reached; the operation may be retried."""


class LeaseLost(PgcrondError):
    """The lease was taken over by another owner (its owner token rotated away)."""


class Cancelled(PgcrondError):
    """The run was cancelled."""

    def __init__(self, reason: str) -> None:
        self.reason = reason
        super().__init__(f"run cancelled: {reason}")


class EmbeddedServerError(PgcrondError):
    """The embedded PostgreSQL server could not be started."""


class SqlJobFailed(PgcrondError):
    """An sql: job's statement failed; its transaction was rolled back."""

    def __init__(
        self, message: str, sqlstate: str | None = None, *, permanent: bool = False
    ) -> None:
        self.sqlstate = sqlstate
        # Not to be retried: a statement ended the transaction itself, so what
        # it did may have committed (a retry would do it again).
        self.permanent = permanent
        super().__init__(message)


class DatabaseError(PgcrondError):
    """The database rejected a statement."""


class CommandError(PgcrondError):
    """The command cannot go on; the message says what to do instead."""


class EntrypointError(PgcrondError):
    """The entrypoint cannot be resolved."""


class Unsupported(PgcrondError):
    """This guard cannot do that."""


class ReplicaNameTaken(PgcrondError):
    """Another live replica in the registry has this replica's name."""
