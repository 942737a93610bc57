"""The page's HTML: Jinja2 templates (``templates/``), autoescaped, and the filters they use.

Every value a template prints is escaped unless it is a macro's own markup;
no HTML is assembled in Python. The filters turn instants and durations into
the spellings ``pgcrond status`` prints (ISO-8601 UTC) and a job's zone's.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from functools import lru_cache
from typing import Any
from zoneinfo import ZoneInfo

from jinja2 import Environment, PackageLoader, StrictUndefined, select_autoescape

from pgcrond import report
from pgcrond.daemon.page.routes import job_path

# Outcome -> CSS class of a strip cell, a badge and a chart bar.
OUTCOME_CLASSES = {
    "SUCCESS": "ok",
    "FAIL": "fail",
    "SKIPPED": "skip",
    "MISSED": "miss",
    "RUNNING": "run",
    "NO_ROW": "miss",
}
ERROR_WIDTH = 120


def _relative(value: datetime) -> str:
    return report.relative(value - datetime.now(UTC))


def _local(value: datetime, zone: str) -> str:
    return value.astimezone(ZoneInfo(zone)).strftime("%Y-%m-%d %H:%M:%S %Z")


def _took(value: float | timedelta | None) -> str:
    if isinstance(value, timedelta):
        value = value.total_seconds()
    return report.took(value)


@lru_cache(maxsize=1)
def environment() -> Environment:
    """The one environment: templates from the package, loaded and compiled once."""
    env = Environment(
        loader=PackageLoader("pgcrond.daemon.page", "templates"),
        # .html and .svg: everything the page renders is escaped.
        autoescape=select_autoescape(["html", "svg"]),
        undefined=StrictUndefined,
        trim_blocks=True,
        lstrip_blocks=True,
        auto_reload=False,
    )
    env.filters.update(
        iso=report.iso,
        when=report.when,
        relative=_relative,
        local=_local,
        took=_took,
        first_line=lambda text: report.first_line(text, ERROR_WIDTH),
        job_path=job_path,
        outcome_class=lambda status: OUTCOME_CLASSES.get(status, "other"),
    )
    return env


def render(template: str, context: dict[str, Any]) -> str:
    return environment().get_template(template).render(context)
