"""The fault suite's checker: a pure function over rows.

Inputs, all read after the cluster settled, every time by the database clock:

* the **ledger** (tests/faults/ledger.py): what ran, written by the jobs
  straight to the server: job, run key, attempt, fencing token, pid, phase
  ('start', 'end' = the run's effect, 'fail', 'cancelled') and ``at``;
* the **lease table**'s rows (the daemon's record) and, when available, the
  **lease history** (every version of every row, from a trigger), which dates
  each claim;
* the **fault log**: each fault's kind, start and end, and the replica's pids
  it hit (none: the whole cluster);
* the jobs (period, misfire grace, forbid, run-once, ``sql:``) and the run window;
* the **detached requests** made during the run (``pgcrond trigger --detach``:
  job, run key, when), the **pauses** (``pgcrond pause`` / ``resume``: the job
  or ``*``, when each command ran and returned) and the **crashes** the
  replicas' logs show (:func:`crashes_in_log`).

An ``sql:`` job's effect is its ledger row, inserted by its statements in the
transaction that records its SUCCESS: it has no 'start' row, and none of the
lease's inherent limits applies to it (a second effect, or an effect without
its SUCCESS, is a defect whatever the faults).

:func:`check` returns every violation of these invariants:

``lost_tick``
    a tick in the window with no finished run ('end'), no SKIPPED/overlap row
    of a ``concurrency: forbid`` job and no SKIPPED/paused row written while a
    pause of the job was in force, unless the database was unreachable for
    the whole of the tick's misfire window; a run-once job that never finished.
    A tick that ended FAIL because its owner stalled (stopped, or its own
    network held) while a peer was alive is lost too: the peer should have
    taken it over once the owner's lease lapsed. Only an ``sql:`` job's FAIL
    while the database itself went away or the connections were cut
    (``BROKEN``) is its failure (its transaction broke, its outcome unknown).
``orphan_start``
    a job that started ('start') with a parent that is not a replica: its
    replica died before it, and it ran as an orphan beside the takeover.
``lost_request``
    a detached request with no finished run: requests are never missed,
    paused or skipped (the jobs requested allow overlap).
``duplicate_sql``
    more than one effect for one tick or request of an ``sql:`` job.
``ran_while_paused``
    a claim (a first run, a retry or a takeover) of a tick of a paused job
    whose statement reached the server after the pause command returned and
    before the resume command began; or any claim of a tick after it was
    recorded SKIPPED/paused. Manual runs (requests) are never paused.
``crashed_fire``
    an exception escaping a fire, or any other unhandled exception in a
    replica: ``fire_crashed``, ``uncaught_exception``, asyncio's "exception
    was never retrieved" / "Exception in callback", a logged traceback, or a
    bare traceback on a replica's stderr.
``duplicate_current`` / ``duplicate_fenced``
    more than one effect ('end') for one tick. The effect of the tick's
    recorded owner is the one that counts; every other one is a duplicate by
    an owner that was still current when it wrote (its outcome was lost or
    never recorded, and the tick ran again), or by a fenced owner (a newer
    claim, with a larger fencing token, had been made before it wrote; closing
    a dead owner's row SKIPPED/overlap fences it too).
``duplicate_lapsed`` / ``outcome_lapsed``
    the inherent lease limit of a network fault, told apart from the defects
    above: the owner wrote its effect while current, but its lease then lapsed
    at the database (no heartbeat or outcome got through: the statements were
    held by a partition) and the next claim came only after that expiry — or
    it wrote after its lease had lapsed, before the next claim (a frozen
    replica's child, which nothing stopped at the lease's end). The
    outcome was lost in flight and the tick ran again under the same
    idempotency key: what the key exists for. Without history these count as
    the defects.
``duplicate_released`` / ``outcome_released``
    an effect by an owner still current when it wrote, which its replica then
    stopped before the job ended and gave back (FAIL/released, after the
    effect: the replica's shutdown stops what outlives ``shutdown_grace`` and
    hands it to a survivor, docs/deployment.md): the job's process wrote its
    effect and was stopped before it exited, which no scheduler can tell from
    one stopped before its effect. The tick ran again under the same
    idempotency key. Inherent, reported; needs the history.
``fenced_outcome``
    an outcome (SUCCESS/FAIL) recorded for an attempt that was not the
    current one: a newer claim of the tick exists, the history shows a
    fencing token going back, or SUCCESS is recorded for an attempt that
    never ended.
``lost_outcome``
    a finished run ('end') by an owner still current when it wrote, whose
    tick's lease row is not SUCCESS by that attempt (same fencing token).
``stuck_running``
    a lease row of a tick in the window (or of a run-once job) still RUNNING
    after the cluster settled.
``once_rerun``
    a run-once job with more than one effect.
``forbid_overlap``
    two runs of different ticks of a ``concurrency: forbid`` job active at
    the same time. A run is active from its 'start' to its last ledger row
    (or to the kill of its process), minus the time its process was stopped;
    a run that only woke from a stop to notice its cancellation is not active
    after the stop.
``forbid_overlap_fenced``
    a ``forbid_overlap`` that begins when one of the two runs' process woke
    from a stop (SIGSTOP) with its tick already claimed again or closed as an
    overlap (its token fenced): the stopped owner could not stop its job in
    time, and went on for a moment after waking before it noticed. The
    lease's inherent limit, like ``duplicate_fenced``: reported, not a defect.
``above_bound``
    more runs of different ticks of a job with a bound on its running ticks
    (``concurrency: replace``: 1; ``max_concurrent: N``: N) active at one
    moment than the bound, measured as ``forbid_overlap`` measures two.
``above_bound_fenced`` / ``above_bound_abandoned``
    an ``above_bound`` that begins as ``forbid_overlap_fenced`` or
    ``forbid_overlap_abandoned`` does: the same inherent limits, reported.
``forbid_overlap_abandoned``
    a ``forbid_overlap`` that begins after the replica of one of the two runs
    abandoned that run's thread (``entrypoint_thread_abandoned``: a sync
    entrypoint still running at the end of its stop grace, here blocked in
    its own database write through an outage): Python cannot kill a thread,
    and what it does next is unsupervised (docs/jobs.md; ``isolate: true``
    makes such a job killable). Reported, not a defect.
``started_late`` / ``started_early``
    a tick's first claim later than ``misfire_grace`` after its tick (plus
    ``start_slack``), or any run earlier than the tick itself (a claim more
    than ``CLAIM_AHEAD_MAX`` before it: claims are won that early, runs held
    until the tick). The grace
    bounds the first claim (the daemon judges it in the claim, by the database
    clock): retries and takeovers of a started tick follow it to its end, and
    a first attempt may be stopped before its 'start' row lands (a command's
    child still starting up), so a later attempt's 'start' does not date the
    tick's start. The history dates claims; without it, the earliest 'start'
    (written just after its claim: hence the slack), and for an ``sql:`` job
    (no 'start' row) its first attempt's effect.

Every violation is attributed to the faults it may be due to: those of its
replicas (or cluster-wide ones) active during its span, extended by
``horizon``; one attributed to none is counted under ``none``.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import re
from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

from pgcrond.tickplan import CLAIM_AHEAD_MAX

KINDS = (
    "lost_tick",
    "lost_request",
    "duplicate_current",
    "duplicate_sql",
    "duplicate_lapsed",
    "duplicate_fenced",
    "duplicate_released",
    "fenced_outcome",
    "lost_outcome",
    "outcome_lapsed",
    "outcome_released",
    "stuck_running",
    "once_rerun",
    "forbid_overlap",
    "forbid_overlap_fenced",
    "forbid_overlap_abandoned",
    "above_bound",
    "above_bound_fenced",
    "above_bound_abandoned",
    "started_late",
    "started_early",
    "ran_while_paused",
    "crashed_fire",
    "orphan_start",
)
# The lease's inherent limit, reported but not a defect: an effect written by
# an owner that was fenced before it wrote, or whose lease lapsed at the
# database before its outcome landed (the tick then runs again, same key).
# So is an overlap of a forbid job's run whose thread its replica had
# abandoned after the stop grace (docs/jobs.md: a thread cannot be killed),
# and an effect whose run its owner stopped and gave back at its shutdown.
INHERENT = frozenset(
    {
        "duplicate_fenced",
        "duplicate_lapsed",
        "duplicate_released",
        "outcome_lapsed",
        "outcome_released",
        "forbid_overlap_fenced",
        "forbid_overlap_abandoned",
        "above_bound_fenced",
        "above_bound_abandoned",
    }
)
# Faults during which the daemon cannot reach its database.
UNREACHABLE = frozenset({"pg_restart", "partition", "blackhole"})
# Faults that break a transaction in flight: an sql: job's attempt fails then,
# or in the moments after, while the pools connect again (BROKEN_AFTER).
BROKEN = UNREACHABLE | {"cut"}
BROKEN_AFTER = timedelta(seconds=3)
# Faults that stop a replica's process (SIGSTOP).
STOPS = frozenset({"pause", "sql_pause"})
INITIAL = "INITIAL"
TERMINAL = ("end", "fail", "cancelled")
ALL_JOBS = "*"
# Log events that are an exception escaping a fire or a task (pgcrond's own,
# and what asyncio says of a task or callback whose exception nobody handled).
CRASH_EVENTS = frozenset({"fire_crashed", "uncaught_exception"})
CRASH_TEXTS = ("exception was never retrieved", "Exception in callback", "Unhandled error")
TRACEBACK = "Traceback (most recent call last)"
_TICK_KEY = re.compile(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ")


@dataclass(frozen=True)
class JobSpec:
    code: str
    # Ticks at every multiple of this many seconds (a "*/N * * * * *" cron);
    # None for a run-once job.
    every_s: int | None
    misfire_grace: timedelta
    forbid: bool = False
    # An sql: job: its effect commits with its SUCCESS (no 'start' row).
    sql: bool = False
    # At most this many of its ticks run at once (concurrency: replace: 1,
    # max_concurrent: N); its ticks may be SKIPPED by that policy.
    bound: int | None = None

    @property
    def once(self) -> bool:
        return self.every_s is None


@dataclass(frozen=True)
class LedgerRow:
    job: str
    run_key: str  # "" for a run-once job
    attempt: int
    fencing_token: int | None
    pid: int
    phase: str
    at: datetime
    replica: str = ""


@dataclass(frozen=True)
class LeaseRow:
    code: str
    run_key: str | None  # None for INITIAL
    status: str
    attempt: int
    fencing_token: int
    owner: str
    reason: str | None = None
    type: str = "SCHEDULE"

    @property
    def pid(self) -> int | None:
        return owner_pid(self.owner)


@dataclass(frozen=True)
class LeaseVersion:
    """One row of the lease history: a version of a lease row and when it was written."""

    code: str
    run_key: str | None
    status: str
    fencing_token: int
    owner: str
    reason: str | None
    at: datetime
    op: str = "UPDATE"
    # The lease's expiry as this version left it (the database's clock).
    expires_at: datetime | None = None
    # When the statement that wrote it reached the server (statement_timestamp()):
    # what it read of the job-state table is as of then. None: use ``at``.
    stmt_at: datetime | None = None

    @property
    def sent_at(self) -> datetime:
        return self.stmt_at or self.at


@dataclass(frozen=True)
class Fault:
    kind: str
    start: datetime
    end: datetime
    # The processes it hit; empty: the whole cluster (network, server).
    pids: frozenset[int] = frozenset()
    replica: str = ""
    detail: str = ""


@dataclass(frozen=True)
class Window:
    """Ticks from ``start`` to ``end`` (inclusive) are checked."""

    start: datetime
    end: datetime


@dataclass(frozen=True)
class Request:
    """A detached request (``pgcrond trigger --detach``), recorded by ``at``."""

    job: str
    run_key: str
    at: datetime


@dataclass(frozen=True)
class Pause:
    """One ``pgcrond pause CODE`` (``*``: every job) and its ``resume``, by the database clock.

    Ticks claimed between ``paused`` (the pause command returned: committed)
    and ``lifting`` (the resume command began) must be SKIPPED/paused; from
    ``begin`` to ``lifted`` a tick may be either.
    """

    code: str
    begin: datetime
    paused: datetime
    lifting: datetime
    lifted: datetime

    def holds(self, job: str) -> bool:
        return self.code in (job, ALL_JOBS)


@dataclass(frozen=True)
class Abandon:
    """A run whose thread its replica abandoned after the stop grace (from its log)."""

    pid: int
    at: datetime
    job: str
    run_key: str
    attempt: int


@dataclass(frozen=True)
class Crash:
    """An unhandled exception a replica's log shows."""

    replica: str
    pid: int
    at: datetime
    event: str
    job: str = ""
    run_key: str = ""
    detail: str = ""


