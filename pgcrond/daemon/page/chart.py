"""The duration chart of a job's page: SVG drawn by the server (the page runs no script)."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from pgcrond import report
from pgcrond.daemon.page.html import OUTCOME_CLASSES, esc

CHART_W, CHART_H = 720, 200
CHART_LEFT, CHART_BOTTOM, CHART_TOP = 56, 28, 12


def duration_chart(rows: list[dict[str, Any]], now: datetime) -> str:
    """An SVG bar per run (oldest left), its height the run's duration, coloured by outcome.

    A running row's bar is its time so far; a row without a run (SKIPPED) has no bar.
    """
    bars: list[tuple[dict[str, Any], float]] = []
    for row in reversed(rows):
        if row["status"] == "RUNNING":
            bars.append((row, max(0.0, (now - row["acquired_at"]).total_seconds())))
        elif row["duration_s"] is not None and row["status"] not in ("SKIPPED", "MISSED"):
            bars.append((row, float(row["duration_s"])))
    if not bars:
        return '<p class="empty">No finished runs to chart yet.</p>'
    top = _nice_ceiling(max(seconds for _, seconds in bars))
    plot_w = CHART_W - CHART_LEFT - 8
    plot_h = CHART_H - CHART_BOTTOM - CHART_TOP
    # At least 20 slots: a handful of runs draws narrow bars from the left, not slabs.
    step = plot_w / max(len(bars), 20)
    width = max(1.0, step * 0.8)
    parts = [
        f'<svg class="chart" viewBox="0 0 {CHART_W} {CHART_H}" role="img" '
        f'aria-label="Duration of the last {len(bars)} runs, up to {esc(report.took(top))}" '
        'xmlns="http://www.w3.org/2000/svg">'
    ]
    for fraction in (0.0, 0.5, 1.0):
        y = CHART_TOP + plot_h * (1 - fraction)
        parts.append(
            f'<line class="grid" x1="{CHART_LEFT}" x2="{CHART_W - 8}" y1="{y:.1f}" y2="{y:.1f}"/>'
            f'<text class="axis" x="{CHART_LEFT - 6}" y="{y + 4:.1f}" text-anchor="end">'
            f"{esc(report.took(top * fraction))}</text>"
        )
    for index, (row, seconds) in enumerate(bars):
        height = max(1.5, plot_h * seconds / top) if top else 1.5
        x = CHART_LEFT + index * step + (step - width) / 2
        y = CHART_TOP + plot_h - height
        css = OUTCOME_CLASSES.get(row["status"], "other")
        label = (
            f"{row['run_key'] or '(initial)'}: {row['status']}"
            + (f"/{row['reason']}" if row["reason"] else "")
            + f", {report.took(seconds)}, attempt {row['attempt']} on {row['owner']}"
        )
        parts.append(
            f'<rect class="bar {css}" x="{x:.1f}" y="{y:.1f}" width="{width:.1f}" '
            f'height="{height:.1f}"><title>{esc(label)}</title></rect>'
        )
    first, last = bars[0][0], bars[-1][0]
    baseline = CHART_H - 8
    last_x = CHART_LEFT + len(bars) * step
    parts.append(
        f'<text class="axis" x="{CHART_LEFT}" y="{baseline}">'
        f"{esc(first['run_key'] or '(initial)')}</text>"
    )
    if len(bars) > 1:
        parts.append(
            f'<text class="axis" x="{max(last_x, CHART_LEFT + 300):.1f}" y="{baseline}" '
            f'text-anchor="end">{esc(last["run_key"] or "(initial)")}</text>'
        )
    parts.append("</svg>")
    return "".join(parts)


def _nice_ceiling(value: float) -> float:
    """The smallest 1, 2 or 5 times a power of ten at or above ``value`` (0 stays 0)."""
    if value <= 0:
        return 0.0
    scale = 10 ** _floor_log10(value)
    for factor in (1, 2, 5, 10):
        if value <= factor * scale:
            return float(factor * scale)
    return float(10 * scale)


def _floor_log10(value: float) -> int:
    exponent = 0
    while value >= 10:
        value /= 10
        exponent += 1
    while value < 1:
        value *= 10
        exponent -= 1
    return exponent
