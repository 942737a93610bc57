"""What a run executes: a command, a shell script, a Python entrypoint, SQL or an HTTP call.

These types live apart from ``config`` so that the runner, which executes them,
does not depend on the YAML loader that builds them.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import timedelta
from types import MappingProxyType
from typing import Any, Literal
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

from pgcrond.core.sqlscript import SqlScript, compile_script
from pgcrond.errors import ValidationError


@dataclass(frozen=True)
class CommandAction:
    """An argv executed without a shell: no word splitting, no expansion."""

    argv: tuple[str, ...]

    def __post_init__(self) -> None:
        if not self.argv:
            raise ValidationError("command", "must name a program")


@dataclass(frozen=True)
class ShellAction:
    """A script run by ``/bin/sh -c``."""

    script: str


@dataclass(frozen=True)
class EntrypointAction:
    """A Python callable (``pkg.module:function`` or a ``pgcrond.jobs`` entry point name).

    ``isolate`` runs it in a child interpreter, which can be killed like a command.
    """

    target: str
    isolate: bool = False


@dataclass(frozen=True)
class SqlAction:
    """Statements run in the same transaction as the SUCCESS record of the run's lease row.

    ``text`` is the job's SQL as written (``:name`` placeholders, see
    :mod:`pgcrond.core.sqlscript`); ``script`` its statements for the driver.
    ``statement_timeout`` is sent as ``SET LOCAL statement_timeout``; ``role``
    (optional) as ``SET LOCAL ROLE`` for the job's statements only.
    """

    text: str
    statement_timeout: timedelta
    role: str | None = None
    script: SqlScript = field(init=False, compare=False, repr=False)

    def __post_init__(self) -> None:
        try:
            script = compile_script(self.text)
        except ValueError as exc:
            raise ValidationError("sql", str(exc)) from None
        object.__setattr__(self, "script", script)
        if self.statement_timeout <= timedelta(0):
            raise ValidationError("timeout", "must be longer than 0")


# The two streams of an attempt's output (pgcrond.run.output keeps them).
OutputStream = Literal["stdout", "stderr"]


@dataclass(frozen=True)
class SqlWork:
    """One run's ``sql:`` statements with their bound values, for the guard to commit."""

    statements: tuple[str, ...]
    params: Mapping[str, Any]
    statement_timeout: timedelta
    role: str | None = None
    # Told what the attempt record keeps, (stream, bytes): each statement's
    # command tag on "stdout", the server's notices on "stderr".
    output: Callable[[OutputStream, bytes], None] | None = field(
        default=None, compare=False, repr=False
    )


# What committing SQL work together with SUCCESS came to: both, or neither
# because another replica holds the identity now.
Committed = Literal["done", "fenced"]

DEFAULT_EXPECT = frozenset(range(200, 300))


@dataclass(frozen=True)
class HttpAction:
    """One HTTP request per attempt, carrying the run's idempotency key and fencing token.

    A response whose status is in ``expect`` is a success. Connect errors,
    timeouts, 5xx, 408 and 429 are transient (retried under the job's retry
    policy, after ``Retry-After`` if the server sent one); any other status is
    a failure no retry can fix. Header values may name ``${VAR}``s of the
    run's environment (which never holds pgcrond's own secrets).
    """

    url: str
    method: str = "POST"
    headers: Mapping[str, str] = field(default_factory=lambda: MappingProxyType({}))
    body: str | None = None
    timeout: timedelta = timedelta(seconds=30)
    expect: frozenset[int] = DEFAULT_EXPECT
    idempotency_header: str = "Idempotency-Key"
    fencing_header: str = "X-Fencing-Token"
    # The most of the response body that is read; it is streamed, never held.
    max_response: int = 16 << 20

    def __post_init__(self) -> None:
        if not self.url.startswith(("http://", "https://")):
            raise ValidationError("http.url", "must start with http:// or https://")

    @property
    def shown_url(self) -> str:
        """The URL fit for logs: no user info, every query value replaced by ``***``."""
        parts = urlsplit(self.url)
        netloc = parts.netloc.rpartition("@")[2]
        query = urlencode([(name, "***") for name, _ in parse_qsl(parts.query, True)], safe="*")
        return urlunsplit(parts._replace(netloc=netloc, query=query))


Action = CommandAction | ShellAction | EntrypointAction | SqlAction | HttpAction
