"""What a backfill does with each tick of its range: pure, the rows passed in.

A backfill runs a job's scheduled ticks over a past range again, each under
its own identity and run key, so that what succeeded is not run twice. Each
tick of the range (:func:`ticks_in`, walked by the job's own schedule, the
calendar days it skips included and marked) becomes a :class:`Planned`:
run or skip, and why. It runs when nothing ran it to an end worth keeping:
no record, MISSED, or a final FAIL. It is skipped when it SUCCEEDED, runs
now, has a retry pending (it runs by itself), was SKIPPED on purpose
(overlap, pause, suspension: a decision, not a failure), falls on a
calendar's day, or is requested already.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Protocol

from pgcrond.core.schedule import Schedule, run_key_for

# At most this many ticks per backfill: a per-second job over a week is
# 600,000 requests; a range that long is narrowed, or split.
MAX_TICKS = 10_000


class Row(Protocol):
    """What a tick has, as :func:`plan` reads it (``storage.backfills.TickRow``)."""

    @property
    def status(self) -> str | None: ...
    @property
    def reason(self) -> str | None: ...
    @property
    def owner(self) -> str | None: ...
    @property
    def retry_pending(self) -> bool: ...
    @property
    def pending_by(self) -> str | None: ...


@dataclass(frozen=True)
class Planned:
    """One tick of the range: whether the backfill runs it, and why."""

    tick: datetime
    run: bool
    why: str
    # The calendar whose day it falls on (never run), if any.
    calendar: str | None = None

    @property
    def run_key(self) -> str:
        return run_key_for(self.tick)


def ticks_in(
    schedule: Schedule, start: datetime, end: datetime
) -> list[tuple[datetime, str | None]]:
    """The ticks in [start, end], oldest first, each with the calendar that skips it (or None).

    Raises ValueError past :data:`MAX_TICKS`.
    """
    found: list[tuple[datetime, str | None]] = []
    # Ticks are whole seconds and occasion_after is strictly after: a tick at
    # ``start`` itself is in the range.
    occasion = schedule.occasion_after(start - timedelta(seconds=1))
    while occasion is not None and occasion.tick <= end:
        if len(found) == MAX_TICKS:
            raise ValueError(
                f"the range holds more than {MAX_TICKS} ticks: narrow it, or split it in several "
                "backfills"
            )
        found.append((occasion.tick, occasion.skipped_by))
        occasion = schedule.occasion_after(occasion.tick)
    return found


def plan(ticks: list[tuple[datetime, str | None]], rows: dict[str, Row]) -> list[Planned]:
    """Each tick with what the backfill does with it, by the rows read for it."""
    return [_planned(tick, calendar, rows.get(run_key_for(tick))) for tick, calendar in ticks]


def _planned(tick: datetime, calendar: str | None, row: Row | None) -> Planned:
    if calendar is not None:
        return Planned(tick, False, f"calendar:{calendar}: the schedule skips this day", calendar)
    if row is not None and row.pending_by is not None:
        return Planned(tick, False, f"requested already by {row.pending_by}, not run yet")
    status = None if row is None else row.status
    if row is None or status is None:
        return Planned(tick, True, "no record: no replica ran it")
    state = status + (f"/{row.reason}" if row.reason else "")
    if status == "MISSED":
        return Planned(tick, True, f"{state}: it never ran")
    if status == "FAIL" and not row.retry_pending:
        return Planned(tick, True, f"{state}: it failed for good")
    if status == "SUCCESS":
        return Planned(tick, False, f"SUCCESS on {row.owner}: it ran")
    if status == "RUNNING":
        return Planned(tick, False, f"RUNNING on {row.owner}: it runs now")
    if status == "FAIL":
        return Planned(tick, False, f"{state}: a retry is pending, it runs by itself")
    return Planned(tick, False, f"{state}: skipped on purpose, not run again")
