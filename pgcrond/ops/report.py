"""Rows for people and for programs: aligned text tables and JSON.

Every instant is shown in UTC with a ``Z``, the same spelling as run keys, so a
run key and the times next to it can be compared by eye.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime, timedelta
from typing import Any

from pgcrond.core.durations import format_duration

NONE = "-"


def iso(value: datetime | None, *, precise: bool = True) -> str | None:
    """``2026-03-29T03:00:12.345Z``; whole seconds when not ``precise`` (tables)."""
    if value is None:
        return None
    spec = "milliseconds" if precise else "seconds"
    return value.astimezone(UTC).isoformat(timespec=spec).replace("+00:00", "Z")


def when(value: datetime | None) -> str:
    return iso(value, precise=False) or NONE


def seconds(value: timedelta | None) -> float | None:
    return None if value is None else round(value.total_seconds(), 3)


def took(total: float | None) -> str:
    """A run's duration in seconds for a table: ``850ms``, ``12.3s``, ``4m5s``."""
    if total is None:
        return NONE
    if total < 1:
        return f"{round(total * 1000)}ms"
    if total < 60:
        return f"{total:.1f}s"
    return format_duration(timedelta(seconds=round(total)))


def relative(delta: timedelta) -> str:
    """``in 5h12m`` / ``3m ago``, to whole seconds (minutes beyond an hour)."""
    total = round(abs(delta.total_seconds()))
    if total >= 3600:
        total -= total % 60
    text = format_duration(timedelta(seconds=total))
    return f"in {text}" if delta >= timedelta(0) else f"{text} ago"


def first_line(text: str | None, width: int) -> str:
    """The first line of an error, cut to ``width`` characters with an ellipsis."""
    lines = (text or "").strip().splitlines()
    if not lines:
        return NONE
    line = lines[0]
    return line if len(line) <= width else line[: width - 1] + "…"


def table(headers: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    """Columns padded to their widest cell; the last column is not padded."""
    widths = [max(len(str(cell)) for cell in column) for column in zip(headers, *rows, strict=True)]
    lines = []
    for cells in (headers, *rows):
        padded = [cell.ljust(width) for cell, width in zip(cells, widths, strict=True)]
        lines.append("  ".join(padded).rstrip())
    return "\n".join(lines)


def to_json(value: Sequence[Mapping[str, Any]]) -> str:
    return json.dumps(value, indent=2, ensure_ascii=False, default=_json_default)


def _json_default(value: object) -> object:
    if isinstance(value, datetime):
        return iso(value)
    raise TypeError(f"{type(value).__name__} is not JSON serialisable")
