"""The page's views: the jobs (paged, filtered), what runs now, the live replicas, one job.

Each is read with the bounded, indexed statements of :mod:`pgcrond.storage.status`
and answered as a :class:`View`: its data (the JSON) and the template that
draws it with its context (the HTML).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from fnmatch import fnmatchcase
from typing import Any, Literal

from pgcrond import report
from pgcrond.config.models import Config, JobConfig
from pgcrond.core.durations import format_duration
from pgcrond.daemon.page.chart import duration_chart
from pgcrond.daemon.page.entries import (
    attempt_entry,
    backfill_entry,
    job_entry,
    request_entry,
    running_entry,
    tick_entry,
)
from pgcrond.daemon.page.memo import ScheduleMemo
from pgcrond.daemon.page.render import ERROR_WIDTH
from pgcrond.daemon.page.routes import PREFIX, job_path
from pgcrond.storage import attempts, backfills, jobstate, registry
from pgcrond.storage import status as reads
from pgcrond.storage.leases import LeaseStore

# Jobs per page of the jobs view: the page's cost grows with the jobs it draws.
PAGE_SIZE = 100
FAILING_SHOWN = 20
# Next fire instants: one in the jobs view, this many on a job's page.
NEXT_FIRES = 5
# The newest attempts a job's page shows with their output (up to 36 KiB each).
ATTEMPTS_SHOWN = 10
# The history ranges a job's page offers as links, back from now.
HISTORY_PRESETS = (
    ("last hour", timedelta(hours=1)),
    ("24 hours", timedelta(days=1)),
    ("7 days", timedelta(days=7)),
)
# An attempt record's status -> the badge colour of the tick outcome it matches.
ATTEMPT_CLASSES = {
    "success": "ok",
    "fail": "fail",
    "timeout": "fail",
    "lost": "fail",
    "released": "skip",
    "replaced": "skip",
    "running": "run",
}
Show = Literal["all", "failing", "paused", "active"]
SHOWS: tuple[Show, ...] = ("all", "failing", "paused", "active")


@dataclass(frozen=True)
class View:
    """What one request shows: its data (the JSON), and the template and context of its HTML."""

    title: str
    json_path: str
    data: dict[str, Any]
    template: str
    context: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class JobFilter:
    """The overview's filter box: a code (substring, or a glob with ``*?[``) and a state."""

    q: str = ""
    show: Show = "all"

    @property
    def active(self) -> bool:
        return bool(self.q) or self.show != "all"

    def matches_code(self, code: str) -> bool:
        if not self.q:
            return True
        if any(char in self.q for char in "*?["):
            return fnmatchcase(code, self.q)
        return self.q.lower() in code.lower()

    def query(self) -> dict[str, str]:
        """The filter's own query parameters (for the pager's links)."""
        return {k: v for k, v in (("q", self.q), ("show", self.show)) if v and v != "all"}


@dataclass(frozen=True)
class HistoryRange:
    """A job's history between two instants (None: unbounded), as asked and as typed."""

    since: datetime | None = None
    until: datetime | None = None
    since_text: str = ""
    until_text: str = ""


@dataclass(frozen=True)
class SignedIn:
    """Who a page is drawn for: their name and role, and the CSRF token its forms carry."""

    operator: str
    role: str
    csrf: str


class NotFound(Exception):
    pass


