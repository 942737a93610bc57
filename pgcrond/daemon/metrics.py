"""Prometheus metrics of one replica: what fired, who won, what ran and how it ended.

Names follow the glossary: a *fire* is a replica's timer going off for a tick;
a *win*/*loss* is the outcome of its claim; a *skip* is a fire not run on
purpose; a *misfire* started later than ``misfire_grace`` after its tick.
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

# Lateness of a healthy replica is milliseconds; the tail (late fires within
# grace, takeovers) matters up to the default misfire grace (5 min).
LATENESS_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300)
DURATION_BUCKETS = (0.01, 0.05, 0.1, 0.5, 1, 5, 10, 30, 60, 300, 900, 3600, 14400)


class Metrics:
    """All metrics on one registry (a fresh one per daemon, so tests can run several)."""

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry or CollectorRegistry()
        r = self.registry
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
        self.last_success = Gauge(
            "pgcrond_last_success_timestamp_seconds",
            "Unix time of the last successful run of each job.",
            ["job"],
            registry=r,
        )
