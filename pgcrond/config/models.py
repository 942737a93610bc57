"""The frozen config models, built once by the loader; everything inside trusts them.

Defaults come from :mod:`pgcrond.config.fields`, the one table that also
drives the loader and the JSON Schema.
"""

# The dataclass defaults below are calls into the field table; each returns an
# immutable value (str, bool, timedelta, Path, None), shared safely.
# ruff: noqa: RUF009

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, fields, replace
from datetime import timedelta
from ipaddress import IPv4Network, IPv6Network
from pathlib import Path
from types import MappingProxyType
from zoneinfo import ZoneInfo

from pgcrond.config.fields import (
    DATABASE,
    HTTP,
    JOB,
    MIN_HISTORY_RETENTION,
    TOP,
    CatchUp,
    Guard,
    LateTicks,
    default,
)
from pgcrond.config.listen import is_loopback
from pgcrond.core.access import PageUser, Role, TlsFiles
from pgcrond.core.actions import Action
from pgcrond.core.box import Box, Cgroups
from pgcrond.core.hooks import Hook, Ping
from pgcrond.core.keys import KeyHash
from pgcrond.core.overlap import Concurrency, Overlap, overlap_of, parse_concurrency
from pgcrond.core.redaction import redact, remember
from pgcrond.core.schedule import Calendar, OnceSchedule, Schedule
from pgcrond.core.timing import LeaseTiming
from pgcrond.errors import ConfigIssue, ValidationError

DEFAULT_HTTP_LISTEN: str = default(HTTP, "listen")
DEFAULT_SHUTDOWN_GRACE: timedelta = default(TOP, "shutdown_grace")
DEFAULT_HISTORY_RETENTION: timedelta = default(TOP, "history_retention")
DEFAULT_CATCH_UP_WINDOW: timedelta = default(TOP, "catch_up_window")
DEFAULT_SPREAD: timedelta = default(TOP, "spread")
DEFAULT_RETRY_DELAY: timedelta = default(JOB, "retry_delay")
DEFAULT_MIN_HOLD: timedelta = default(JOB, "min_hold")
DEFAULT_JOB_LEASE: timedelta = default(JOB, "lease")
DEFAULT_MISFIRE_GRACE: timedelta = default(JOB, "misfire_grace")
DEFAULT_TIMEZONE = ZoneInfo(default(JOB, "timezone"))


@dataclass(frozen=True)
class DatabaseConfig:
    """Where the lease table lives: a URL, or a local server pgcrond starts (``embedded``)."""

    url: str | None
    embedded: bool = default(DATABASE, "embedded")
    state_dir: Path = default(DATABASE, "state_dir")
    schema: str = default(DATABASE, "schema")
    table: str = default(DATABASE, "table")
    prepared_statements: bool = default(DATABASE, "prepared_statements")
    sql_connections: int = default(DATABASE, "sql_connections")
    # The environment variables `url` was read from (its ${VAR}s): kept out of jobs.
    url_variables: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        # Every later redact() scrubs this password, also the fragments libpq may
        # quote on their own (a host name holding the tail of a password); no
        # job's environment carries it, nor the variables it came from.
        remember(self.url, self.url_variables)

    @property
    def redacted_url(self) -> str | None:
        """The URL with its password replaced by ``***``: the only form fit for logs."""
        return None if self.url is None else redact(self.url)

    def __repr__(self) -> str:
        # The default repr would print the password into any log or traceback.
        return (
            f"DatabaseConfig(url={self.redacted_url!r}, embedded={self.embedded!r}, "
            f"state_dir={self.state_dir!r}, schema={self.schema!r}, table={self.table!r}, "
            f"prepared_statements={self.prepared_statements!r}, "
            f"sql_connections={self.sql_connections!r})"
        )


