"""The page's tables: jobs, running rows, replicas, a job's ticks and its requested runs.

Each is a row of :class:`_Column` drawn by :func:`_table`: the same markup for
every table, so that each draws as cards on a phone (status.css) alike.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from pgcrond import report
from pgcrond.config.models import JobConfig
from pgcrond.daemon.page.html import esc, outcome_badge, strip_html, time_html
from pgcrond.daemon.page.routes import PREFIX, job_path
from pgcrond.storage import registry

ERROR_WIDTH = 120

Row = dict[str, Any]


@dataclass(frozen=True)
class _Column:
    """One column: its heading, and each row's cell as HTML (escaped already) as of ``now``."""

    heading: str
    cell: Callable[[Row, datetime], str]
    # The cell's label where the table is drawn as cards; the heading if empty.
    label: str = ""
    # Its cells' class ("num", "code").
    css: str = ""
    # A count in the row that marks the cell bad when it is not zero.
    bad_when: str | None = None

    def td(self, row: Row, now: datetime) -> str:
        css = self.css
        if self.bad_when is not None and row[self.bad_when]:
            css += " bad"
        class_attr = f' class="{css}"' if css else ""
        return (
            f'<td data-label="{esc(self.label or self.heading)}"{class_attr}>'
            f"<div>{self.cell(row, now)}</div></td>"
        )


def _table(
    css: str, columns: Sequence[_Column], rows: Sequence[Row], now: datetime, *, empty: str
) -> str:
    """The rows under their columns' headings, or ``empty`` where there are none."""
    if not rows:
        return empty
    head = "".join(f"<th>{esc(column.heading)}</th>" for column in columns)
    body = "".join(
        "<tr>" + "".join(column.td(row, now) for column in columns) + "</tr>" for row in rows
    )
    return (
        f'<div class="scroll"><table class="{css}"><thead><tr>{head}</tr></thead>'
        f"<tbody>{body}</tbody></table></div>"
    )


def _text(name: str) -> Callable[[Row, datetime], str]:
    return lambda row, _now: esc(row[name])


def _time(name: str) -> Callable[[Row, datetime], str]:
    return lambda row, now: time_html(row[name], now)


def _run_key(row: Row, _now: datetime) -> str:
    return f"<code>{esc(row['run_key'] or '(initial)')}</code>"


def jobs_table(entries: list[Row], jobs: list[JobConfig], now: datetime) -> str:
    empty = '<p class="empty">This replica\'s config has no jobs.</p>'
    return _table("jobs cards-on-phone", _JOBS, entries, now, empty=empty)


def _job_cell(entry: Row, _now: datetime) -> str:
    code = entry["job"]
    description = entry["description"]
    desc_html = f'<small class="desc">{esc(description)}</small>' if description else ""
    paused = entry.get("paused")
    paused_html = ""
    if paused is not None:
        why = paused.get("detail") or f"by {paused['by']}" + (
            f": {paused['reason']}" if paused.get("reason") else ""
        )
        paused_html = f'<small class="paused">paused — {esc(why)}</small>'
    if entry.get("stale"):
        paused_html += '<small class="stale">stale: no success within alert_after</small>'
    return f'<a class="code" href="{esc(job_path(code))}">{esc(code)}</a>{desc_html}{paused_html}'


def _schedule_cell(entry: Row, _now: datetime) -> str:
    guard = f'<small><span class="guard">{esc(entry["guard"])}</span></small>'
    return esc(entry["schedule"]) + guard


def _next_fire_cell(entry: Row, now: datetime) -> str:
    if entry["runs_at_start"]:
        return '<span class="none">at the next start</span>'
    if entry["next_fires"]:
        fire = entry["next_fires"][0]
        return f'{time_html(fire["at"], now)}<small class="local">{esc(fire["local"])}</small>'
    return '<span class="none">never</span>'


def _success_cell(entry: Row, now: datetime) -> str:
    ok = entry["last_success"]
    if not ok:
        return '<span class="none">none recently</span>'
    return f"{time_html(ok['finished_at'], now)}<small>on {esc(ok['owner'])}</small>"


def _failure_cell(entry: Row, now: datetime) -> str:
    bad = entry["last_failure"]
    if not bad:
        return '<span class="none">none recently</span>'
    return (
        f"{time_html(bad['finished_at'] or bad['acquired_at'], now)}"
        f"{outcome_badge('FAIL', bad['reason'])}"
        f'<small class="err">{esc(report.first_line(bad["error"], ERROR_WIDTH))}</small>'
    )


_JOBS = (
    _Column("Job", _job_cell),
    _Column("Schedule", _schedule_cell),
    _Column("Next fire", _next_fire_cell),
    _Column("Last success", _success_cell),
    _Column("Last failure", _failure_cell),
    _Column(
        "Recent ticks (oldest → newest)",
        lambda entry, _now: strip_html(entry["ticks"]),
        label="Recent ticks",
    ),
    _Column("Fails", _text("consecutive_failures"), css="num", bad_when="consecutive_failures"),
)


