"""Prometheus metrics of one replica: what fired, who won, what ran and how it ended.

Names follow the glossary: a *fire* is a replica's timer going off for a tick;
a *win*/*loss* is the outcome of its claim; a *skip* is a fire not run on
purpose; a *misfire* started later than ``misfire_grace`` after its tick.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from datetime import datetime, timedelta
from typing import get_args

from prometheus_client import (
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    Info,
    PlatformCollector,
    ProcessCollector,
    disable_created_metrics,
)
from prometheus_client.exposition import choose_encoder

from pgcrond import __version__
from pgcrond.config.models import JobConfig
from pgcrond.core.keys import Identity
from pgcrond.core.outcome import Outcome
from pgcrond.daemon.alerts import JobAlerts
from pgcrond.daemon.job_series import (
    JobFamily,
    Kind,
    Rendered,
    Series,
    escape_label,
    gauge_text,
)
from pgcrond.events import FireEvents
from pgcrond.guard.base import Held
from pgcrond.guard.base import Outcome as Verdict

# Every counter and histogram would also export a `_created` series with its
# creation time: twice the series for a value nobody alerts on. The switch is
# process-wide in prometheus_client; pgcrond has no other registry.
disable_created_metrics()  # type: ignore[no-untyped-call]

# Runs are counted by the runner's outcomes; each is present (at 0) from the
# start, so `increase(pgcrond_runs_total{outcome="fail"}[1h])` is 0, not absent.
RUN_OUTCOMES: tuple[str, ...] = get_args(Outcome)
# Why this replica gave a tick up: "late" is a misfire in the glossary's sense;
# an unreachable database is not.
MISSED_CAUSES = ("late", "database_unavailable")
# Why a MISSED row was written (storage.ticks.MISSED_REASONS, the CHECK of migration 2).
MISSED_REASONS = ("no_replica", "database_unavailable", "late")

# Lateness of a healthy replica is milliseconds; the tail (late fires within
# grace, takeovers) matters up to the default misfire grace (5 min).
LATENESS_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300)
DURATION_BUCKETS = (0.01, 0.05, 0.1, 0.5, 1, 5, 10, 30, 60, 300, 900, 3600, 14400)


class Registry(CollectorRegistry):
    """prometheus_client's registry, plus the per-job families that render themselves."""

    def __init__(self) -> None:
        super().__init__()
        self.job_families: list[Rendered] = []


def exposition(registry: CollectorRegistry, accept: str) -> tuple[Callable[[], bytes], str]:
    """How to render ``registry`` for a scraper that sent ``accept``, and the content type.

    prometheus_client's own negotiation: OpenMetrics when the scraper asks
    for it (Prometheus does by default), else the classic text format; the
    per-job families of a :class:`Registry` are appended (before OpenMetrics's
    ``# EOF``).
    """
    encoder, content_type = choose_encoder(accept)
    openmetrics = content_type.startswith("application/openmetrics-text")
    families = list(getattr(registry, "job_families", ()))

    def render() -> bytes:
        body = encoder(registry)
        if not families:
            return body
        own = "".join(family.render(openmetrics) for family in families).encode()
        if openmetrics:
            return body.removesuffix(_EOF) + own + _EOF
        return body + own

    return render, content_type


_EOF = b"# EOF\n"


