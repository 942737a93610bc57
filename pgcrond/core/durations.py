"""Durations as people write them in YAML: ``90s``, ``15m``, ``1h30m``, ``500ms``.

Every duration names its unit. A bare number used to mean milliseconds (the
reference design's unit), so ``timeout: 90`` stopped a job after 90 ms when
its author meant 90 seconds; it is now refused with both readings offered.
Only ``0`` may go without a unit: it means the same in every unit.
"""

from __future__ import annotations

import re
from datetime import timedelta

_UNITS = {
    "ms": timedelta(milliseconds=1),
    "s": timedelta(seconds=1),
    "m": timedelta(minutes=1),
    "h": timedelta(hours=1),
    "d": timedelta(days=1),
}
# "ms" must be tried before "m", or "500ms" would read as 500 minutes and a stray "s".
_PART = re.compile(r"\s*(\d+(?:\.\d+)?)\s*(ms|s|m|h|d)")
_HINT = "write a number with a unit: 500ms, 90s, 15m, 2h, 1d, 1h30m"
# timedelta's own bound: 999999999 days.
MAX_DURATION = timedelta.max


def parse_duration(value: object) -> timedelta:
    """Read a duration; raise ``ValueError`` saying what is allowed."""
    if isinstance(value, timedelta):
        if value < timedelta(0):
            raise ValueError(f"must not be negative, got {value}")
        return value
    # bool is an int subclass: `timeout: yes` must not silently mean 1 ms.
    if isinstance(value, bool) or not isinstance(value, int | str):
        raise ValueError(f"expected a duration, got {_kind(value)}; {_HINT}")
    if isinstance(value, int):
        if value < 0:
            raise ValueError(f"must not be negative, got {value}")
        return _bare(str(value) if value < 10**30 else "1")
    text = value.strip()
    if text.isdigit():
        return _bare(text if len(text) < 30 else "1")
    if text.startswith("-"):
        raise ValueError(f"must not be negative, got {_shown(value)}")
    total = timedelta(0)
    position = 0
    seen: set[str] = set()
    while position < len(text):
        match = _PART.match(text, position)
        if match is None:
            raise ValueError(f"cannot read {_shown(value)} as a duration; {_HINT}")
        number, unit = match.groups()
        if unit in seen:
            raise ValueError(f"unit {unit!r} appears twice in {_shown(value)}")
        seen.add(unit)
        try:
            total += float(number) * _UNITS[unit]
        except (OverflowError, ValueError):
            # float * timedelta past timedelta.max, or an infinite float.
            raise ValueError(f"{_shown(value)} is too long; at most {MAX_DURATION.days}d") from None
        position = match.end()
    if not seen:
        raise ValueError(f"cannot read {_shown(value)} as a duration; {_HINT}")
    return total


def _shown(text: str) -> str:
    return repr(text) if len(text) <= 40 else repr(text[:37] + "...")


def _bare(digits: str) -> timedelta:
    """A number without a unit: only zero, which means the same in every unit."""
    if digits.strip("0") == "":
        return timedelta(0)
    raise ValueError(
        f"{digits} has no unit; write {digits}s for seconds or {digits}ms for milliseconds "
        "(a bare number no longer means milliseconds)"
    )


def format_duration(value: timedelta) -> str:
    """The shortest exact spelling, for `check` output and messages: ``1h30m``, ``500ms``."""
    ms = round(value.total_seconds() * 1000)
    if ms == 0:
        return "0s"
    parts = []
    for unit, size in (("d", 86_400_000), ("h", 3_600_000), ("m", 60_000), ("s", 1000)):
        count, ms = divmod(ms, size)
        if count:
            parts.append(f"{count}{unit}")
    if ms:
        parts.append(f"{ms}ms")
    return "".join(parts)


def _kind(value: object) -> str:
    if isinstance(value, bool):
        return f"a boolean ({str(value).lower()})"
    if isinstance(value, float):
        return f"a decimal number ({value})"
    if value is None:
        return "nothing (null)"
    return f"a {type(value).__name__}"
