"""Alert gauges that survive restarts: each job's last success and failure, from the table.

A replica's own counters restart at zero; what an alert needs is the
cluster's truth, which is in the lease table. At start a replica reads it
once (:func:`seed`, one bounded query: ``job_ticks``, the same reading as
``pgcrond status``), then keeps it current from each finalize it makes itself
(:meth:`JobAlerts.recorded`). It never queries while idle, and a scrape sends
no query: ``pgcrond_job_stale`` is computed at scrape time from what is known.

What one replica knows is the table as of its start plus its own finalizes;
a success another replica recorded since is not seen here. Across replicas,
``max by (cronjob)`` of the timestamps is the cluster's truth, and a job is stale
when *every* replica says so (``min by (cronjob) (pgcrond_job_stale)``): the
shipped rules in ``deploy/prometheus/`` aggregate that way.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

import structlog

from pgcrond.daemon.job_series import gauge_text
from pgcrond.errors import DatabaseUnavailable, PgcrondError

log = structlog.get_logger("pgcrond.daemon.alerts")

# Seeding through a database that is not up yet: backoff between tries.
_SEED_RETRY_FIRST_S = 0.5
_SEED_RETRY_MAX_S = 10.0


@dataclass(slots=True)
class JobTruth:
    """What this replica knows of one job's outcomes (Unix seconds; None: none known)."""

    last_success: float | None = None
    last_failure: float | None = None
    # FAIL runs with no retry left since the last SUCCESS, as `pgcrond status` counts them.
    consecutive_failures: int = 0
    # This replica recorded an outcome before the seed answered: its count is newer.
    touched: bool = False


class JobAlerts:
    """The per-job alert gauges, rendered at scrape time on the daemon's registry.

    ``set_jobs`` follows :meth:`pgcrond.daemon.metrics.Metrics.set_jobs`: every
    job of the config has ``pgcrond_job_consecutive_failures`` (0 until known)
    and, with an ``alert_after``, ``pgcrond_job_stale``; the timestamps have no
    honest zero and appear once there is an outcome to show.
    """

    def __init__(self, clock: Callable[[], float] = time.time) -> None:
        self._clock = clock
        self._started = clock()
        self._jobs: dict[str, JobTruth] = {}
        self._alert_after: dict[str, timedelta | None] = {}

    # -- what is known ---------------------------------------------------------------

    def set_jobs(self, alert_after: Mapping[str, timedelta | None]) -> None:
        """Exactly these jobs (code -> its alert_after); a removed job's series go."""
        # The jobs with an alert_after only: most have none.
        self._alert_after = {c: after for c, after in alert_after.items() if after is not None}
        self._jobs = {code: self._jobs.get(code, JobTruth()) for code in sorted(alert_after)}

    def seed(self, rows: Iterable[Mapping[str, Any]]) -> None:
        """Take the table's truth (``job_ticks`` rows); newer local outcomes win."""
        for row in rows:
            truth = self._jobs.get(row["code"])
            if truth is None:
                continue  # removed by a reload while the seed ran
            truth.last_success = _latest(truth.last_success, _unix(row["last_success_at"]))
            truth.last_failure = _latest(truth.last_failure, _unix(row["last_failure_at"]))
            if not truth.touched:
                truth.consecutive_failures = int(row["consecutive_failures"] or 0)

    def recorded(self, code: str, outcome: str, *, final: bool) -> None:
        """This replica recorded ``outcome`` (a guard's verdict kind) for a run of ``code``.

        ``final``: no retry follows (the row has no retry time), the rule by
        which the table counts consecutive failures. A release is no outcome.
        """
        truth = self._jobs.get(code)
        if truth is None:
            return
        now = self._clock()
        if outcome == "success":
            truth.last_success, truth.consecutive_failures = now, 0
        elif outcome in ("fail", "timeout"):
            truth.last_failure = now
            if final:
                truth.consecutive_failures += 1
        else:
            return
        truth.touched = True

    def stale(self, now: float | None = None) -> dict[str, float]:
        """The stale jobs: code -> seconds since their last success (or since this start)."""
        now = self._clock() if now is None else now
        found: dict[str, float] = {}
        for code, truth in self._jobs.items():
            after = self._alert_after.get(code)
            if after is None:
                continue
            # Never succeeded: counted from this replica's start, so that a new
            # job is not stale before it had the chance to run.
            since = now - (truth.last_success or self._started)
            if since > after.total_seconds():
                found[code] = since
        return found

    def readiness_detail(self) -> list[str]:
        """Lines for /readyz's body: one per stale job (readiness is not failed by them)."""
        lines = []
        for code, since in self.stale().items():
            truth = self._jobs[code]
            after = self._alert_after[code]
            assert after is not None
            last = (
                "never succeeded since this replica started"
                if truth.last_success is None
                else f"last success {_iso(truth.last_success)}"
            )
            lines.append(
                f"stale: {code}: no success for {int(since)}s > alert_after "
                f"{int(after.total_seconds())}s ({last})"
            )
        return lines

    # -- the gauges, at scrape time --------------------------------------------------

    def render(self, openmetrics: bool) -> str:
        """The four gauges, from what is known now (on the scrape's thread)."""
        now = self._clock()
        stale_now = self.stale(now)
        jobs = list(self._jobs.items())  # one C call: a snapshot, whatever the loop does
        return (
            gauge_text(
                "pgcrond_job_last_success_timestamp_seconds",
                "Unix time of the job's last SUCCESS in the cluster, as this replica knows it: "
                "the lease table at start, then its own finalizes.",
                [(code, t.last_success) for code, t in jobs if t.last_success is not None],
            )
            + gauge_text(
                "pgcrond_job_last_failure_timestamp_seconds",
                "Unix time of the job's last FAIL in the cluster (released runs aside), as this "
                "replica knows it.",
                [(code, t.last_failure) for code, t in jobs if t.last_failure is not None],
            )
            + gauge_text(
                "pgcrond_job_consecutive_failures",
                "FAIL runs with no retry left since the job's last SUCCESS, as this replica "
                "knows it.",
                [(code, t.consecutive_failures) for code, t in jobs],
            )
            + gauge_text(
                "pgcrond_job_stale",
                "1 while the job has not succeeded for longer than its alert_after (jobs with "
                "one only).",
                [
                    (code, 1.0 if code in stale_now else 0.0)
                    for code, _ in jobs
                    if self._alert_after.get(code) is not None
                ],
            )
        )


async def seed(
    alerts: JobAlerts,
    read: Callable[[list[str]], Any],
    codes: Callable[[], list[str]],
    stopping: asyncio.Event,
) -> None:
    """Seed ``alerts`` from ``await read(codes)``, waiting out a database not up yet."""
    delay = _SEED_RETRY_FIRST_S
    while not stopping.is_set():
        try:
            rows = await read(codes())
        except DatabaseUnavailable as exc:
            log.warning("alerts_not_seeded", error=str(exc), retry_in_s=delay)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stopping.wait(), delay)
            delay = min(delay * 2, _SEED_RETRY_MAX_S)
            continue
        except PgcrondError as exc:
            log.warning("alerts_not_seeded", error=str(exc))
            return
        alerts.seed(rows)
        log.info("alerts_seeded", jobs=len(rows))
        return


def _unix(moment: datetime | None) -> float | None:
    return None if moment is None else moment.timestamp()


def _latest(a: float | None, b: float | None) -> float | None:
    return b if a is None else a if b is None else max(a, b)


def _iso(unix: float) -> str:
    return datetime.fromtimestamp(unix, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