class Metrics:
    """All metrics on one registry (a fresh one per daemon, so tests can run several)."""

    def __init__(self) -> None:
        self.registry = Registry()
        r = self.registry
        # process_* (CPU, memory, open fds, start time; read from /proc, so
        # Linux only: elsewhere the collector yields nothing) and python_info.
        ProcessCollector(registry=r)
        PlatformCollector(registry=r)
        self.build = Info("pgcrond_build", "The running pgcrond release.", registry=r)
        self.build.info({"version": __version__})
        self.fires = self._job_family(
            "pgcrond_fires",
            "Fires of a tick on this replica.",
            "counter",
            ["cronjob"],
        )
        self.wins = self._job_family(
            "pgcrond_wins",
            "Fires whose claim won.",
            "counter",
            ["cronjob"],
        )
        # Replica-wide: with N replicas every tick is lost N-1 times, and a
        # series per job and reason would be most of the page at 10,000 jobs.
        self.losses = Counter(
            "pgcrond_losses", "Fires whose claim lost, by reason.", ["reason"], registry=r
        )
        self.skips = self._job_family(
            "pgcrond_skips",
            "Fires not run on purpose, by reason.",
            "counter",
            ["cronjob", "reason"],
        )
        self.misfires = self._job_family(
            "pgcrond_misfires",
            "Ticks not run because their fire came later than misfire_grace.",
            "counter",
            ["cronjob"],
        )
        self.missed = self._job_family(
            "pgcrond_missed",
            "Ticks this replica gave up on within their window, by cause: late (a "
            "misfire) or database_unavailable.",
            "counter",
            ["cronjob", "cause"],
        )
        self.missed_recorded = self._job_family(
            "pgcrond_missed_recorded",
            "MISSED rows this replica wrote to the lease table, by reason: no_replica "
            "(found by the scan at start), database_unavailable, late.",
            "counter",
            ["cronjob", "reason"],
        )
        self.takeovers = self._job_family(
            "pgcrond_takeovers",
            "Ticks this replica reclaimed from an owner that stopped heartbeating.",
            "counter",
            ["cronjob"],
        )
        self.runs = self._job_family(
            "pgcrond_runs",
            "Finished runs, by outcome.",
            "counter",
            ["cronjob", "outcome"],
        )
        # The histograms are the replica's, not per job: ~17 series each per
        # job were most of a replica's memory and of a scrape at 10,000 jobs.
        # A job's own duration is pgcrond_job_last_run_duration_seconds.
        self.run_duration = Histogram(
            "pgcrond_run_duration_seconds",
            "Run duration, of every run on this replica.",
            buckets=DURATION_BUCKETS,
            registry=r,
        )
        self.last_duration = self._job_family(
            "pgcrond_job_last_run_duration_seconds",
            "How long the job's last run on this replica took (appears with its first run).",
            "gauge",
            ["cronjob"],
        )
        self.lateness = Histogram(
            "pgcrond_fire_lateness_seconds",
            "Start of the run minus the tick's intended fire time, of every run on this replica.",
            buckets=LATENESS_BUCKETS,
            registry=r,
        )
        self.running = Gauge(
            "pgcrond_running_jobs", "Runs in progress on this replica.", registry=r
        )
        self.heartbeat_failures = self._job_family(
            "pgcrond_heartbeat_failures",
            "Heartbeats that could not reach the database.",
            "counter",
            ["cronjob"],
        )
        self.database_errors = Counter(
            "pgcrond_database_errors",
            "Database operations that failed, by operation.",
            ["operation"],
            registry=r,
        )
        # Last success / failure, consecutive failures and staleness per job: the
        # cluster's truth from the lease table, seeded at start (daemon/alerts.py).
        # They replace the per-replica pgcrond_last_success_timestamp_seconds,
        # which reset with every restart.
        self.alerts = JobAlerts()
        r.job_families.append(self.alerts)

        self.next_fires = NextFires()
        r.job_families.append(self.next_fires)

        self.paused = self._job_family(
            "pgcrond_job_paused",
            "1 while the job is paused (pgcrond pause) or suspended (YAML), as this "
            "replica last learnt it: at start, and from each claim's answer.",
            "gauge",
            ["cronjob"],
        )
        self.loop_stall = Gauge(
            "pgcrond_loop_stall_seconds",
            "The longest stall of this replica's event loop seen while ticks fired, since "
            "start: every claim, heartbeat and run waits that long behind it.",
            registry=r,
        )
        # Reported, not acted on (daemon/overdue.py): a run past its
        # max_duration, a start past its start_deadline; and the pauses that
        # pause_after_failures made (daemon/failure_pause.py).
        self.runs_overdue = self._job_family(
            "pgcrond_runs_overdue",
            "Runs on this replica still running past the job's max_duration (each counted once).",
            "counter",
            ["cronjob"],
        )
        self.starts_overdue = self._job_family(
            "pgcrond_starts_overdue",
            "Runs on this replica that started later than the job's start_deadline after "
            "their tick.",
            "counter",
            ["cronjob"],
        )
        self.paused_after_failures = self._job_family(
            "pgcrond_paused_after_failures",
            "Pauses this replica made because the job failed pause_after_failures times in a row.",
            "counter",
            ["cronjob"],
        )
        self.events = FireMetrics(self)
        self.config_drift = Gauge(
            "pgcrond_config_drift",
            "Config hashes that live replicas run, beyond one: 0 while all agree. As this "
            "replica last read the registry: at start, on reload and once a minute.",
            registry=r,
        )

    def _job_family(
        self, name: str, documentation: str, kind: Kind, labelnames: list[str]
    ) -> JobFamily:
        family = JobFamily(name, documentation, kind, labelnames)
        self.registry.job_families.append(family)
        return family

    def set_jobs(
        self, codes: Iterable[str], alert_after: Mapping[str, timedelta | None] | None = None
    ) -> None:
        """Make the per-job series exist for exactly these jobs.

        Called with the config's job codes at start and after each reload:
        a job's series exist (at 0) before its first fire, so rates and
        absence alerts work from the first scrape, and a removed job's series
        go away instead of freezing at their last value. Series by a reason
        (losses, skips) appear with their first event: reasons are
        open-ended, and a zero for each would be noise; so do the histograms. ``alert_after``
        (code -> the job's, or None) gives the alert gauges their jobs.
        """
        kept = set(codes)
        wanted = sorted(kept)
        self.alerts.set_jobs({code: (alert_after or {}).get(code) for code in wanted})
        # What alerts and rates read is there at 0 from the start; rare events
        # (misfires, takeovers, heartbeat failures, skips) and the last run's
        # duration appear with their first.
        by_job = [self.fires, self.wins, self.paused]
        by_first_event = [
            self.misfires, self.takeovers, self.heartbeat_failures, self.last_duration,
            self.runs_overdue, self.starts_overdue, self.paused_after_failures,
        ]  # fmt: skip
        for metric in [
            *by_job, *by_first_event, self.runs, self.skips, self.missed, self.missed_recorded,
        ]:  # fmt: skip
            for labels in metric.label_sets():
                if labels[0] not in kept:  # a set: 10,000 jobs' series, each looked up
                    metric.remove(*labels)
        # Each code escaped once for its dozen series, in one mapping they share.
        escaped = {code: escape_label(code) for code in wanted}
        for metric in by_job:
            metric.present(escaped, ())
        self.runs.present(escaped, *((outcome,) for outcome in RUN_OUTCOMES))
        self.missed.present(escaped, *((cause,) for cause in MISSED_CAUSES))
        self.missed_recorded.present(escaped, *((reason,) for reason in MISSED_REASONS))
        self.events.forget(kept)