class Views:
    """Each view's data, read from the lease table, and the template that draws it.

    Called one request at a time (the page holds the one connection it may use).
    """

    def __init__(self, *, replica: str, version: str, page_size: int = PAGE_SIZE) -> None:
        self.replica = replica
        self.version = version
        self.page_size = page_size
        self._memo = ScheduleMemo()

    async def overview(
        self,
        store: LeaseStore,
        config: Config,
        now: datetime,
        page: int,
        chosen: JobFilter = JobFilter(),
    ) -> View:
        every = list(config.jobs.values())
        # Failing jobs across every page: one bounded probe per job, nothing drawn.
        failing = await reads.failing(store, [job.code for job in every])
        pauses = await jobstate.paused(store)
        matched = [job for job in every if chosen.matches_code(job.code)]
        if chosen.show == "failing":
            failed = set(failing)
            matched = [job for job in matched if job.code in failed]
        elif chosen.show in ("paused", "active"):
            want = chosen.show == "paused"
            matched = [
                job
                for job in matched
                if (job.suspended or jobstate.pause_of(pauses, job.code) is not None) == want
            ]
        pages = max(1, -(-len(matched) // self.page_size))
        if not 1 <= page <= pages:
            raise NotFound(f"no page {page}: the jobs view has {pages}")
        jobs = matched[(page - 1) * self.page_size : page * self.page_size]
        entries = await self._job_entries(store, jobs, now, next_fires=1, pauses=pauses)
        running = [running_entry(row) for row in await reads.running(store)]
        filling = [backfill_entry(row) for row in await backfills.running(store)]
        replicas, _ = await self._replica_entries(store)
        data = {
            "generated_at": now,
            "replica": self.replica,
            "version": self.version,
            "page": page,
            "pages": pages,
            "jobs": entries,
            "failing": failing,
            "running": running,
            "backfills": filling,
            "replicas": replicas,
        }
        json_path = f"{PREFIX}.json" if page == 1 else f"{PREFIX}/page/{page}.json"
        context = {
            "total": len(every),
            "matched": len(matched),
            "jobs": entries,
            "failing": failing,
            "failing_shown": FAILING_SHOWN,
            "running": running,
            "backfills": filling,
            "replicas": replicas,
            "page": page,
            "pages": pages,
            "first": (page - 1) * self.page_size + 1,
            "filter": chosen,
        }
        return View("Status", json_path, data, "overview.html", context)

    async def running(self, store: LeaseStore, config: Config, now: datetime) -> View:
        running = [running_entry(row) for row in await reads.running(store)]
        filling = [backfill_entry(row) for row in await backfills.running(store)]
        data = {
            "generated_at": now,
            "replica": self.replica,
            "running": running,
            "backfills": filling,
        }
        return View("Running now", f"{PREFIX}/running.json", data, "running.html", data)

    async def replicas(self, store: LeaseStore, now: datetime) -> View:
        replicas, drift = await self._replica_entries(store)
        data = {
            "generated_at": now,
            "replica": self.replica,
            "replicas": replicas,
            "drift": report.drift_entry(drift),
        }
        context = {
            "replicas": replicas,
            "drift": drift,
            "window": format_duration(reads.REPLICAS_WITHIN),
            "hash_shown": report.CONFIG_HASH_SHOWN,
        }
        return View("Replicas", f"{PREFIX}/replicas.json", data, "replicas.html", context)

    async def job(
        self,
        store: LeaseStore,
        job: JobConfig,
        now: datetime,
        history: HistoryRange = HistoryRange(),
    ) -> View:
        [entry] = await self._job_entries(store, [job], now, next_fires=NEXT_FIRES)
        found = await reads.ticks(store, job.code, since=history.since, until=history.until)
        rows = [tick_entry(row) for row in found]
        asked = [request_entry(row) for row in await reads.requests(store, job.code)]
        filling = [backfill_entry(row) for row in await backfills.running(store, job.code)]
        kept = [
            attempt_entry(row)
            for row in await attempts.of_job(store, job.code, limit=ATTEMPTS_SHOWN)
        ]
        data = {
            "generated_at": now,
            "replica": self.replica,
            "job": entry,
            "ticks": rows,
            "requests": asked,
            "backfills": filling,
            "attempts": kept,
        }
        facts = [
            ("Schedule", entry["schedule"]),
            ("Guard", job.guard),
            ("Time zone", job.timezone.key),
            ("Timeout", format_duration(job.timeout) if job.timeout else "none"),
            ("Retries", job.retries),
            (
                "Concurrency",
                job.concurrency
                if job.max_concurrent is None
                else f"{job.concurrency}, at most {job.max_concurrent} at once",
            ),
            ("Misfire grace", format_duration(job.misfire_grace)),
            ("Consecutive failures", entry["consecutive_failures"]),
        ]
        presets = [
            (label, report.iso(now - back, precise=False)) for label, back in HISTORY_PRESETS
        ]
        context = {
            "job": job,
            "entry": entry,
            "facts": facts,
            "rows": rows,
            "chart": duration_chart(rows, now),
            "history": {
                "since": history.since,
                "until": history.until,
                "since_text": history.since_text,
                "until_text": history.until_text,
                "presets": presets,
            },
            "attempts": kept,
            "attempt_classes": ATTEMPT_CLASSES,
            "requests": asked,
            "backfills": filling,
            "error_width": ERROR_WIDTH,
        }
        return View(f"Job {job.code}", job_path(job.code, ".json"), data, "job.html", context)

    async def _job_entries(
        self,
        store: LeaseStore,
        jobs: Sequence[JobConfig],
        now: datetime,
        *,
        next_fires: int,
        pauses: dict[str, jobstate.Pause] | None = None,
    ) -> list[dict[str, Any]]:
        codes = [job.code for job in jobs]
        statuses = await reads.job_status(store, codes)
        ticks = await reads.job_ticks(store, codes)
        if pauses is None:
            pauses = await jobstate.paused(store)
        entries = []
        for job, row, job_ticks in zip(jobs, statuses, ticks, strict=True):
            entry = job_entry(job, row, job_ticks, now, next_fires, memo=self._memo)
            entry["paused"] = report.pause_entry(job, jobstate.pause_of(pauses, job.code))
            entries.append(entry)
        return entries

    async def _replica_entries(
        self, store: LeaseStore
    ) -> tuple[list[dict[str, Any]], registry.Drift | None]:
        """The registry's live replicas, each with what its rows of the last hour say."""
        live = await registry.live(store)
        activity = {seen.owner: seen for seen in await reads.replicas(store)}
        entries = []
        for replica in live:
            seen = activity.get(replica.name)
            entries.append(
                {
                    **report.replica_entry(replica),
                    "owner": replica.name,
                    "this_replica": replica.name == self.replica,
                    "runs": seen.runs if seen else 0,
                    "running": seen.running if seen else 0,
                    "successes": seen.successes if seen else 0,
                    "failures": seen.failures if seen else 0,
                }
            )
        return entries, registry.drift(live)
