"""The run context: what a job knows about the run it is part of.

Commands and shell scripts see it as ``PGCRON_*`` environment variables,
entrypoints as a :class:`RunContext` argument. Both forms are produced and read
here, so the isolated child (``pgcrond.run.isolated``) rebuilds exactly the context
an in-process entrypoint would have received.
"""

from __future__ import annotations

import functools
import sys
from collections.abc import Mapping
from contextvars import ContextVar
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from types import MappingProxyType
from typing import Protocol

import structlog
from structlog.typing import FilteringBoundLogger

from pgcrond.core.cancel import Cancellation
from pgcrond.core.trigger import TRIGGER_KINDS, TriggerKind

ENV_PREFIX = "PGCRON_"
# The W3C trace context of the attempt this task runs, set by the daemon's
# tracing (the otel extra) before the run starts: handed to the job as
# TRACEPARENT (and to an http: job as its traceparent header), so that the
# job's own spans join the run's trace. Unset: no variable.
TRACEPARENT: ContextVar[str | None] = ContextVar("pgcrond_traceparent", default=None)
_JOB_LOG: FilteringBoundLogger = structlog.get_logger("pgcrond.job")


def iso_utc(moment: datetime) -> str:
    """``2026-03-29T01:30:00Z``: UTC, with a ``Z`` that every ISO parser accepts."""
    return moment.astimezone(UTC).isoformat().replace("+00:00", "Z")


class Writer(Protocol):
    """What ``ctx.stdout`` and ``ctx.stderr`` are: enough for ``write()`` and ``print(file=)``."""

    def write(self, text: str, /) -> int: ...

    def flush(self) -> None: ...


class RunFacts(Protocol):
    """What the ``PGCRON_*`` variables tell of a run: a run request's or a context's fields."""

    @property
    def job(self) -> str: ...
    @property
    def run_key(self) -> str: ...
    @property
    def fire_time(self) -> datetime: ...
    @property
    def attempt(self) -> int: ...
    @property
    def idempotency_key(self) -> str: ...
    @property
    def idempotency_key_hex(self) -> str: ...
    @property
    def fencing_token(self) -> int | None: ...
    @property
    def trigger(self) -> TriggerKind: ...


def run_variables(run: RunFacts, deadline: datetime | None) -> dict[str, str]:
    """A run's ``PGCRON_*`` variables (:meth:`RunContext.environ`; read by ``from_environ``)."""
    variables = {
        "PGCRON_IDEMPOTENCY_KEY": run.idempotency_key,
        "PGCRON_IDEMPOTENCY_KEY_HEX": run.idempotency_key_hex,
        "PGCRON_JOB": run.job,
        "PGCRON_RUN_KEY": run.run_key,
        "PGCRON_FIRE_TIME": iso_utc(run.fire_time),
        "PGCRON_ATTEMPT": str(run.attempt),
        "PGCRON_TRIGGER": run.trigger,
    }
    if run.fencing_token is not None:
        variables["PGCRON_FENCING_TOKEN"] = str(run.fencing_token)
    if deadline is not None:
        variables["PGCRON_DEADLINE"] = iso_utc(deadline)
    parent = TRACEPARENT.get()
    if parent is not None:
        variables["TRACEPARENT"] = parent
    return variables


@dataclass(frozen=True)
class RunContext:
    """Passed as the single argument to an entrypoint.

    ``env`` is the whole environment the run would get as a command (secrets
    stripped, job env and ``PGCRON_*`` applied); an in-process entrypoint shares
    the daemon's ``os.environ`` and must read its settings from here instead.
    ``cwd`` is the job's working directory; only an isolated entrypoint actually
    runs in it, because changing directory would affect the whole daemon.
    ``stdout`` and ``stderr`` are the run's own streams: what an in-process
    entrypoint writes there is logged and kept in its attempt record, as a
    command's output is (in an isolated child they are the process's own).
    """

    job: str
    run_key: str
    fire_time: datetime
    attempt: int
    idempotency_key: str
    idempotency_key_hex: str
    fencing_token: int | None
    # Why this attempt runs: schedule, manual, backfill, catch_up, retry, takeover.
    trigger: TriggerKind
    deadline: datetime | None
    env: Mapping[str, str]
    cwd: Path | None
    cancelled: Cancellation
    stdout: Writer = field(default_factory=lambda: sys.stdout, compare=False, repr=False)
    stderr: Writer = field(default_factory=lambda: sys.stderr, compare=False, repr=False)

    @functools.cached_property
    def log(self) -> FilteringBoundLogger:
        """A logger bound to this run (made on first use: most jobs never log)."""
        return _JOB_LOG.bind(job=self.job, run_key=self.run_key)

    def check(self) -> None:
        """Raise :class:`pgcrond.errors.Cancelled` once the run is being stopped."""
        self.cancelled.check()

    def environ(self) -> dict[str, str]:
        """The ``PGCRON_*`` variables describing this run."""
        return run_variables(self, self.deadline)

    @classmethod
    def from_environ(
        cls, environ: Mapping[str, str], cancelled: Cancellation, cwd: Path | None = None
    ) -> RunContext:
        """The inverse of :meth:`environ`, for a child process started by the runner."""
        token = environ.get("PGCRON_FENCING_TOKEN")
        deadline = environ.get("PGCRON_DEADLINE")
        return cls(
            job=environ["PGCRON_JOB"],
            run_key=environ["PGCRON_RUN_KEY"],
            fire_time=datetime.fromisoformat(environ["PGCRON_FIRE_TIME"]),
            attempt=int(environ["PGCRON_ATTEMPT"]),
            idempotency_key=environ["PGCRON_IDEMPOTENCY_KEY"],
            idempotency_key_hex=environ["PGCRON_IDEMPOTENCY_KEY_HEX"],
            fencing_token=None if token is None else int(token),
            trigger=_trigger(environ.get("PGCRON_TRIGGER")),
            deadline=None if deadline is None else datetime.fromisoformat(deadline),
            env=MappingProxyType(dict(environ)),
            cwd=cwd,
            cancelled=cancelled,
        )


def _trigger(value: str | None) -> TriggerKind:
    """``PGCRON_TRIGGER`` as the runner set it (a child started by this runner always has it)."""
    for kind in TRIGGER_KINDS:
        if kind == value:
            return kind
    raise ValueError(f"PGCRON_TRIGGER {value!r} is not one of {', '.join(TRIGGER_KINDS)}")
