"""A job's page: its facts and next fires, its ticks charted and listed, its attempts' output."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from pgcrond import report
from pgcrond.config.models import JobConfig
from pgcrond.core.durations import format_duration
from pgcrond.daemon.page.chart import duration_chart
from pgcrond.daemon.page.html import esc, legend, strip_html
from pgcrond.daemon.page.tables import ticks_table

# An attempt record's status -> the badge colour of the tick outcome it matches.
ATTEMPT_CLASSES = {
    "success": "ok",
    "fail": "fail",
    "timeout": "fail",
    "lost": "fail",
    "released": "skip",
    "running": "run",
}


def job_body(
    job: JobConfig, entry: dict[str, Any], rows: list[dict[str, Any]], now: datetime
) -> str:
    facts = [
        ("Schedule", esc(entry["schedule"])),
        ("Guard", esc(job.guard)),
        ("Time zone", esc(job.timezone.key)),
        ("Timeout", esc(format_duration(job.timeout)) if job.timeout else "none"),
        ("Retries", esc(job.retries)),
        ("Concurrency", esc(job.concurrency)),
        ("Misfire grace", esc(format_duration(job.misfire_grace))),
        ("Consecutive failures", esc(entry["consecutive_failures"])),
    ]
    description = f'<p class="description">{esc(job.description)}</p>' if job.description else ""
    facts_html = "".join(f"<dt>{name}</dt><dd>{value}</dd>" for name, value in facts)
    if entry["runs_at_start"]:
        fires_html = '<p class="empty">Runs at the next start of a replica.</p>'
    elif entry["next_fires"]:
        fires_html = (
            '<table class="fires"><thead><tr><th>UTC</th><th>'
            f"{esc(job.timezone.key)}</th><th>In</th></tr></thead><tbody>"
            + "".join(
                f"<tr><td><div><code>{esc(report.when(f['at']))}</code></div></td>"
                f"<td><div>{esc(f['local'])}</div></td>"
                f"<td><div>{esc(report.relative(f['at'] - now))}</div></td></tr>"
                for f in entry["next_fires"]
            )
            + "</tbody></table>"
        )
    else:
        fires_html = '<p class="empty">No more ticks.</p>'
    return (
        f"{description}"
        f'<div class="split"><dl class="facts">{facts_html}</dl>'
        f"<div><h2>Next fires</h2>{fires_html}</div></div>"
        f"<h2>Recent ticks</h2>{legend()}{strip_html(entry['ticks'])}"
        f"<h2>Duration of recent runs</h2>{duration_chart(rows, now)}"
        f"<h2>History (newest first, {len(rows)} rows)</h2>{ticks_table(rows, now)}"
    )


def attempts_section(kept: list[dict[str, Any]], now: datetime) -> str:
    """Each recent attempt and what it printed: streams collapsed, the failing one first.

    The text is already safe (control characters and invalid UTF-8 escaped,
    pgcrond.core.output.shown); esc() makes it safe in HTML too.
    """
    if not kept:
        return (
            '<h2>Attempts</h2><p class="empty">No attempt records yet (kept for runs under '
            "the lease guard).</p>"
        )
    out = []
    for a in kept:
        failed = a["status"] not in ("success", "running")
        exit_code = "" if a["exit_code"] is None else f" · exit {a['exit_code']}"
        error = f'<p class="err">{esc(a["error"])}</p>' if a["error"] else ""
        streams = []
        order = ("stderr", "stdout") if failed else ("stdout", "stderr")
        for name in order:
            stream = a["output"][name]
            dropped = stream["dropped_bytes"]
            if not stream["text"]:
                streams.append(f'<p class="stream empty">{name}: empty</p>')
                continue
            note = f" · {dropped} bytes in the middle not kept" if dropped else ""
            streams.append(
                f'<details class="stream {name}"><summary>{name}{esc(note)}</summary>'
                f"<pre>{esc(stream['text'])}</pre></details>"
            )
        out.append(
            f'<article class="attempt"><header><code>{esc(a["run_key"] or "(initial)")}</code> '
            f'attempt {esc(a["attempt"])} <span class="badge {ATTEMPT_CLASSES[a["status"]]}">'
            f"{esc(a['status'])}</span><small>on {esc(a['replica'])} · started "
            f"{esc(report.when(a['started_at']))} ({esc(report.relative(a['started_at'] - now))})"
            f" · took {esc(report.took(a['duration_s']))}{esc(exit_code)}</small></header>"
            f"{error}{''.join(streams)}</article>"
        )
    return (
        f"<h2>Attempts (newest first, {len(kept)})</h2>"
        f'<p class="note">What each attempt printed, as its record keeps it: the first 2 KiB '
        f"and last 16 KiB of each stream, redacted (also <code>pgcrond logs CODE</code>).</p>"
        f'<div class="attempts">{"".join(out)}</div>'
    )