@dataclass(frozen=True)
class Violation:
    kind: str
    job: str
    run_key: str
    detail: str
    start: datetime
    end: datetime
    pids: frozenset[int] = frozenset()
    causes: tuple[str, ...] = ()

    def as_dict(self) -> dict[str, Any]:
        return {
            "kind": self.kind,
            "job": self.job,
            "run_key": self.run_key,
            "detail": self.detail,
            "from": _iso(self.start),
            "to": _iso(self.end),
            "pids": sorted(self.pids),
            "faults": list(self.causes),
        }


@dataclass
class Report:
    violations: list[Violation]
    faults: list[Fault]
    ticks_checked: int = 0
    effects: int = 0
    counts: dict[str, dict[str, int]] = field(default_factory=dict)

    def total(self, kind: str | None = None) -> int:
        return sum(1 for v in self.violations if kind is None or v.kind == kind)

    def rows(self) -> list[dict[str, Any]]:
        """One row per fault kind (+ 'none' and 'total'): faults injected, violations per kind."""
        injected: dict[str, int] = defaultdict(int)
        for fault in self.faults:
            injected[fault.kind] += 1
        labels = [*sorted(injected), "none", "total"]
        table = []
        for label in labels:
            row: dict[str, Any] = {"fault": label, "injected": injected.get(label, 0)}
            for kind in KINDS:
                row[kind] = sum(
                    1
                    for v in self.violations
                    if v.kind == kind
                    and (
                        label == "total" or (label == "none" and not v.causes) or label in v.causes
                    )
                )
            if label == "total":
                row["injected"] = len(self.faults)
            table.append(row)
        return table

    def examples(self) -> dict[str, Violation]:
        """The first violation of each kind (by time)."""
        found: dict[str, Violation] = {}
        for violation in sorted(self.violations, key=lambda v: v.start):
            found.setdefault(violation.kind, violation)
        return found