@dataclass(frozen=True, slots=True)
class JobConfig:
    """One job, with the defaults already applied.

    Slotted: a replica holds one per job for its whole life, and an instance
    dict of 40-odd fields was 1.5 KB of each (15 MiB of a replica at 10,000
    jobs).
    """

    code: str
    schedule: Schedule
    action: Action
    guard: Guard = default(JOB, "guard")
    timezone: ZoneInfo = DEFAULT_TIMEZONE
    timing: LeaseTiming = field(default_factory=lambda: LeaseTiming.build(DEFAULT_JOB_LEASE))
    timeout: timedelta | None = default(JOB, "timeout")
    retries: int = default(JOB, "retries")
    on_start: Hook | None = default(JOB, "on_start")
    on_success: Hook | None = default(JOB, "on_success")
    on_failure: Hook | None = default(JOB, "on_failure")
    on_recovery: Hook | None = default(JOB, "on_recovery")
    on_missed: Hook | None = default(JOB, "on_missed")
    ping: Ping | None = default(JOB, "ping")
    # Reported, not enforced: a run past it, a start later than it after the tick.
    max_duration: timedelta | None = default(JOB, "max_duration")
    start_deadline: timedelta | None = default(JOB, "start_deadline")
    pause_after_failures: int | None = default(JOB, "pause_after_failures")
    retry_delay: timedelta = DEFAULT_RETRY_DELAY
    min_hold: timedelta = DEFAULT_MIN_HOLD
    misfire_grace: timedelta = DEFAULT_MISFIRE_GRACE
    concurrency: Concurrency = default(JOB, "concurrency")
    max_concurrent: int | None = default(JOB, "max_concurrent")
    env: Mapping[str, str] = field(default_factory=lambda: MappingProxyType({}))
    cwd: Path | None = default(JOB, "cwd")
    # The parameter names a manual run or backfill may pass; None: any valid name.
    params: tuple[str, ...] | None = default(JOB, "params")
    # Whom its child processes run as, their limits, what they inherit; its
    # env_file values are in `env` already (the paths are kept to be shown).
    box: Box = field(default_factory=Box)
    env_file: tuple[Path, ...] = default(JOB, "env_file")
    key_hash: KeyHash = default(JOB, "key_hash")
    # None means "the job code"; filled in below so that users of the field never see None.
    lock_key: str | int | None = default(JOB, "lock_key")
    description: str | None = default(JOB, "description")
    suspended: bool = default(JOB, "suspended")
    catch_up: CatchUp = default(JOB, "catch_up")
    max_catch_up: int = default(JOB, "max_catch_up")
    late_ticks: LateTicks = default(JOB, "late_ticks")
    alert_after: timedelta | None = default(JOB, "alert_after")
    # Its own pruning age, or None: the top-level history_retention.
    history_retention: timedelta | None = None
    jitter: timedelta = default(JOB, "jitter")
    # Old codes whose rows this job takes over at start (storage/renames.py).
    renamed_from: tuple[str, ...] = default(JOB, "renamed_from")
    # Where it is written is not part of the job: moving it is no change. The
    # file's name is one string for all of its jobs (a "file:line" kept per
    # job was 80 bytes of each).
    source_file: str = field(default="<code>", compare=False)
    source_line: int | None = field(default=None, compare=False)
    # Worked out from the fields above, once per job (not part of its definition):
    # something besides the metrics watches its runs (a hook, a ping, a report,
    # a pause rule), asked on every event of every fire (daemon/observers.py);
    # most jobs have none of them.
    observed: bool = field(init=False, compare=False, repr=False)
    # What its ticks do while one runs (``concurrency``, ``max_concurrent``), as claimed.
    overlap: Overlap = field(init=False, compare=False, repr=False)

    def __post_init__(self) -> None:
        if self.lock_key is None:
            object.__setattr__(self, "lock_key", self.code)
        observers = (
            self.on_start,
            self.on_success,
            self.on_failure,
            self.on_recovery,
            self.on_missed,
            self.ping,
            self.max_duration,
            self.start_deadline,
            self.pause_after_failures,
        )
        object.__setattr__(self, "observed", any(value is not None for value in observers))
        object.__setattr__(self, "overlap", overlap_of(self.concurrency, self.max_concurrent))

    @property
    def source(self) -> str:
        """Where the job is written: ``file:line``."""
        line = self.source_line
        return self.source_file if line is None else f"{self.source_file}:{line}"

    @property
    def is_once(self) -> bool:
        """A run-once job: attempted at start under the INITIAL identity, never on a tick."""
        return isinstance(self.schedule, OnceSchedule)

    # What its guard kind can do, said once for code that has the config and
    # not the guard (a guard says ``remembers`` itself: guard/base.py).

    def with_concurrency(self, text: str) -> JobConfig:
        """This job with its overlap policy overridden for one run (``--concurrency TEXT``).

        TEXT is ``forbid``, ``allow``, ``replace``, ``buffer_one`` or a whole
        number N (allow, at most N at once); :class:`ValidationError` names
        the field and what is wrong, as the YAML's own check does.
        """
        try:
            concurrency, bound = parse_concurrency(text)
        except ValueError as exc:
            raise ValidationError("concurrency", str(exc)) from None
        counted = bound is not None or concurrency in ("replace", "buffer_one")
        if self.guard != "lease" and counted:
            raise ValidationError(
                "concurrency",
                f"{text!r} needs guard: lease (the running ticks are counted in the lease table)",
            )
        return replace(self, concurrency=concurrency, max_concurrent=bound)

    @property
    def guard_remembers(self) -> bool:
        """Its guard keeps every tick's outcome in the lease table (history, retries, catch-up)."""
        return self.guard == "lease"

    @property
    def guard_holds_connection(self) -> bool:
        """Its guard holds a database connection while a run goes on (an advisory lock)."""
        return self.guard == "advisory"


