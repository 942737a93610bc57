"""Prometheus metrics of one replica: what fired, who won, what ran and how it ended.

Names follow the glossary: a *fire* is a replica's timer going off for a tick;
a *win*/*loss* is the outcome of its claim; a *skip* is a fire not run on
purpose; a *misfire* started later than ``misfire_grace`` after its tick.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from datetime import timedelta
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

from pgcrond import __version__
from pgcrond.daemon.alerts import JobAlerts
from pgcrond.run.runner import Outcome

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


class Metrics:
    """All metrics on one registry (a fresh one per daemon, so tests can run several)."""

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry or CollectorRegistry()
        r = self.registry
        # process_* (CPU, memory, open fds, start time; read from /proc, so
        # Linux only: elsewhere the collector yields nothing) and python_info.
        ProcessCollector(registry=r)
        PlatformCollector(registry=r)
        self.build = Info("pgcrond_build", "The running pgcrond release.", registry=r)
        self.build.info({"version": __version__})
        self.fires = Counter(
            "pgcrond_fires", "Fires of a tick on this replica.", ["job"], registry=r
        )
        self.wins = Counter("pgcrond_wins", "Fires whose claim won.", ["job"], registry=r)
        self.losses = Counter(
            "pgcrond_losses", "Fires whose claim lost, by reason.", ["job", "reason"], registry=r
        )
        self.skips = Counter(
            "pgcrond_skips", "Fires not run on purpose, by reason.", ["job", "reason"], registry=r
        )
        self.misfires = Counter(
            "pgcrond_misfires",
            "Ticks not run because their fire came later than misfire_grace.",
            ["job"],
            registry=r,
        )
        self.missed = Counter(
            "pgcrond_missed",
            "Ticks this replica gave up on within their window, by cause: late (a "
            "misfire) or database_unavailable.",
            ["job", "cause"],
            registry=r,
        )
        self.missed_recorded = Counter(
            "pgcrond_missed_recorded",
            "MISSED rows this replica wrote to the lease table, by reason: no_replica "
            "(found by the scan at start), database_unavailable, late.",
            ["job", "reason"],
            registry=r,
        )
        self.takeovers = Counter(
            "pgcrond_takeovers",
            "Ticks this replica reclaimed from an owner that stopped heartbeating.",
            ["job"],
            registry=r,
        )
        self.runs = Counter(
            "pgcrond_runs", "Finished runs, by outcome.", ["job", "outcome"], registry=r
        )
        self.run_duration = Histogram(
            "pgcrond_run_duration_seconds",
            "Run duration.",
            ["job"],
            buckets=DURATION_BUCKETS,
            registry=r,
        )
        self.lateness = Histogram(
            "pgcrond_fire_lateness_seconds",
            "Start of the run minus the tick's intended fire time.",
            ["job"],
            buckets=LATENESS_BUCKETS,
            registry=r,
        )
        self.running = Gauge(
            "pgcrond_running_jobs", "Runs in progress on this replica.", ["job"], registry=r
        )
        self.heartbeat_failures = Counter(
            "pgcrond_heartbeat_failures",
            "Heartbeats that could not reach the database.",
            ["job"],
            registry=r,
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
        r.register(self.alerts)

        self.paused = Gauge(
            "pgcrond_job_paused",
            "1 while the job is paused (pgcrond pause) or suspended (YAML), as this "
            "replica last learnt it: at start, and from each claim's answer.",
            ["job"],
            registry=r,
        )
        self.config_drift = Gauge(
            "pgcrond_config_drift",
            "Config hashes that live replicas run, beyond one: 0 while all agree. As this "
            "replica last read the registry: at start, on reload and once a minute.",
            registry=r,
        )

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
        wanted = sorted(set(codes))
        self.alerts.set_jobs({code: (alert_after or {}).get(code) for code in wanted})
        by_job: list[Counter | Gauge] = [
            self.fires, self.wins, self.misfires, self.takeovers, self.running,
            self.heartbeat_failures, self.paused,
        ]  # fmt: skip
        # Histograms appear with a job's first run: a zero histogram answers no
        # alert, and its ~30 buckets per job are most of the memory at 10,000 jobs.
        by_first_run: list[Histogram] = [self.run_duration, self.lateness]
        for metric in [
            *by_job, *by_first_run, self.runs, self.losses, self.skips, self.missed,
            self.missed_recorded,
        ]:  # fmt: skip
            for labels in _label_sets(metric):
                if labels[0] not in wanted:
                    metric.remove(*labels)
        for code in wanted:
            for metric in by_job:
                metric.labels(code)
            for outcome in RUN_OUTCOMES:
                self.runs.labels(code, outcome)
            for cause in MISSED_CAUSES:
                self.missed.labels(code, cause)
            for reason in MISSED_REASONS:
                self.missed_recorded.labels(code, reason)


def _label_sets(metric: Counter | Gauge | Histogram) -> set[tuple[str, ...]]:
    """The label values of each child of ``metric``, job first (as declared)."""
    found: set[tuple[str, ...]] = set()
    for family in metric.collect():
        for sample in family.samples:
            labels = {k: v for k, v in sample.labels.items() if k != "le"}
            if "job" in labels:
                found.add((labels.pop("job"), *labels.values()))
    return found