def check(
    jobs: Sequence[JobSpec],
    ledger: Iterable[LedgerRow],
    leases: Iterable[LeaseRow],
    faults: Sequence[Fault],
    window: Window,
    history: Iterable[LeaseVersion] = (),
    *,
    requests: Sequence[Request] = (),
    pauses: Sequence[Pause] = (),
    crashes: Sequence[Crash] = (),
    abandons: Sequence[Abandon] = (),
    replicas: frozenset[int] | None = None,
    start_slack: timedelta = timedelta(milliseconds=500),
    horizon: timedelta = timedelta(seconds=3),
) -> Report:
    ledger = sorted(ledger, key=lambda r: r.at)
    history = sorted(history, key=lambda h: h.at)
    by_tick: dict[tuple[str, str], list[LedgerRow]] = defaultdict(list)
    for row in ledger:
        by_tick[row.job, row.run_key].append(row)
    lease_by_tick: dict[tuple[str, str], LeaseRow] = {}
    for row_ in leases:
        lease_by_tick[row_.code, row_.run_key or ""] = row_
    versions: dict[tuple[str, str], list[LeaseVersion]] = defaultdict(list)
    for version in history:
        versions[version.code, version.run_key or ""].append(version)
    claims = _claims(by_tick, versions)

    found: list[Violation] = []
    ticks_checked = 0
    for job in jobs:
        mine = [p for p in pauses if p.holds(job.code)]
        in_window = [""] if job.once else [_key(t) for t in _ticks(job.every_s, window)]
        # Also the ticks before the window's end that left rows behind (before the
        # window, or off the job's grid): all settled, so all checked but for losses.
        # Later ticks may still be running; they are not looked at.
        keys = in_window + sorted(
            {
                k
                for (code, k) in by_tick
                if code == job.code and _is_tick(k) and _parse(k) <= window.end
            }
            - set(in_window)
        )
        asked = {r.run_key: r for r in requests if r.job == job.code}
        # Manual run keys: the requests, and any other that left rows (checked
        # but for losses).
        manual = sorted(
            set(asked) | {k for (code, k) in by_tick if code == job.code and k and not _is_tick(k)}
        )
        for key in keys + manual:
            rows = by_tick.get((job.code, key), [])
            lease = lease_by_tick.get((job.code, key))
            tick_claims = claims.get((job.code, key), [])
            tick_versions = versions.get((job.code, key), [])
            if key in in_window:
                ticks_checked += 1
                found += _lost(job, key, rows, lease, faults, mine, tick_versions)
                since = _parse(key) if key else (rows[0].at if rows else window.start)
                found += _stuck(job, key, rows, lease, since)
            elif key in asked:
                ticks_checked += 1
                found += _lost_request(job, asked[key], rows, lease)
                found += _stuck(job, key, rows, lease, asked[key].at)
            found += _duplicates(job, key, rows, lease, tick_claims, tick_versions)
            found += _outcomes(job, key, rows, lease, tick_claims, tick_versions)
            if _is_tick(key):
                found += _timing(job, key, rows, tick_claims, start_slack)
                found += _paused_claims(job, key, rows, tick_versions, mine)
        if job.forbid:
            found += _overlaps(job, by_tick, faults, claims, abandons)
        if job.bound is not None:
            found += _above_bound(job, job.bound, by_tick, faults, claims, abandons)
    found += [_crashed(crash) for crash in crashes]
    if replicas is not None:
        found += _orphans(jobs, ledger, replicas)

    attributed = [_attribute(v, faults, horizon) for v in found]
    attributed.sort(key=lambda v: (v.start, v.kind, v.job, v.run_key))
    effects = sum(1 for row in ledger if row.phase == "end")
    return Report(attributed, list(faults), ticks_checked=ticks_checked, effects=effects)


