"""The one field table: every YAML key, its converter, its default and what it means.

The loader reads fields through this table, the frozen models take their
defaults from it, and the JSON Schema and the docs' tables are generated
from it; a default is written here and nowhere else.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from types import MappingProxyType
from typing import Any, Literal

from pgcrond.config import converters as c
from pgcrond.core.box import Cgroups
from pgcrond.core.keys import KeyHash
from pgcrond.core.overlap import Concurrency

Guard = Literal["lease", "advisory"]
CatchUp = Literal["none", "latest", "all"]
LateTicks = Literal["coalesce", "all"]

DATABASE_URL_ENV = "PGCROND_DATABASE_URL"
# The floor of history_retention whatever the jobs say; see models.min_history_retention.
MIN_HISTORY_RETENTION = timedelta(hours=1)


class _Required:
    """No default: the field must be given (or, for a schedule or action, one of its group)."""

    def __repr__(self) -> str:
        return "REQUIRED"


REQUIRED: Any = _Required()


@dataclass(frozen=True)
class Field:
    """One YAML key: ``name -> converter -> default``; ``defaultable``: ``defaults:`` may set it."""

    name: str
    convert: c.Converter[Any]
    default: Any
    doc: str
    defaultable: bool = False


def _table(*fields: Field) -> Mapping[str, Field]:
    return MappingProxyType({f.name: f for f in fields})


TOP = _table(
    Field(
        "shutdown_grace",
        c.duration,
        timedelta(seconds=30),
        "on SIGTERM, how long running jobs may finish",
    ),
    Field(
        "history_retention",
        c.positive_duration,
        timedelta(days=30),
        "finished runs older than this are pruned; at least max(1h, misfire_grace + lease)",
    ),
    Field(
        "catch_up_window",
        c.positive_duration,
        timedelta(hours=24),
        "how far back a starting replica looks for ticks no replica ran (recorded MISSED, "
        "or run by catch_up)",
    ),
    Field(
        "spread",
        c.duration,
        timedelta(milliseconds=25),
        "how long a replica holds back a tick's claim that another live replica is "
        "preferred for, so the runs of a tick are shared; 0 turns sharing off",
    ),
    Field(
        "cgroups",
        c.choice(Cgroups),
        "auto",
        "auto: each attempt of a command, shell or isolated job in a cgroup of its own where "
        "pgcrond can make one (delegated v2, or v1), else rlimits; never: rlimits only",
    ),
)
# Sections of the top level; their fields are in the tables below.
TOP_SECTIONS = ("database", "defaults", "jobs", "http", "calendars")
# A calendar of ``calendars:`` (pgcrond/config/calendars.py reads it).
CALENDAR_KEYS = ("days", "yearly", "include")

DATABASE = _table(
    Field(
        "url",
        c.string,
        None,
        "PostgreSQL URL or key=value DSN; ${VAR} and ${VAR:-default} read the environment, $$ is $",
    ),
    Field("embedded", c.boolean, False, "a local PostgreSQL that pgcrond starts itself"),
    Field(
        "state_dir",
        c.path,
        Path(".pgcrond"),
        "embedded only: where the local server keeps its files",
    ),
    Field("schema", c.identifier, "pgcrond", "schema of the lease table"),
    Field("table", c.identifier, "leases", "name of the lease table"),
    Field(
        "prepared_statements",
        c.boolean,
        False,
        "server-side prepared claims: only direct, session pooling or PgBouncer >= 1.21",
    ),
    Field(
        "sql_connections",
        c.positive_count,
        4,
        "connections for sql: jobs' transactions, apart from the claims' pool: one per "
        "running sql: job; more wait for one within their timeout",
    ),
)

HTTP = _table(
    Field(
        "listen",
        c.listen,
        "127.0.0.1:9464",
        "address of /healthz, /readyz and /metrics: HOST:PORT, [V6]:PORT or :PORT; '' turns it off",
    ),
    Field(
        "status_page",
        c.page_switch,
        True,
        "serve the status page at /status: true serves it on a loopback listener, or with "
        "users or trusted_proxies; public also serves it open on any listener (every job's "
        "recent output included); false: /status answers 404. /metrics and health always stay",
    ),
    Field(
        "users",
        c.users,
        MappingProxyType({}),
        "status page users: name -> hash from `pgcrond hash-password` (an operator), or "
        "name -> {password: HASH, role: viewer|operator, jobs: [GLOB, ...]}; with users or "
        "trusted_proxies the page asks who you are",
    ),
    Field(
        "trusted_proxies",
        c.networks,
        (),
        "addresses or CIDRs of the reverse proxies whose proxy_header names the signed-in "
        "user; from anywhere else that header is ignored",
    ),
    Field(
        "proxy_header",
        c.header_name,
        "X-Forwarded-User",
        "the header a trusted proxy names its signed-in user in",
    ),
    Field(
        "proxy_role",
        c.role,
        "viewer",
        "the role of a user a trusted proxy names who is not listed in users",
    ),
    Field(
        "csrf_secret",
        c.nonempty_string,
        None,
        "the key the page's form tokens are signed with; give every replica behind one "
        "load balancer the same (e.g. ${PGCROND_CSRF_SECRET}); unset: a random key per replica",
    ),
    Field(
        "tls",
        c.tls,
        None,
        "{cert: FILE, key: FILE}: serve HTTPS with this PEM chain and key, read again on SIGHUP",
    ),
    Field(
        "allow_plaintext_passwords",
        c.boolean,
        False,
        "let users sign in with passwords over plain HTTP on a listener other than loopback "
        "(anyone on the path reads them); without it, check and run refuse that config",
    ),
    Field(
        "max_connections",
        c.positive_count,
        256,
        "open HTTP connections at most; when full, the oldest idle one is closed for a new one",
    ),
    Field(
        "idle_timeout",
        c.positive_duration,
        timedelta(seconds=5),
        "a connection that sends no whole request (or body) within this long is closed",
    ),
)

SCHEDULE_KEYS = ("cron", "every", "once", "at")
ACTION_KEYS = ("command", "shell", "entrypoint", "sql", "http")

JOB = _table(
    Field(
        "cron",
        c.expressions,
        REQUIRED,
        "cron(8) expression, 5 fields or 6 with seconds first (L, LW, 15W, 5L, fri#2, ? "
        "in the day fields), or a list of them: a tick of any runs, once",
    ),
    Field(
        "every",
        c.every,
        REQUIRED,
        "a tick every this long (whole seconds, 1s or more), at 1970-01-01T00:00:00Z + "
        "k x every + phase in UTC instants, the same on every replica",
    ),
    Field("phase", c.phase, timedelta(0), "every: shifts its ticks by this much; below every"),
    Field(
        "between",
        c.between,
        None,
        "{start, end}: no tick before start or from end on; a date is a local day of the "
        "job's zone (start: from its midnight, end: through its end)",
    ),
    Field(
        "skip_on",
        c.names,
        (),
        "calendars (top-level calendars:) on whose days (in the job's zone) no tick runs "
        "(each such tick is recorded SKIPPED calendar:<name>)",
        True,
    ),
    Field(
        "dst",
        c.dst,
        None,
        "cron at a clock change: {skipped: shift|skip, repeated: first|last|both}; "
        "default shift and first; both runs a repeated time twice, under two run keys",
        True,
    ),
    Field("once", c.once, REQUIRED, "run once per cluster, at the first start"),
    Field(
        "at", c.iso_datetime, REQUIRED, "one tick at this instant (the job's zone without offset)"
    ),
    Field("command", c.argv, REQUIRED, "argv list, executed without a shell"),
    Field("shell", c.nonempty_string, REQUIRED, "a command line run by /bin/sh -c"),
    Field(
        "entrypoint",
        c.nonempty_string,
        REQUIRED,
        "package.module:function, or a pgcrond.jobs entry point",
    ),
    Field(
        "sql",
        c.sql,
        REQUIRED,
        "statements committed with the run's SUCCESS; :idempotency_key, :run_key, "
        ":fire_time, :attempt, :fencing_token are bound parameters",
    ),
    Field(
        "http",
        c.http,
        REQUIRED,
        "an HTTP request {url, method, headers, body, timeout, expect} carrying "
        "Idempotency-Key and X-Fencing-Token",
    ),
    Field("guard", c.choice(Guard), "lease", "lease (a row per tick, fenced) or advisory", True),
    Field("timezone", c.zone, "UTC", "IANA zone the schedule is read in", True),
    Field(
        "lease",
        c.duration,
        # A job's lease must be able to run out within its misfire grace, or a dead
        # winner's tick could never be taken over: 1 min lease (heartbeat every 20 s),
        # 5 min grace. The library's own default lease stays the reference's 15 min.
        timedelta(minutes=1),
        "how long a claim holds without a heartbeat; below misfire_grace",
        True,
    ),
    Field(
        "heartbeat",
        c.duration,
        None,
        "lease renewal interval, default min(60s, lease/3); 0 = off",
        True,
    ),
    Field("timeout", c.timeout, None, "stop a run after this long; null = none", True),
    Field("retries", c.count, 0, "extra attempts after a failure", True),
    Field(
        "on_start",
        c.hook,
        None,
        "when a run starts (each attempt): {webhook: URL, command: [argv], timeout, retries}",
        True,
    ),
    Field(
        "on_success",
        c.hook,
        None,
        "when a run succeeds: {webhook: URL, command: [argv], timeout, retries}",
        True,
    ),
    Field(
        "on_failure",
        c.hook,
        None,
        "when a run fails for good, runs past max_duration, starts past start_deadline, or "
        "the job is paused after failures: {webhook: URL, command: [argv], timeout, retries}",
        True,
    ),
    Field(
        "on_recovery",
        c.hook,
        None,
        "the first success after failures: {webhook: URL, command: [argv], timeout, retries}",
        True,
    ),
    Field(
        "on_missed",
        c.hook,
        None,
        "when a tick is recorded MISSED: {webhook: URL, command: [argv], timeout, retries}",
        True,
    ),
    Field(
        "ping",
        c.ping,
        None,
        "a dead-man's switch: URL/start, URL on success, URL/fail with the output tail "
        "(healthchecks.io); {url, cronitor: true}: ?state=run|complete|fail",
    ),
    Field(
        "max_duration",
        c.timeout,
        None,
        "report a run still running after this long (run_overdue: log, metric, on_failure); "
        "it is not stopped (timeout: stops)",
        True,
    ),
    Field(
        "start_deadline",
        c.timeout,
        None,
        "report a run that starts later than this after its tick (start_overdue: log, "
        "metric, on_failure); it still runs inside misfire_grace",
        True,
    ),
    Field(
        "pause_after_failures",
        c.positive_count,
        None,
        "after this many failed ticks in a row, pause the job cluster-wide (who: pgcrond); "
        "any success resets the count; lease guard only",
        True,
    ),
    Field(
        "retry_delay",
        c.positive_duration,
        timedelta(seconds=30),
        "base of the exponential backoff between attempts: the retry after attempt n "
        "waits between half and all of min(1h, retry_delay * 2^(n-1))",
        True,
    ),
    Field(
        "min_hold",
        c.duration,
        timedelta(seconds=5),
        "advisory: hold the lock at least this long",
        True,
    ),
    Field(
        "misfire_grace",
        c.positive_duration,
        timedelta(minutes=5),
        "a fire (or takeover) starting later than this after its tick is not run",
        True,
    ),
    Field(
        "concurrency",
        c.choice(Concurrency),
        "forbid",
        "while a tick of the job runs, a new tick: forbid: is skipped; allow: runs too "
        "(see max_concurrent); replace: stops the running one, then runs; buffer_one: waits "
        "for it (one waits at most, later ones are skipped); lease guard only but forbid, allow",
        True,
    ),
    Field(
        "max_concurrent",
        c.positive_count,
        None,
        "with concurrency: allow (implied when not given), at most this many ticks of the "
        "job run at once across the cluster; a tick beyond is skipped; lease guard only",
        True,
    ),
    Field("env", c.env, MappingProxyType({}), "extra environment variables (text values)", True),
    Field("cwd", c.path, None, "working directory of runs", True),
    Field(
        "env_file",
        c.paths,
        (),
        "dotenv file(s) read at load into the job's environment, under env: (env wins); "
        "their values are kept out of logs and output",
        True,
    ),
    Field(
        "env_passthrough",
        c.variable_globs,
        (),
        "pgcrond's own variables (names or globs) a job inherits besides PATH, HOME, USER, "
        'LOGNAME, SHELL, TMPDIR, LANG, LANGUAGE, LC_*, TZ; ["*"]: all (the secrets never)',
        True,
    ),
    Field(
        "params",
        c.param_names,
        None,
        "the parameters a manual run or backfill may hand it (`--env NAME=VALUE`); any "
        "other name is refused. Unset: any variable name (not PGCRON_*) is accepted",
    ),
    Field(
        "user",
        c.account,
        None,
        "run child processes as this user (name or uid); pgcrond must run as root",
        True,
    ),
    Field(
        "group",
        c.account,
        None,
        "run child processes with this group (name or gid); default the user's own",
        True,
    ),
    Field(
        "limits",
        c.limits,
        None,
        "{memory: 512MiB, cpu: 50%, nofile: 1024, processes: 64} per attempt: a cgroup "
        "where pgcrond can make one, else rlimits",
        True,
    ),
    Field("isolate", c.boolean, False, "entrypoint only: run in a child interpreter"),
    Field(
        "role",
        c.nonempty_string,
        None,
        "sql only: SET LOCAL ROLE for the job's statements (least privilege)",
    ),
    Field(
        "database",
        c.nonempty_string,
        None,
        "sql only: must name the lease database (database.url); the statements commit "
        "in the lease row's transaction",
    ),
    Field("key_hash", c.choice(KeyHash), "pgcrond", "advisory only: how lock ids are derived"),
    Field(
        "lock_key",
        c.lock_key,
        None,
        "advisory only: text or a 64-bit integer; default the job code",
    ),
    Field(
        "suspended",
        c.boolean,
        False,
        "true: no tick runs; each is recorded SKIPPED/suspended (like `pgcrond pause`)",
    ),
    Field(
        "catch_up",
        c.choice(CatchUp),
        "none",
        "ticks missed while no replica could run them: none (record MISSED), latest "
        "(run the newest once), all (run each, in order)",
        True,
    ),
    Field(
        "late_ticks",
        c.choice(LateTicks),
        "coalesce",
        "several ticks due at once inside misfire_grace (a restart, a stall, a clock step): "
        "coalesce (run the newest, record the others MISSED/coalesced), all (run each)",
        True,
    ),
    Field(
        "max_catch_up",
        c.count,
        10,
        "catch_up: all: run at most this many missed ticks (the newest); older ones are MISSED",
        True,
    ),
    Field(
        "alert_after",
        c.timeout,
        None,
        "the job is stale when it has not succeeded for this long (gauge, /readyz detail)",
        True,
    ),
    Field(
        "jitter",
        c.duration,
        timedelta(0),
        "fire up to this long after each tick, by a stable hash of (job, tick); "
        "the run key stays the tick's",
        True,
    ),
    Field(
        "history_retention",
        c.positive_duration,
        None,
        "this job's finished runs are pruned after this long instead of the top-level "
        "history_retention (e.g. short for a per-second job); at least "
        "max(1h, misfire_grace + lease)",
        True,
    ),
    Field(
        "renamed_from",
        c.codes,
        (),
        "old codes of this job: at start its history, pause and run-once state move to "
        "this code (docs/operations.md)",
    ),
    Field("description", c.string, None, "free text"),
)
DEFAULTABLE = tuple(name for name, f in JOB.items() if f.defaultable)


def default(table: Mapping[str, Field], name: str) -> Any:
    """The default of one field, for the models' own defaults."""
    return table[name].default