def changed_fields(old: JobConfig, new: JobConfig) -> list[str]:
    """The names of the fields that differ between two versions of a job (a reload logs them)."""
    return [
        spec.name
        for spec in fields(JobConfig)
        if spec.compare and getattr(old, spec.name) != getattr(new, spec.name)
    ]


@dataclass(frozen=True)
class PageAccess:
    """Who may see the status page and act on it (the ``http:`` section's access fields).

    No users and no trusted proxies: the page is read-only, served on a
    loopback listener (or anywhere with ``status_page: public``). Either one:
    every page asks who you are; an operator may pause, resume and run jobs.
    """

    enabled: bool = True
    # status_page: public: served open on a listener that is not loopback too.
    public: bool = False
    users: Mapping[str, PageUser] = field(default_factory=lambda: MappingProxyType({}))
    trusted_proxies: tuple[IPv4Network | IPv6Network, ...] = ()
    proxy_header: str = default(HTTP, "proxy_header")
    proxy_role: Role = default(HTTP, "proxy_role")
    # The form tokens' key; None: a random one per replica. Never in a repr.
    csrf_secret: str | None = field(default=None, repr=False)

    @property
    def authenticated(self) -> bool:
        return bool(self.users or self.trusted_proxies)

    def served_on(self, host: str | None) -> bool:
        """Whether a listener on ``host`` (None: every interface) serves the page.

        Off a loopback address the page (every job's recent output) needs a
        sign-in or ``status_page: public``; the probes and /metrics are always served.
        """
        if not self.enabled:
            return False
        return self.authenticated or self.public or is_loopback(host)


@dataclass(frozen=True)
class HttpLimits:
    """The HTTP server's connection limits (``http.max_connections``, ``http.idle_timeout``)."""

    max_connections: int = default(HTTP, "max_connections")
    idle_timeout: timedelta = default(HTTP, "idle_timeout")


@dataclass(frozen=True)
class Config:
    files: tuple[str, ...]
    database: DatabaseConfig
    jobs: Mapping[str, JobConfig]
    # The listener the rules judged: ``run --http`` when given, else ``http.listen``.
    http_listen: str = DEFAULT_HTTP_LISTEN
    page_access: PageAccess = field(default_factory=PageAccess)
    http_limits: HttpLimits = field(default_factory=HttpLimits)
    http_tls: TlsFiles | None = None
    shutdown_grace: timedelta = DEFAULT_SHUTDOWN_GRACE
    history_retention: timedelta = DEFAULT_HISTORY_RETENTION
    catch_up_window: timedelta = DEFAULT_CATCH_UP_WINDOW
    spread: timedelta = DEFAULT_SPREAD
    cgroups: Cgroups = default(TOP, "cgroups")
    # The calendars: section by name (the jobs' schedules hold the ones they skip on).
    calendars: Mapping[str, Calendar] = field(default_factory=lambda: MappingProxyType({}))
    # What `check` shows but does not refuse: ${VAR}s left unset when linting.
    warnings: tuple[ConfigIssue, ...] = ()


def safe_retention(job: JobConfig) -> timedelta:
    """The shortest safe retention of one job's rows (see :func:`min_history_retention`)."""
    return max(MIN_HISTORY_RETENTION, job.misfire_grace + job.timing.lease)


@dataclass(frozen=True)
class PruneRule:
    """Finished rows older than ``older_than``, of ``only`` (None: every job but ``excluding``)."""

    older_than: timedelta
    only: tuple[str, ...] | None = None
    excluding: tuple[str, ...] = ()


def prune_rules(config: Config) -> list[PruneRule]:
    """How history is pruned: the top-level retention, and one rule per job-set of its own.

    A job with its own ``history_retention`` is left out of the top-level rule
    (its rows may be kept longer or shorter than the rest).
    """
    own: dict[timedelta, list[str]] = {}
    for job in config.jobs.values():
        if job.history_retention is not None:
            own.setdefault(job.history_retention, []).append(job.code)
    excluded = tuple(sorted(code for codes in own.values() for code in codes))
    rules = [PruneRule(config.history_retention, excluding=excluded)]
    rules += [PruneRule(age, only=tuple(sorted(codes))) for age, codes in sorted(own.items())]
    return rules


def min_history_retention(jobs: Mapping[str, JobConfig]) -> timedelta:
    """The shortest safe ``history_retention``: pruning younger rows can run a tick twice.

    A replica may still claim a tick up to ``misfire_grace`` after it (a late
    fire, or a takeover once the holder's ``lease`` ran out). If the finished
    row of that tick is gone by then, the claim finds no row and runs the tick
    afresh. So a row must outlive the longest ``misfire_grace + lease`` of any
    job, and never less than :data:`MIN_HISTORY_RETENTION` (1 hour).
    """
    return max([MIN_HISTORY_RETENTION, *(safe_retention(job) for job in jobs.values())])
