"""The page's views: the jobs (paged), what runs now, the live replicas, one job.

Each is read with the bounded, indexed statements of :mod:`pgcrond.storage.status`
and answered as a :class:`View`: its data (the JSON) and its body (the HTML).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from pgcrond import report
from pgcrond.config.models import Config, JobConfig
from pgcrond.core.durations import format_duration
from pgcrond.daemon.page.entries import (
    attempt_entry,
    job_entry,
    request_entry,
    running_entry,
    tick_entry,
)
from pgcrond.daemon.page.forms import action_forms
from pgcrond.daemon.page.html import SignedIn, card, esc, legend
from pgcrond.daemon.page.job import attempts_section, job_body
from pgcrond.daemon.page.memo import ScheduleMemo
from pgcrond.daemon.page.routes import PREFIX, job_path
from pgcrond.daemon.page.tables import (
    drift_note,
    jobs_pager,
    jobs_table,
    replicas_table,
    requests_table,
    running_table,
)
from pgcrond.storage import attempts, jobstate, registry
from pgcrond.storage import status as reads
from pgcrond.storage.leases import LeaseStore

# Jobs per page of the jobs view: the page's cost grows with the jobs it draws.
PAGE_SIZE = 100
FAILING_SHOWN = 20
# Next fire instants: one in the jobs view, this many on a job's page.
NEXT_FIRES = 5
# The newest attempts a job's page shows with their output (up to 36 KiB each).
ATTEMPTS_SHOWN = 10


@dataclass(frozen=True)
class View:
    """What one request shows: its data (the JSON) and how to draw it (the HTML)."""

    title: str
    json_path: str
    data: dict[str, Any]
    body: str


class NotFound(Exception):
    pass


class Views:
    """Each view's data, read from the lease table, and its body drawn from that data.

    Called one request at a time (the page holds the one connection it may use).
    """

    def __init__(self, *, replica: str, version: str, page_size: int = PAGE_SIZE) -> None:
        self.replica = replica
        self.version = version
        self.page_size = page_size
        self._memo = ScheduleMemo()

    async def overview(self, store: LeaseStore, config: Config, now: datetime, page: int) -> View:
        every = list(config.jobs.values())
        pages = max(1, -(-len(every) // self.page_size))
        if not 1 <= page <= pages:
            raise NotFound(f"no page {page}: the jobs view has {pages}")
        jobs = every[(page - 1) * self.page_size : page * self.page_size]
        entries = await self._job_entries(store, jobs, now, next_fires=1)
        # Failing jobs across every page: one bounded probe per job, nothing drawn.
        failing = await reads.failing(store, [job.code for job in every])
        running = [running_entry(row) for row in await reads.running(store)]
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
            "replicas": replicas,
        }
        cards = (
            card("jobs", str(len(every)), f"{PREFIX}#jobs")
            + card("running now", str(len(running)), f"{PREFIX}/running", "run" if running else "")
            + card("last run failed", str(len(failing)), "#failing", "fail" if failing else "")
            + card("live replicas", str(len(replicas)), f"{PREFIX}/replicas")
        )
        failing_html = ""
        if failing:
            shown = ", ".join(
                f'<a class="code" href="{esc(job_path(code))}">{esc(code)}</a>'
                for code in failing[:FAILING_SHOWN]
            )
            more = (
                f" and {len(failing) - FAILING_SHOWN} more" if len(failing) > FAILING_SHOWN else ""
            )
            failing_html = f'<p id="failing" class="failing">Last run failed: {shown}{more}</p>'
        first = (page - 1) * self.page_size + 1
        pager = jobs_pager(page, pages, f"jobs {first}–{first + len(jobs) - 1} of {len(every)}")
        json_path = f"{PREFIX}.json" if page == 1 else f"{PREFIX}/page/{page}.json"
        body = (
            f'<section class="cards">{cards}</section>{failing_html}'
            f"<h2>Running now</h2>{running_table(running, now)}"
            f'<h2 id="jobs">Jobs</h2>{legend()}{pager if pages > 1 else ""}'
            f"{jobs_table(entries, jobs, now)}{pager if pages > 1 else ''}"
        )
        return View("Status", json_path, data, body)

    async def running(self, store: LeaseStore, config: Config, now: datetime) -> View:
        running = [running_entry(row) for row in await reads.running(store)]
        data = {"generated_at": now, "replica": self.replica, "running": running}
        body = f"<h2>Running now</h2>{running_table(running, now)}"
        return View("Running now", f"{PREFIX}/running.json", data, body)

    async def replicas(self, store: LeaseStore, now: datetime) -> View:
        replicas, drift = await self._replica_entries(store)
        data = {
            "generated_at": now,
            "replica": self.replica,
            "replicas": replicas,
            "drift": report.drift_entry(drift),
        }
        window = format_duration(reads.REPLICAS_WITHIN)
        body = (
            "<h2>Live replicas</h2>"
            f'<p class="note">From the registry: each replica writes its row at start and '
            f"once a minute, and deletes it when it stops. Runs count the rows each replica "
            f"claimed in the last {esc(window)}.</p>"
            f"{drift_note(drift)}{replicas_table(replicas, now)}"
        )
        return View("Replicas", f"{PREFIX}/replicas.json", data, body)

    async def job(
        self, store: LeaseStore, job: JobConfig, now: datetime, signed_in: SignedIn | None
    ) -> View:
        [entry] = await self._job_entries(store, [job], now, next_fires=NEXT_FIRES)
        rows = [tick_entry(row) for row in await reads.ticks(store, job.code)]
        asked = [request_entry(row) for row in await reads.requests(store, job.code)]
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
            "attempts": kept,
        }
        actions = "" if signed_in is None else action_forms(job, entry["paused"], signed_in)
        body = (
            actions
            + job_body(job, entry, rows, now)
            + attempts_section(kept, now)
            + requests_table(asked, now)
        )
        return View(f"Job {job.code}", job_path(job.code, ".json"), data, body)

    async def _job_entries(
        self, store: LeaseStore, jobs: Sequence[JobConfig], now: datetime, *, next_fires: int
    ) -> list[dict[str, Any]]:
        codes = [job.code for job in jobs]
        statuses = await reads.job_status(store, codes)
        ticks = await reads.job_ticks(store, codes)
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