# -- the invariants -----------------------------------------------------------


def _lost(
    job: JobSpec,
    key: str,
    rows: list[LedgerRow],
    lease: LeaseRow | None,
    faults: Sequence[Fault],
    pauses: Sequence[Pause] = (),
    versions: Sequence[LeaseVersion] = (),
) -> list[Violation]:
    if any(r.phase == "end" for r in rows):
        return []
    skipped = lease is not None and lease.status == "SKIPPED"
    paused = skipped and lease is not None and lease.reason == "paused"
    if skipped and not paused and (job.forbid or job.bound is not None):
        return []
    if paused and _skipped_while_paused(key, versions, pauses):
        return []
    if job.once:
        start = rows[0].at if rows else datetime.min.replace(tzinfo=UTC)
        end = rows[-1].at if rows else start
        return [
            _violation(
                "lost_tick", job, key, "the run-once job never finished", rows, lease, start, end
            )
        ]
    tick = _parse(key)
    window_end = tick + job.misfire_grace
    if _covered(tick, window_end, [f for f in faults if f.kind in UNREACHABLE]):
        return []
    if (
        job.sql
        and lease is not None
        and lease.status == "FAIL"
        and any(
            f.kind in BROKEN and f.start <= window_end and f.end + BROKEN_AFTER >= tick
            for f in faults
        )
    ):
        return []  # its transaction broke with the database: its failure, not a loss
    phases = ", ".join(f"{r.phase}#{r.attempt}(pid {r.pid})" for r in rows) or "no run at all"
    status = "no lease row" if lease is None else f"lease {lease.status}/{lease.reason}"
    if paused:
        status += ", with no pause of the job in force"
    return [
        _violation(
            "lost_tick",
            job,
            key,
            f"no finished run: {phases}; {status}",
            rows,
            lease,
            tick,
            window_end,
        )
    ]


def _skipped_while_paused(
    key: str, versions: Sequence[LeaseVersion], pauses: Sequence[Pause]
) -> bool:
    """Whether the tick's SKIPPED/paused row was written while a pause was in force."""
    written = next(
        (v.sent_at for v in versions if v.status == "SKIPPED" and v.reason == "paused"),
        None,
    )
    if written is None:  # no history: the tick itself stands for its claim
        written = _parse(key) if key else None
    return written is not None and any(p.begin <= written <= p.lifted for p in pauses)


def _lost_request(
    job: JobSpec, request: Request, rows: list[LedgerRow], lease: LeaseRow | None
) -> list[Violation]:
    if any(r.phase == "end" for r in rows):
        return []
    phases = ", ".join(f"{r.phase}#{r.attempt}(pid {r.pid})" for r in rows) or "no run at all"
    status = (
        "no lease row" if lease is None else f"lease {lease.status}/{lease.reason} ({lease.owner})"
    )
    end = max([request.at, *(r.at for r in rows)])
    return [
        _violation(
            "lost_request",
            job,
            request.run_key,
            f"requested at {_iso(request.at)}, no finished run: {phases}; {status}",
            rows,
            lease,
            request.at,
            end,
        )
    ]


def _stuck(
    job: JobSpec, key: str, rows: list[LedgerRow], lease: LeaseRow | None, start: datetime
) -> list[Violation]:
    if lease is None or lease.status != "RUNNING":
        return []
    # It should have been resolved within the tick's misfire window.
    end = max([start + job.misfire_grace, *(r.at for r in rows)])
    return [
        _violation(
            "stuck_running",
            job,
            key,
            f"lease row RUNNING after settling: attempt {lease.attempt}, token "
            f"{lease.fencing_token}, owner {lease.owner}",
            rows,
            lease,
            start,
            end,
        )
    ]


def _duplicates(
    job: JobSpec,
    key: str,
    rows: list[LedgerRow],
    lease: LeaseRow | None,
    claims: list[tuple[int, datetime]],
    versions: list[LeaseVersion] | None = None,
) -> list[Violation]:
    effects = [r for r in rows if r.phase == "end"]
    if len(effects) < 2:
        return []
    # The effect that counts: that of the recorded owner, else the newest claim's.
    recorded = lease.fencing_token if lease is not None else None
    keep = next((e for e in effects if e.fencing_token == recorded), None) or max(
        effects, key=lambda e: e.fencing_token or 0
    )
    found = []
    for effect in effects:
        if effect is keep:
            continue
        if job.once:
            kind = "once_rerun"
            detail = (
                f"run-once job's effect written again: attempt {effect.attempt} token "
                f"{effect.fencing_token} (pid {effect.pid}) besides attempt {keep.attempt} "
                f"token {keep.fencing_token} (pid {keep.pid})"
            )
        elif job.sql:
            # Committed with a SUCCESS under the row's lock: no owner, fenced or
            # lapsed, may commit a second one.
            kind = "duplicate_sql"
            detail = (
                f"sql: effect committed twice: attempt {effect.attempt} token "
                f"{effect.fencing_token} (pid {effect.pid}) at {_iso(effect.at)} and attempt "
                f"{keep.attempt} token {keep.fencing_token} (pid {keep.pid}) at {_iso(keep.at)}"
            )
        else:
            newer = _newer_claim(effect, claims)
            if newer is None and _lapsed(effect, claims, versions):
                kind = "duplicate_lapsed"
                detail = (
                    f"effect at {_iso(effect.at)} by attempt {effect.attempt} token "
                    f"{effect.fencing_token} (pid {effect.pid}) while current; its lease lapsed "
                    "at the database before its outcome landed and the tick was claimed again: "
                    f"kept effect attempt {keep.attempt} token {keep.fencing_token}"
                )
            elif newer is None and _released(effect, versions):
                kind = "duplicate_released"
                detail = (
                    f"effect at {_iso(effect.at)} by attempt {effect.attempt} token "
                    f"{effect.fencing_token} (pid {effect.pid}) while current; its replica then "
                    "stopped the run and gave the tick back (released), and it ran again: "
                    f"kept effect attempt {keep.attempt} token {keep.fencing_token}"
                )
            elif newer is None:
                kind = "duplicate_current"
                detail = (
                    f"effects by attempt {effect.attempt} token {effect.fencing_token} "
                    f"(pid {effect.pid}, current when it wrote at {_iso(effect.at)}) and attempt "
                    f"{keep.attempt} token {keep.fencing_token} (pid {keep.pid})"
                )
            else:
                kind = "duplicate_fenced"
                detail = (
                    f"effect at {_iso(effect.at)} by fenced attempt {effect.attempt} token "
                    f"{effect.fencing_token} (pid {effect.pid}): token {newer[0]} was claimed "
                    f"at {_iso(newer[1])}, before it; kept effect: attempt {keep.attempt} token "
                    f"{keep.fencing_token} (pid {keep.pid})"
                )
        span = sorted([effect.at, keep.at])
        found.append(_violation(kind, job, key, detail, [effect, keep], None, span[0], span[1]))
    return found