class _JobChildren:
    """One job's series that every run touches, looked up once per job, not per run."""

    __slots__ = ("fires", "last_duration", "runs", "wins")

    def __init__(self, metrics: Metrics, code: str) -> None:
        self.fires = metrics.fires.labels(code)
        self.wins = metrics.wins.labels(code)
        self.last_duration = metrics.last_duration.labels(code)
        self.runs: dict[str, Series] = {}


class FireMetrics(FireEvents):
    """The fire's events, counted: the subscriber that keeps the metrics above."""

    def __init__(self, metrics: Metrics) -> None:
        self._m = metrics
        self._jobs: dict[str, _JobChildren] = {}

    def forget(self, codes: Iterable[str]) -> None:
        """Drop the children of jobs not in ``codes`` (a reload removed their series)."""
        keep = set(codes)
        self._jobs = {code: c for code, c in self._jobs.items() if code in keep}

    def _of(self, code: str) -> _JobChildren:
        children = self._jobs.get(code)
        if children is None:
            children = self._jobs[code] = _JobChildren(self._m, code)
        return children

    def fired(self, job: JobConfig) -> None:
        self._of(job.code).fires.inc()

    def claim_won(self, job: JobConfig, held: Held) -> None:
        self._of(job.code).wins.inc()
        if held.claimed_from == "takeover":
            self._m.takeovers.labels(job.code).inc()

    def claim_lost(self, job: JobConfig, reason: str) -> None:
        self._m.losses.labels(reason).inc()

    def skipped(self, job: JobConfig, reason: str) -> None:
        self._m.skips.labels(job.code, reason).inc()

    def paused(self, job: JobConfig, paused: bool) -> None:
        self._m.paused.labels(job.code).set(1 if paused else 0)

    def missed(
        self, job: JobConfig, identity: Identity, tick: datetime, cause: str, recorded: bool
    ) -> None:
        self._m.missed.labels(job.code, cause).inc()
        if cause == "late":
            self._m.misfires.labels(job.code).inc()

    def run_started(self, job: JobConfig, lateness_s: float) -> None:
        self._m.lateness.observe(max(lateness_s, 0.0))
        self._m.running.inc()

    def run_finished(self, job: JobConfig, outcome: str, duration_s: float) -> None:
        self._m.running.dec()
        self._m.run_duration.observe(duration_s)
        children = self._of(job.code)
        children.last_duration.set(duration_s)
        counter = children.runs.get(outcome)
        if counter is None:
            counter = children.runs[outcome] = self._m.runs.labels(job.code, outcome)
        counter.inc()

    def recorded(self, job: JobConfig, kind: Verdict, final: bool) -> None:
        self._m.alerts.recorded(job.code, kind, final=final)

    def database(self, operation: str, ok: bool) -> None:
        if not ok:
            self._m.database_errors.labels(operation).inc()


# What the scheduler will fire next: (the codes that share one schedule, its
# next tick); a schedule with no tick left has none.
NextTicks = Callable[[], Iterable[tuple[Iterable[str], datetime | None]]]


class NextFires:
    """``pgcrond_next_fire_timestamp_seconds``: each job's next tick, read at scrape time.

    Asked of the scheduler when scraped, never stored: it is current as jobs
    fire and after a reload without anything updating it. The scheduler holds
    one entry per distinct schedule (``Scheduling.regroup``), so a scrape asks
    it for a handful of times and writes one sample per job: milliseconds at
    10,000 jobs, on the render's worker thread.
    """

    def __init__(self) -> None:
        self._source: NextTicks = lambda: ()

    def follow(self, source: NextTicks) -> None:
        """Read the next ticks from ``source`` (the running scheduler) from now on."""
        self._source = source

    def render(self, openmetrics: bool) -> str:
        samples: list[tuple[str, float]] = []
        for codes, tick in self._source():
            if tick is not None:
                at = tick.timestamp()
                samples += [(code, at) for code in codes]
        return gauge_text(
            "pgcrond_next_fire_timestamp_seconds",
            "Unix time of the job's next tick (its run key; jitter fires it up to jitter "
            "later). Run-once jobs have none.",
            samples,
        )
