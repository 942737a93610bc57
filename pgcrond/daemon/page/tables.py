"""The page's tables: jobs, running rows, replicas, a job's ticks and its requested runs."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from pgcrond import report
from pgcrond.config.models import JobConfig
from pgcrond.daemon.page.html import esc, outcome_badge, strip_html, time_html
from pgcrond.daemon.page.routes import PREFIX, job_path
from pgcrond.storage import registry

ERROR_WIDTH = 120


def jobs_table(entries: list[dict[str, Any]], jobs: list[JobConfig], now: datetime) -> str:
    if not entries:
        return '<p class="empty">This replica\'s config has no jobs.</p>'
    rows = "".join(_job_row(entry, now) for entry in entries)
    return (
        '<div class="scroll"><table class="jobs cards-on-phone"><thead><tr>'
        "<th>Job</th><th>Schedule</th><th>Next fire</th><th>Last success</th>"
        "<th>Last failure</th><th>Recent ticks (oldest → newest)</th><th>Fails</th>"
        f"</tr></thead><tbody>{rows}</tbody></table></div>"
    )


def _job_row(entry: dict[str, Any], now: datetime) -> str:
    code = entry["job"]
    description = entry["description"]
    desc_html = f'<small class="desc">{esc(description)}</small>' if description else ""
    if entry["runs_at_start"]:
        next_html = '<span class="none">at the next start</span>'
    elif entry["next_fires"]:
        fire = entry["next_fires"][0]
        next_html = f'{time_html(fire["at"], now)}<small class="local">{esc(fire["local"])}</small>'
    else:
        next_html = '<span class="none">never</span>'
    ok = entry["last_success"]
    ok_html = (
        f"{time_html(ok['finished_at'], now)}<small>on {esc(ok['owner'])}</small>"
        if ok
        else '<span class="none">none recently</span>'
    )
    bad = entry["last_failure"]
    bad_html = '<span class="none">none recently</span>'
    if bad:
        bad_html = (
            f"{time_html(bad['finished_at'] or bad['acquired_at'], now)}"
            f"{outcome_badge('FAIL', bad['reason'])}"
            f'<small class="err">{esc(report.first_line(bad["error"], ERROR_WIDTH))}</small>'
        )
    fails = entry["consecutive_failures"]
    paused = entry.get("paused")
    paused_html = ""
    if paused is not None:
        why = paused.get("detail") or f"by {paused['by']}" + (
            f": {paused['reason']}" if paused.get("reason") else ""
        )
        paused_html = f'<small class="paused">paused — {esc(why)}</small>'
    if entry.get("stale"):
        paused_html += '<small class="stale">stale: no success within alert_after</small>'
    return (
        "<tr>"
        f'<td data-label="Job"><div><a class="code" href="{esc(job_path(code))}">{esc(code)}</a>'
        f"{desc_html}{paused_html}</div></td>"
        f'<td data-label="Schedule"><div>{esc(entry["schedule"])}'
        f'<small><span class="guard">{esc(entry["guard"])}</span></small></div></td>'
        f'<td data-label="Next fire"><div>{next_html}</div></td>'
        f'<td data-label="Last success"><div>{ok_html}</div></td>'
        f'<td data-label="Last failure"><div>{bad_html}</div></td>'
        f'<td data-label="Recent ticks"><div>{strip_html(entry["ticks"])}</div></td>'
        f'<td data-label="Fails" class="num{" bad" if fails else ""}"><div>{esc(fails)}</div></td>'
        "</tr>"
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


def running_table(running: list[dict[str, Any]], now: datetime) -> str:
    if not running:
        return '<p class="empty">Nothing is running.</p>'
    rows = "".join(
        "<tr>"
        f'<td data-label="Job"><div><a class="code" href="{esc(job_path(r["job"]))}">'
        f"{esc(r['job'])}</a></div></td>"
        f'<td data-label="Run key"><div><code>{esc(r["run_key"] or "(initial)")}</code></div></td>'
        f'<td data-label="Replica"><div>{esc(r["owner"])}</div></td>'
        f'<td data-label="Attempt" class="num"><div>{esc(r["attempt"])}</div></td>'
        f'<td data-label="Since"><div>{time_html(r["since"], now)}</div></td>'
        f'<td data-label="Lease expiry"><div>{time_html(r["expires_at"], now)}'
        + ('<span class="badge fail">STALE</span>' if r["stale"] else "")
        + "</div></td>"
        f'<td data-label="Fencing token" class="num"><div><code>{esc(r["fencing_token"])}'
        "</code></div></td>"
        "</tr>"
        for r in running
    )
    return (
        '<div class="scroll"><table class="cards-on-phone"><thead><tr><th>Job</th>'
        "<th>Run key</th><th>Replica</th><th>Attempt</th><th>Since</th><th>Lease expiry</th>"
        f"<th>Fencing token</th></tr></thead><tbody>{rows}</tbody></table></div>"
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


def replicas_table(replicas: list[dict[str, Any]], now: datetime) -> str:
    if not replicas:
        return '<p class="empty">No live replica in the registry.</p>'
    rows = "".join(
        "<tr>"
        f'<td data-label="Replica"><div>{esc(r["owner"])}'
        + (' <span class="badge run">this one</span>' if r["this_replica"] else "")
        + "</div></td>"
        f'<td data-label="Version"><div>{esc(r["version"])}</div></td>'
        f'<td data-label="Config" class="code"><div>'
        f"{esc(r['config_hash'][: report.CONFIG_HASH_SHOWN])}</div></td>"
        f'<td data-label="Last seen"><div>{time_html(r["last_seen"], now)}</div></td>'
        f'<td data-label="Running" class="num"><div>{esc(r["running"])}</div></td>'
        f'<td data-label="Runs" class="num"><div>{esc(r["runs"])}</div></td>'
        f'<td data-label="Failures" class="num{" bad" if r["failures"] else ""}"><div>'
        f"{esc(r['failures'])}</div></td>"
        "</tr>"
        for r in replicas
    )
    return (
        '<div class="scroll"><table class="cards-on-phone"><thead><tr><th>Replica</th>'
        "<th>Version</th><th>Config</th><th>Last seen</th><th>Running</th><th>Runs (finished)</th>"
        f"<th>Failures</th></tr></thead><tbody>{rows}</tbody></table></div>"
    )


def requests_table(asked: list[dict[str, Any]], now: datetime) -> str:
    if not asked:
        return ""
    rows = "".join(
        "<tr>"
        f'<td data-label="Run key"><div><code>{esc(r["run_key"])}</code></div></td>'
        f'<td data-label="Requested by"><div>{esc(r["requested_by"])}</div></td>'
        f'<td data-label="Requested"><div>{time_html(r["requested_at"], now)}</div></td>'
        f'<td data-label="Taken by"><div>{esc(r["taken_by"] or "–")}</div></td>'
        f'<td data-label="Outcome"><div>{esc(_request_state(r))}</div></td>'
        "</tr>"
        for r in asked
    )
    return (
        '<h2>Manual runs requested</h2><div class="scroll"><table class="requests cards-on-phone">'
        "<thead><tr><th>Run key</th><th>Requested by</th><th>Requested</th><th>Taken by</th>"
        f"<th>Outcome</th></tr></thead><tbody>{rows}</tbody></table></div>"
    )


def _request_state(asked: dict[str, Any]) -> str:
    if asked["outcome"]:
        return str(asked["outcome"])
    return "taken, running" if asked["taken_by"] else "pending: no replica took it yet"


def ticks_table(rows: list[dict[str, Any]], now: datetime) -> str:
    if not rows:
        return '<p class="empty">No ticks recorded yet.</p>'
    out = []
    for r in rows:
        error = r["error"]
        if error and ("\n" in error.strip() or len(error) > ERROR_WIDTH):
            error_html = (
                f"<details><summary>{esc(report.first_line(error, ERROR_WIDTH))}</summary>"
                f"<pre>{esc(error)}</pre></details>"
            )
        elif error:
            error_html = f'<span class="err">{esc(error)}</span>'
        else:
            error_html = '<span class="none">–</span>'
        stale = ' <span class="badge fail">STALE</span>' if r["stale"] else ""
        out.append(
            "<tr>"
            f'<td data-label="Run key"><div><code>{esc(r["run_key"] or "(initial)")}</code>'
            "</div></td>"
            f'<td data-label="Outcome"><div>{outcome_badge(r["status"], r["reason"])}{stale}'
            "</div></td>"
            f'<td data-label="Duration" class="num"><div>{esc(report.took(r["duration_s"]))}'
            "</div></td>"
            f'<td data-label="Replica"><div>{esc(r["owner"])}</div></td>'
            f'<td data-label="Attempt" class="num"><div>{esc(r["attempt"])}</div></td>'
            f'<td data-label="Claimed"><div>{time_html(r["acquired_at"], now)}</div></td>'
            f'<td data-label="Error"><div>{error_html}</div></td>'
            f'<td data-label="Idempotency key"><div><code class="key">{esc(r["idempotency_key"])}'
            "</code></div></td>"
            "</tr>"
        )
    return (
        '<div class="scroll"><table class="ticks cards-on-phone"><thead><tr><th>Run key</th>'
        "<th>Outcome</th><th>Duration</th><th>Replica</th><th>Attempt</th><th>Claimed</th>"
        f"<th>Error</th><th>Idempotency key</th></tr></thead><tbody>{''.join(out)}</tbody>"
        "</table></div>"
    )
