"""The page's HTML: the document around every view, and the pieces the views share.

Every job-provided string goes through :func:`esc`; the document loads nothing
from elsewhere and runs no script, and says so in its Content-Security-Policy.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime
from html import escape
from typing import Any

from pgcrond import report
from pgcrond.daemon.page.routes import PREFIX, STYLESHEET

# No script, no frame, nothing from elsewhere; the stylesheet and inline SVG
# are the page's only resources, and forms (shown to a signed-in operator
# only) post back here. In a <meta>, so the HTTP layer stays generic.
CSP = (
    "default-src 'none'; style-src 'self'; img-src 'self' data:; "
    "base-uri 'none'; form-action {forms}"
)
# Outcome -> CSS class of a strip cell and a chart bar.
OUTCOME_CLASSES = {
    "SUCCESS": "ok",
    "FAIL": "fail",
    "SKIPPED": "skip",
    "MISSED": "miss",
    "RUNNING": "run",
    "NO_ROW": "miss",
}


def esc(value: object) -> str:
    """Text and attribute values alike: ``<``, ``>``, ``&`` and both quotes escaped."""
    return escape("" if value is None else str(value), quote=True)


@dataclass(frozen=True)
class SignedIn:
    """The operator a page is drawn for, and the CSRF token its forms carry."""

    operator: str
    csrf: str


def document(
    title: str,
    body: str,
    json_path: str,
    took_ms: float,
    signed_in: SignedIn | None = None,
    *,
    replica: str,
    version: str,
) -> str:
    nav = "".join(
        f'<a href="{href}">{label}</a>'
        for href, label in (
            (PREFIX, "Jobs"),
            (f"{PREFIX}/running", "Running"),
            (f"{PREFIX}/replicas", "Replicas"),
        )
    )
    csp = CSP.format(forms="'none'" if signed_in is None else "'self'")
    who = (
        "Read-only."
        if signed_in is None
        else f"Signed in as <b>{esc(signed_in.operator)}</b>: actions are recorded under this name."
    )
    return (
        "<!doctype html>\n"
        '<html lang="en"><head><meta charset="utf-8">'
        '<meta name="viewport" content="width=device-width, initial-scale=1">'
        f'<meta http-equiv="Content-Security-Policy" content="{csp}">'
        '<meta name="referrer" content="no-referrer">'
        '<meta name="robots" content="noindex">'
        f"<title>{esc(title)} · pgcrond</title>"
        '<link rel="icon" href="data:,">'
        f'<link rel="stylesheet" href="{STYLESHEET}?v={esc(version)}">'
        "</head><body>"
        f'<header class="top"><a class="brand" href="{PREFIX}">pgcrond</a>'
        f'<nav>{nav}</nav><span class="who">answered by <b>{esc(replica)}</b>'
        f" · v{esc(version)}</span></header>"
        f"<main><h1>{esc(title)}</h1>{body}</main>"
        f'<footer>{who} <a href="{esc(json_path)}">This view as JSON</a> '
        "(or <code>Accept: application/json</code>). "
        f"Answered in {took_ms:.0f} ms at {esc(report.when(datetime.now(UTC)))}; "
        "reload to refresh.</footer>"
        "</body></html>\n"
    )


def time_html(value: datetime | None, now: datetime) -> str:
    """``<time>`` with the UTC instant and, beneath, how long ago / until."""
    if value is None:
        return '<span class="none">–</span>'
    return (
        f'<time datetime="{esc(report.iso(value))}">{esc(report.when(value))}</time>'
        f"<small>{esc(report.relative(value - now))}</small>"
    )


def outcome_badge(status: str, reason: str | None) -> str:
    css = OUTCOME_CLASSES.get(status, "other")
    label = "NO ROW" if status == "NO_ROW" else status
    text = label + (f"/{reason}" if reason and status != "NO_ROW" else "")
    return f'<span class="badge {css}">{esc(text)}</span>'


def card(label: str, value: str, href: str, css: str = "") -> str:
    return (
        f'<a class="card {css}" href="{esc(href)}"><b>{esc(value)}</b><span>{esc(label)}</span></a>'
    )


def legend() -> str:
    items = [
        ("ok", "success"),
        ("fail", "failed"),
        ("skip", "skipped"),
        ("miss", "missed / no row"),
        ("run", "running"),
    ]
    return (
        '<p class="legend">'
        + "".join(f'<span><i class="cell {css}"></i>{esc(label)}</span>' for css, label in items)
        + "</p>"
    )


def strip_html(cells: list[dict[str, Any]]) -> str:
    if not cells:
        return '<span class="none">no ticks yet</span>'
    out = []
    for cell in cells:
        status, reason = cell["status"], cell["reason"]
        if status == "NO_ROW":
            until = f" until {cell['until']}" if cell["until"] else " until now"
            title = f"{cell['run_key']}{until}: no replica ran these ticks (no row)"
        else:
            title = f"{cell['run_key'] or '(initial)'}: {status}" + (f"/{reason}" if reason else "")
        css = OUTCOME_CLASSES.get(status, "other")
        out.append(f'<i class="cell {css}" title="{esc(title)}"></i>')
    return f'<span class="strip">{"".join(out)}</span>'