def _outcomes(
    job: JobSpec,
    key: str,
    rows: list[LedgerRow],
    lease: LeaseRow | None,
    claims: list[tuple[int, datetime]],
    versions: list[LeaseVersion] | None,
) -> list[Violation]:
    found = []
    start = rows[0].at if rows else None
    end = rows[-1].at if rows else None
    # Every effect must be the recorded outcome, unless its owner was fenced
    # before it wrote: then recording nothing is right (duplicate_fenced). An
    # sql: job's effect commits with its outcome: never fenced, never lapsed.
    for effect in (r for r in rows if r.phase == "end"):
        if (
            lease is not None
            and lease.status == "SUCCESS"
            and (lease.fencing_token == effect.fencing_token)
        ) or (not job.sql and _newer_claim(effect, claims) is not None):
            continue
        recorded = (
            "no lease row"
            if lease is None
            else f"lease {lease.status}/{lease.reason} by attempt {lease.attempt} token "
            f"{lease.fencing_token} ({lease.owner})"
        )
        kind = "lost_outcome"
        if not job.sql and _lapsed(effect, claims, versions):
            kind = "outcome_lapsed"
        elif not job.sql and _released(effect, versions):
            kind = "outcome_released"
        found.append(
            _violation(
                kind,
                job,
                key,
                f"attempt {effect.attempt} token {effect.fencing_token} (pid {effect.pid}) "
                f"ended at {_iso(effect.at)}, but {recorded}",
                [effect],
                lease,
                effect.at,
                effect.at,
            )
        )
    if lease is None or lease.status not in ("SUCCESS", "FAIL"):
        return found
    newer = [(token, at) for token, at in claims if token > lease.fencing_token]
    if newer:
        token, at = newer[0]
        found.append(
            _violation(
                "fenced_outcome",
                job,
                key,
                f"{lease.status} recorded by attempt {lease.attempt} token "
                f"{lease.fencing_token} ({lease.owner}), but token {token} claimed the tick at "
                f"{_iso(at)}",
                rows,
                lease,
                start or at,
                end or at,
            )
        )
    elif lease.status == "SUCCESS" and not any(
        r.phase == "end" and r.fencing_token == lease.fencing_token for r in rows
    ):
        found.append(
            _violation(
                "fenced_outcome",
                job,
                key,
                f"SUCCESS recorded for attempt {lease.attempt} token {lease.fencing_token} "
                f"({lease.owner}), which never ended in the ledger",
                rows,
                lease,
                start or _parse_or_min(key),
                end or _parse_or_min(key),
            )
        )
    for before, after in itertools.pairwise(versions or []):
        if after.fencing_token < before.fencing_token:
            found.append(
                _violation(
                    "fenced_outcome",
                    job,
                    key,
                    f"lease row went back from token {before.fencing_token} ({before.owner}) to "
                    f"{after.fencing_token} ({after.owner}, {after.status}) at {_iso(after.at)}",
                    rows,
                    lease,
                    before.at,
                    after.at,
                )
            )
    return found


def _timing(
    job: JobSpec,
    key: str,
    rows: list[LedgerRow],
    claims: list[tuple[int, datetime]],
    start_slack: timedelta,
) -> list[Violation]:
    found = []
    tick = _parse(key)
    # Any attempt may start early: every 'start', and an sql: job's effects
    # and claims (it writes no 'start'). A claim may be won up to CLAIM_AHEAD_MAX
    # before its tick (its run is held until the tick), never earlier.
    early = [
        (r.at, f"attempt {r.attempt} token {r.fencing_token} (pid {r.pid})", [r])
        for r in rows
        if r.phase == "start" or (job.sql and r.phase == "end")
    ]
    if job.sql:
        early += [
            (at + CLAIM_AHEAD_MAX, f"claim of token {token} (less CLAIM_AHEAD_MAX)", [])
            for token, at in claims
        ]
    # misfire_grace bounds a tick's first claim, by the database clock: its
    # retries and takeovers follow the tick to its end, whenever that is, and
    # its first attempt may be stopped before its 'start' lands (a command's
    # child still starting up when its replica is killed). Without any claim
    # known (an sql: job without history), the first attempt's effect dates it.
    first = min(claims, key=lambda claim: claim[1], default=None)
    late: list[tuple[datetime, str, list[LedgerRow]]] = (
        [(first[1], f"the first claim (token {first[0]})", [])] if first else []
    )
    if job.sql and not first:
        late = [
            (r.at, f"attempt 1 token {r.fencing_token} (pid {r.pid}) effect", [r])
            for r in rows
            if r.phase == "end" and r.attempt == 1
        ]
        early += late
    for at, what, evidence in early:
        if at < tick:
            found.append(
                _violation(
                    "started_early",
                    job,
                    key,
                    f"{what} started {(tick - at).total_seconds():.3f}s before its tick",
                    evidence,
                    None,
                    at,
                    tick,
                )
            )
    for at, what, evidence in late:
        lateness = at - tick
        if lateness > job.misfire_grace + start_slack:
            found.append(
                _violation(
                    "started_late",
                    job,
                    key,
                    f"{what} came {lateness.total_seconds():.3f}s after its tick "
                    f"(misfire_grace {job.misfire_grace.total_seconds():g}s)",
                    evidence,
                    None,
                    tick,
                    at,
                )
            )
    return found


