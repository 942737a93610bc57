"""The duration chart of a job's page: its geometry, drawn by ``templates/chart.svg``.

The page runs no script, so the server lays the bars out; the template writes them.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

CHART_W, CHART_H = 720, 200
CHART_LEFT, CHART_BOTTOM, CHART_TOP = 56, 28, 12


@dataclass(frozen=True)
class Bar:
    row: dict[str, Any]
    seconds: float
    x: float
    y: float
    height: float


@dataclass(frozen=True)
class Grid:
    y: float
    seconds: float


@dataclass(frozen=True)
class Chart:
    bars: list[Bar]
    grid: list[Grid]
    top: float
    bar_width: float
    last_x: float
    width: int = CHART_W
    height: int = CHART_H
    left: int = CHART_LEFT
    right: int = CHART_W - 8
    baseline: int = CHART_H - 8


def duration_chart(rows: list[dict[str, Any]], now: datetime) -> Chart | None:
    """A bar per run (oldest left), its height the run's duration; None without one.

    A running row's bar is its time so far; a row without a run (SKIPPED) has no bar.
    """
    runs: list[tuple[dict[str, Any], float]] = []
    for row in reversed(rows):
        if row["status"] == "RUNNING":
            runs.append((row, max(0.0, (now - row["acquired_at"]).total_seconds())))
        elif row["duration_s"] is not None and row["status"] not in ("SKIPPED", "MISSED"):
            runs.append((row, float(row["duration_s"])))
    if not runs:
        return None
    top = _nice_ceiling(max(seconds for _, seconds in runs))
    plot_w = CHART_W - CHART_LEFT - 8
    plot_h = CHART_H - CHART_BOTTOM - CHART_TOP
    # At least 20 slots: a handful of runs draws narrow bars from the left, not slabs.
    step = plot_w / max(len(runs), 20)
    width = max(1.0, step * 0.8)
    grid = [
        Grid(CHART_TOP + plot_h * (1 - fraction), top * fraction) for fraction in (0.0, 0.5, 1.0)
    ]
    bars = []
    for index, (row, seconds) in enumerate(runs):
        height = max(1.5, plot_h * seconds / top) if top else 1.5
        x = CHART_LEFT + index * step + (step - width) / 2
        bars.append(Bar(row, seconds, x, CHART_TOP + plot_h - height, height))
    last_x = max(CHART_LEFT + len(runs) * step, CHART_LEFT + 300)
    return Chart(bars, grid, top, width, last_x)


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