def jobs_pager(page: int, pages: int, label: str) -> str:
    def link(n: int, text: str) -> str:
        href = PREFIX if n == 1 else f"{PREFIX}/page/{n}"
        return f'<a href="{href}">{esc(text)}</a>'

    previous = link(page - 1, "← previous") if page > 1 else ""
    following = link(page + 1, "next →") if page < pages else ""
    return (
        f'<nav class="pager">{previous}<span>{esc(label)}, page {page} of {pages}</span>'
        f"{following}</nav>"
    )


def running_table(running: list[Row], now: datetime) -> str:
    empty = '<p class="empty">Nothing is running.</p>'
    return _table("cards-on-phone", _RUNNING, running, now, empty=empty)


def _job_link(row: Row, _now: datetime) -> str:
    return f'<a class="code" href="{esc(job_path(row["job"]))}">{esc(row["job"])}</a>'


def _expiry_cell(row: Row, now: datetime) -> str:
    stale = '<span class="badge fail">STALE</span>' if row["stale"] else ""
    return time_html(row["expires_at"], now) + stale


_RUNNING = (
    _Column("Job", _job_link),
    _Column("Run key", _run_key),
    _Column("Replica", _text("owner")),
    _Column("Attempt", _text("attempt"), css="num"),
    _Column("Since", _time("since")),
    _Column("Lease expiry", _expiry_cell),
    _Column(
        "Fencing token", lambda row, _now: f"<code>{esc(row['fencing_token'])}</code>", css="num"
    ),
)


def drift_note(drift: registry.Drift | None) -> str:
    if drift is None:
        return ""
    differ = ", ".join(drift.jobs) or "none (settings only)"
    return (
        f'<p class="failing">Config drift since {esc(report.when(drift.since))}: '
        f"{len(drift.configs)} configs among the live replicas; jobs that differ: "
        f"{esc(differ)}</p>"
    )


def replicas_table(replicas: list[Row], now: datetime) -> str:
    empty = '<p class="empty">No live replica in the registry.</p>'
    return _table("cards-on-phone", _REPLICAS, replicas, now, empty=empty)


def _replica_cell(row: Row, _now: datetime) -> str:
    this_one = ' <span class="badge run">this one</span>' if row["this_replica"] else ""
    return esc(row["owner"]) + this_one


_REPLICAS = (
    _Column("Replica", _replica_cell),
    _Column("Version", _text("version")),
    _Column(
        "Config",
        lambda row, _now: esc(row["config_hash"][: report.CONFIG_HASH_SHOWN]),
        css="code",
    ),
    _Column("Last seen", _time("last_seen")),
    _Column("Running", _text("running"), css="num"),
    _Column("Runs (finished)", _text("runs"), label="Runs", css="num"),
    _Column("Failures", _text("failures"), css="num", bad_when="failures"),
)


def requests_table(asked: list[Row], now: datetime) -> str:
    if not asked:
        return ""
    return "<h2>Manual runs requested</h2>" + _table(
        "requests cards-on-phone", _REQUESTS, asked, now, empty=""
    )


_REQUESTS = (
    _Column("Run key", _run_key),
    _Column("Requested by", _text("requested_by")),
    _Column("Requested", _time("requested_at")),
    _Column("Taken by", lambda row, _now: esc(row["taken_by"] or "–")),
    _Column("Outcome", lambda row, _now: esc(_request_state(row))),
)


def _request_state(asked: dict[str, Any]) -> str:
    if asked["outcome"]:
        return str(asked["outcome"])
    return "taken, running" if asked["taken_by"] else "pending: no replica took it yet"


def ticks_table(rows: list[Row], now: datetime) -> str:
    empty = '<p class="empty">No ticks recorded yet.</p>'
    return _table("ticks cards-on-phone", _TICKS, rows, now, empty=empty)


def _outcome_cell(row: Row, _now: datetime) -> str:
    stale = ' <span class="badge fail">STALE</span>' if row["stale"] else ""
    return outcome_badge(row["status"], row["reason"]) + stale


def _error_cell(row: Row, _now: datetime) -> str:
    error = row["error"]
    if error and ("\n" in error.strip() or len(error) > ERROR_WIDTH):
        return (
            f"<details><summary>{esc(report.first_line(error, ERROR_WIDTH))}</summary>"
            f"<pre>{esc(error)}</pre></details>"
        )
    if error:
        return f'<span class="err">{esc(error)}</span>'
    return '<span class="none">–</span>'


_TICKS = (
    _Column("Run key", _run_key),
    _Column("Outcome", _outcome_cell),
    _Column("Duration", lambda row, _now: esc(report.took(row["duration_s"])), css="num"),
    _Column("Replica", _text("owner")),
    _Column("Attempt", _text("attempt"), css="num"),
    _Column("Claimed", _time("acquired_at")),
    _Column("Error", _error_cell),
    _Column(
        "Idempotency key",
        lambda row, _now: f'<code class="key">{esc(row["idempotency_key"])}</code>',
    ),
)