def _paused_claims(
    job: JobSpec,
    key: str,
    rows: list[LedgerRow],
    versions: Sequence[LeaseVersion],
    pauses: Sequence[Pause],
) -> list[Violation]:
    """Claims of a tick made while its job was paused, or after it was skipped as paused."""
    found = []
    skipped_at: datetime | None = None
    claimed: set[int] = set()
    for version in versions:
        if version.status == "SKIPPED" and version.reason == "paused":
            skipped_at = skipped_at or version.at
            continue
        # A token's first RUNNING version is its claim; the later ones are heartbeats.
        if version.status != "RUNNING" or version.fencing_token in claimed:
            continue
        claimed.add(version.fencing_token)
        sent = version.sent_at
        during = next((p for p in pauses if p.paused < sent < p.lifting), None)
        if during is not None:
            why = (
                f"while {during.code} was paused (from {_iso(during.paused)} "
                f"to {_iso(during.lifting)})"
            )
        elif skipped_at is not None:
            why = f"after the tick was recorded SKIPPED/paused at {_iso(skipped_at)}"
        else:
            continue
        pid = owner_pid(version.owner)
        found.append(
            Violation(
                "ran_while_paused",
                job.code,
                key,
                f"token {version.fencing_token} ({version.owner}) claimed at {_iso(sent)} {why}",
                sent,
                sent,
                frozenset({pid} if pid is not None else set())
                | {r.pid for r in rows if r.fencing_token == version.fencing_token},
            )
        )
    return found


def _crashed(crash: Crash) -> Violation:
    return Violation(
        "crashed_fire",
        crash.job,
        crash.run_key,
        f"{crash.event} on {crash.replica} (pid {crash.pid}): {crash.detail}",
        crash.at,
        crash.at,
        frozenset({crash.pid}),
    )


def abandons_in_log(text: str, pid: int) -> list[Abandon]:
    """The runs whose thread one replica's log says it abandoned after the stop grace."""
    found = []
    for line in text.splitlines():
        if '"entrypoint_thread_abandoned"' not in line:
            continue
        event = _json_event(line)
        if event is None or event.get("event") != "entrypoint_thread_abandoned":
            continue
        with contextlib.suppress(KeyError, TypeError, ValueError):
            found.append(
                Abandon(
                    pid,
                    datetime.fromisoformat(event["timestamp"]),
                    str(event["job"]),
                    str(event["run_key"]),
                    int(event["attempt"]),
                )
            )
    return found


def crashes_in_log(text: str, replica: str, pid: int) -> list[Crash]:
    """The unhandled exceptions in one replica's log (JSON lines, and bare stderr lines).

    A job's own failure is never one: pgcrond records it as the run's outcome
    without a traceback. A bare line is dated by the last JSON line before it.
    """
    found = []
    lines = text.splitlines()
    last_at = datetime.min.replace(tzinfo=UTC)
    for n, line in enumerate(lines):
        event = _json_event(line)
        if event is None:
            if TRACEBACK in line:
                found.append(Crash(replica, pid, last_at, "traceback", detail=_raised(lines, n)))
            continue
        stamp = event.get("timestamp")
        if isinstance(stamp, str):
            with contextlib.suppress(ValueError):
                last_at = datetime.fromisoformat(stamp)
        name = str(event.get("event", ""))
        trace = event.get("exception")
        if not (name in CRASH_EVENTS or trace or any(text_ in name for text_ in CRASH_TEXTS)):
            continue
        raised = str(trace).strip().splitlines()[-1] if trace else ""
        found.append(
            Crash(
                replica,
                pid,
                last_at,
                name.splitlines()[0][:200] if name else "exception",
                str(event.get("job") or ""),
                str(event.get("run_key") or ""),
                raised or str(event.get("error") or ""),
            )
        )
    return found


def _json_event(line: str) -> dict[str, Any] | None:
    if not line.startswith("{"):
        return None
    try:
        event = json.loads(line)
    except json.JSONDecodeError:
        return None
    return event if isinstance(event, dict) else None


def _raised(lines: list[str], at: int) -> str:
    """A bare traceback's last line: the exception raised."""
    for line in lines[at + 1 :]:
        if line and not line[0].isspace() and not line.startswith(TRACEBACK):
            return line.strip()
    return lines[at].strip()


@dataclass(frozen=True)
class _Run:
    key: str
    token: int | None
    pid: int
    segments: tuple[tuple[datetime, datetime], ...]
    rows: tuple[LedgerRow, ...]
    # When its process woke from each stop (SIGCONT), while the run went on.
    wakes: tuple[datetime, ...] = ()


def _runs(
    job: JobSpec, by_tick: dict[tuple[str, str], list[LedgerRow]], faults: Sequence[Fault]
) -> list[_Run]:
    """The job's runs (one per attempt and process), with the time each was active."""
    runs: list[_Run] = []
    for (code, key), rows in by_tick.items():
        if code != job.code:
            continue
        attempts: dict[tuple[int | None, int], list[LedgerRow]] = defaultdict(list)
        for row in rows:
            attempts[row.fencing_token, row.pid].append(row)
        for (token, pid), mine in attempts.items():
            run = _active(key, token, pid, mine, faults)
            if run is not None:
                runs.append(run)
    return sorted(runs, key=lambda r: r.segments[0])


def _inherent(
    job: JobSpec,
    runs: Sequence[_Run],
    begin: datetime,
    claims: dict[tuple[str, str], list[tuple[int, datetime]]] | None,
    abandons: Sequence[Abandon],
) -> str | None:
    """Why runs that overlap from ``begin`` are the lease's inherent limit, or None.

    "fenced": a stopped owner that woke fenced (its tick claimed again, or
    closed as an overlap, while it was stopped) and went on for a moment
    before it noticed, as for a duplicate effect; "abandoned": a thread its
    replica abandoned after the stop grace.
    """
    if any(_woke_fenced(run, begin, (claims or {}).get((job.code, run.key), [])) for run in runs):
        return "fenced"
    abandoned = any(
        a.job == job.code
        and a.pid == run.pid
        and a.run_key == run.key
        and a.at <= begin
        and any(r.attempt == a.attempt for r in run.rows)
        for a in abandons
        for run in runs
    )
    return "abandoned" if abandoned else None


