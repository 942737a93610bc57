"""A job's forms: drawn for a signed-in operator, and read back when posted.

Each form carries the CSRF token (:mod:`pgcrond.daemon.page.auth`); what a
POST may hold is bounded here, on both sides.
"""

from __future__ import annotations

from typing import Any
from urllib.parse import parse_qsl

from pgcrond import report
from pgcrond.config.models import JobConfig
from pgcrond.daemon.exchange import Request
from pgcrond.daemon.page import auth
from pgcrond.daemon.page.html import SignedIn, esc
from pgcrond.daemon.page.routes import job_path
from pgcrond.storage import jobstate

MAX_REASON = 500
# The form fields a POST may carry; more is not a form of this page.
MAX_FIELDS = 4


def action_forms(job: JobConfig, paused: dict[str, Any] | None, signed_in: SignedIn) -> str:
    """The forms of a job's page: pause (with a reason) or resume, and run now."""

    def form(action: str, fields: str, button: str) -> str:
        target = job_path(job.code, "/" + action)
        return (
            f'<form method="post" class="act {action}" action="{esc(target)}">'
            f'<input type="hidden" name="{auth.CSRF_FIELD}" value="{esc(signed_in.csrf)}">'
            f'{fields}<button type="submit">{esc(button)}</button></form>'
        )

    if paused is None:
        state = '<p class="state">Not paused: its ticks run.</p>'
        pause_form = form(
            "pause",
            '<label>Reason <input type="text" name="reason" maxlength="'
            f'{MAX_REASON}" placeholder="why, shown with every skip"></label>',
            "Pause",
        )
    elif paused["source"] == "config":
        state = (
            f'<p class="state paused">{esc(paused["detail"])}: remove it and reload the '
            "replicas to let the job run.</p>"
        )
        pause_form = ""
    else:
        why = f": {paused['reason']}" if paused.get("reason") else ""
        held = (
            f"Paused by {paused['by']} at {report.when(paused['at'])}{why}"
            if paused["code"] != jobstate.ALL_JOBS
            else f"Every job is paused by {paused['by']}{why} (pgcrond resume --all lifts it)"
        )
        state = f'<p class="state paused">{esc(held)}</p>'
        pause_form = form("resume", "", "Resume") if paused["code"] != jobstate.ALL_JOBS else ""
    run_form = form("run", "", "Run now")
    return (
        f'<section class="actions"><h2>Act on this job</h2>{state}'
        f'<div class="forms">{pause_form}{run_form}</div>'
        '<p class="note">Run now asks the replicas to run it once (as <code>pgcrond trigger '
        "--detach</code> does), under the run key <code>manual:&lt;UTC minute&gt;</code>.</p>"
        "</section>"
    )


def read_form(request: Request) -> dict[str, str] | None:
    """The fields of a form POST, or None when the body is not a small urlencoded form."""
    content_type = request.header("content-type").split(";", 1)[0].strip().lower()
    if content_type != "application/x-www-form-urlencoded":
        return None
    try:
        pairs = parse_qsl(
            request.body.decode("utf-8"),
            keep_blank_values=True,
            strict_parsing=bool(request.body),
            max_num_fields=MAX_FIELDS,
        )
    except (UnicodeDecodeError, ValueError):
        return None
    return dict(pairs)