def _overlaps(
    job: JobSpec,
    by_tick: dict[tuple[str, str], list[LedgerRow]],
    faults: Sequence[Fault],
    claims: dict[tuple[str, str], list[tuple[int, datetime]]] | None = None,
    abandons: Sequence[Abandon] = (),
) -> list[Violation]:
    found = []
    for first, second in itertools.combinations(_runs(job, by_tick, faults), 2):
        if first.key == second.key:
            continue
        overlap = _intersection(first.segments, second.segments)
        if overlap is None:
            continue
        why = _inherent(job, (first, second), overlap[0], claims, abandons)
        kind = "forbid_overlap" if why is None else f"forbid_overlap_{why}"
        found.append(
            _violation(
                kind,
                job,
                first.key,
                f"tick {first.key} token {first.token} (pid {first.pid}, "
                f"{'/'.join(r.phase for r in first.rows)}) and tick {second.key} token "
                f"{second.token} (pid {second.pid}, {'/'.join(r.phase for r in second.rows)}) "
                f"both active from {_iso(overlap[0])} to {_iso(overlap[1])}",
                [*first.rows, *second.rows],
                None,
                overlap[0],
                overlap[1],
            )
        )
    return found


def _orphans(
    jobs: Sequence[JobSpec], ledger: Sequence[LedgerRow], replicas: frozenset[int]
) -> list[Violation]:
    """Runs that started under a parent that is no replica (a 'start' row's pid is its
    replica's: the in-process job's own, a command's parent)."""
    specs = {job.code: job for job in jobs}
    found = []
    for row in ledger:
        job = specs.get(row.job)
        if job is None or job.sql or row.phase != "start" or row.pid in replicas:
            continue
        found.append(
            Violation(
                "orphan_start",
                job.code,
                row.run_key,
                f"attempt {row.attempt} started with parent pid {row.pid}, not a replica: "
                "its replica had died",
                row.at,
                row.at,
            )
        )
    return found


def _above_bound(
    job: JobSpec,
    bound: int,
    by_tick: dict[tuple[str, str], list[LedgerRow]],
    faults: Sequence[Fault],
    claims: dict[tuple[str, str], list[tuple[int, datetime]]] | None = None,
    abandons: Sequence[Abandon] = (),
) -> list[Violation]:
    """Moments when more than ``bound`` runs of different ticks were active, once per set."""
    runs = _runs(job, by_tick, faults)
    found = []
    reported: set[frozenset[tuple[str, int | None, int]]] = set()
    for at in sorted({start for run in runs for start, _ in run.segments}):
        active = [run for run in runs if any(s <= at < e for s, e in run.segments)]
        if len({run.key for run in active}) <= bound:
            continue
        names = frozenset((run.key, run.token, run.pid) for run in active)
        if names in reported:
            continue
        reported.add(names)
        until = min(e for run in active for s, e in run.segments if s <= at < e)
        why = _inherent(job, active, at, claims, abandons)
        found.append(
            _violation(
                "above_bound" if why is None else f"above_bound_{why}",
                job,
                active[0].key,
                f"{len(active)} runs active at once from {_iso(at)} (bound {bound}): "
                + ", ".join(
                    f"tick {run.key} token {run.token} (pid {run.pid}, "
                    f"{'/'.join(r.phase for r in run.rows)})"
                    for run in active
                ),
                [row for run in active for row in run.rows],
                None,
                at,
                until,
            )
        )
    return found


def _active(
    key: str, token: int | None, pid: int, rows: list[LedgerRow], faults: Sequence[Fault]
) -> _Run | None:
    starts = [r for r in rows if r.phase == "start"]
    if not starts:
        return None
    begin = starts[0].at
    last = rows[-1]
    if last.phase in TERMINAL:
        finish = last.at
    else:
        kills = [f.start for f in faults if f.kind == "kill" and pid in f.pids and f.start >= begin]
        finish = min(kills) if kills else last.at
    stops = sorted(
        (max(f.start, begin), min(f.end, finish))
        for f in faults
        if f.kind in STOPS and pid in f.pids and f.start < finish and f.end > begin
    )
    segments: list[tuple[datetime, datetime]] = []
    cursor = begin
    for stop_start, stop_end in stops:
        if stop_start > cursor:
            segments.append((cursor, stop_start))
        cursor = max(cursor, stop_end)
    woke_to_stop = bool(stops) and last.phase == "cancelled"
    if cursor < finish and not woke_to_stop:
        segments.append((cursor, finish))
    if not segments:
        segments.append((begin, begin))
    wakes = tuple(stop_end for _, stop_end in stops if stop_end < finish)
    return _Run(key, token, pid, tuple(segments), tuple(rows), wakes)


def _woke_fenced(run: _Run, begin: datetime, claims: Sequence[tuple[int, datetime]]) -> bool:
    """Whether ``run`` overlaps from its wake after a stop, fenced before it woke."""
    return begin in run.wakes and any(
        run.token is not None and token > run.token and at < begin for token, at in claims
    )


def _intersection(
    a: Sequence[tuple[datetime, datetime]], b: Sequence[tuple[datetime, datetime]]
) -> tuple[datetime, datetime] | None:
    for (a0, a1), (b0, b1) in itertools.product(a, b):
        low, high = max(a0, b0), min(a1, b1)
        if low < high:
            return low, high
    return None


# -- helpers --------------------------------------------------------------------


def _claims(
    by_tick: dict[tuple[str, str], list[LedgerRow]],
    versions: dict[tuple[str, str], list[LeaseVersion]],
) -> dict[tuple[str, str], list[tuple[int, datetime]]]:
    """Per tick: (fencing token, when claimed), earliest known instant, by token.

    The history dates a claim exactly; a ledger 'start' is a later bound (the
    job starts after its claim), used when there is no history.
    """
    result: dict[tuple[str, str], list[tuple[int, datetime]]] = {}
    for tick in set(by_tick) | set(versions):
        earliest: dict[int, datetime] = {}
        for version in versions.get(tick, []):
            # A claim, or the closing of a dead owner's row as an overlap or
            # as replaced: both rotate the owner token and fence it. A tick
            # written waiting (buffer_one, replace) is claimed then, first.
            closed = version.status == "SKIPPED" and version.reason in ("overlap", "replaced")
            waiting = version.status == "FAIL" and version.reason == "waiting"
            if version.status == "RUNNING" or waiting or (closed and version.op == "UPDATE"):
                at = earliest.get(version.fencing_token)
                earliest[version.fencing_token] = version.at if at is None else min(at, version.at)
        for row in by_tick.get(tick, []):
            if row.phase == "start" and row.fencing_token is not None:
                at = earliest.get(row.fencing_token)
                earliest[row.fencing_token] = row.at if at is None else min(at, row.at)
        result[tick] = sorted(earliest.items())
    return result


def _lapsed(
    effect: LedgerRow,
    claims: list[tuple[int, datetime]],
    versions: list[LeaseVersion] | None,
) -> bool:
    """Whether ``effect``'s owner lost its lease by expiry, before anyone claimed again.

    Its last version's expiry (the database's clock) came before the next
    claim of the tick: nothing of the owner's got through in time (a
    partition held its heartbeats and its outcome), so the next claim was a
    legitimate takeover. The effect may come before that expiry or after it,
    as long as no newer claim came before it (the callers see to that): a
    command's child outlives a lease its frozen replica (SIGSTOP) could not
    stop it at, and writes after the lease lapsed — an owner no longer current,
    fenced by nothing yet (fresh-clone CI run 111: 35 ms after the expiry, 109
    ms before the takeover).
    """
    token = effect.fencing_token
    if token is None or not versions:
        return False
    expiries = [v.expires_at for v in versions if v.fencing_token == token and v.expires_at]
    if not expiries:
        return False
    expiry = max(expiries)
    later = [at for t, at in claims if t > token]
    return not later or min(later) >= expiry


def _released(effect: LedgerRow, versions: list[LeaseVersion] | None) -> bool:
    """Whether ``effect``'s own claim was given back (FAIL/released) after it was written.

    A release after an effect is a run its replica stopped before the job
    ended (a claim answered too late, or given back, ran nothing).
    """
    token = effect.fencing_token
    return token is not None and any(
        v.fencing_token == token
        and v.status == "FAIL"
        and v.reason == "released"
        and v.at >= effect.at
        for v in versions or ()
    )


def _newer_claim(
    effect: LedgerRow, claims: list[tuple[int, datetime]]
) -> tuple[int, datetime] | None:
    token = effect.fencing_token or 0
    return next(((t, at) for t, at in claims if t > token and at <= effect.at), None)


def _covered(start: datetime, end: datetime, faults: Sequence[Fault]) -> bool:
    """Whether the union of the faults' intervals covers [start, end]."""
    cursor = start
    for fault in sorted(faults, key=lambda f: f.start):
        if fault.start > cursor:
            break
        cursor = max(cursor, fault.end)
        if cursor >= end:
            return True
    return cursor >= end


def _attribute(violation: Violation, faults: Sequence[Fault], horizon: timedelta) -> Violation:
    causes = []
    for fault in faults:
        if fault.start > violation.end or fault.end + horizon < violation.start:
            continue
        if fault.pids and not fault.pids & violation.pids:
            continue
        if fault.kind not in causes:
            causes.append(fault.kind)
    return Violation(
        violation.kind,
        violation.job,
        violation.run_key,
        violation.detail,
        violation.start,
        violation.end,
        violation.pids,
        tuple(causes),
    )


def _violation(
    kind: str,
    job: JobSpec,
    key: str,
    detail: str,
    rows: Sequence[LedgerRow],
    lease: LeaseRow | None,
    start: datetime,
    end: datetime,
) -> Violation:
    pids = {r.pid for r in rows}
    if lease is not None and lease.pid is not None:
        pids.add(lease.pid)
    return Violation(kind, job.code, key or INITIAL, detail, start, end, frozenset(pids))


def _ticks(every_s: int | None, window: Window) -> list[datetime]:
    if every_s is None:
        return []
    epoch = int(window.start.timestamp())
    first = epoch + (-epoch) % every_s
    if first < window.start.timestamp():
        first += every_s
    ticks = []
    moment = first
    while moment <= window.end.timestamp():
        ticks.append(datetime.fromtimestamp(moment, UTC))
        moment += every_s
    return ticks


def _is_tick(key: str) -> bool:
    """Whether ``key`` is a tick's run key (not a manual one, not a run-once job's)."""
    return _TICK_KEY.fullmatch(key) is not None


def _key(moment: datetime) -> str:
    return moment.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _parse(key: str) -> datetime:
    return datetime.strptime(key, "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=UTC)


def _parse_or_min(key: str) -> datetime:
    return _parse(key) if key else datetime.min.replace(tzinfo=UTC)


def owner_pid(owner: str) -> int | None:
    """The pid of an owner name ``host:pid`` or ``host:pid-suffix`` (core/replica.py)."""
    pid = owner.rpartition(":")[2].partition("-")[0]
    return int(pid) if pid.isdigit() else None


def _iso(moment: datetime) -> str:
    return moment.astimezone(UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def table_text(report: Report) -> str:
    """The per-fault table as aligned text."""
    rows = report.rows()
    headers = ["fault", "injected", *KINDS]
    widths = [max(len(h), *(len(str(r[h])) for r in rows)) for h in headers]
    lines = ["  ".join(h.ljust(w) for h, w in zip(headers, widths, strict=True))]
    for row in rows:
        lines.append("  ".join(str(row[h]).ljust(w) for h, w in zip(headers, widths, strict=True)))
    return "\n".join(lines)
