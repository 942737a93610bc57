"""What every schedule answers, and the run keys that name its ticks."""

from __future__ import annotations

import functools
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Protocol


@dataclass(frozen=True, slots=True)
class Occasion:
    """One tick, with how it came about: what `pgcrond next` and `plan` show for it."""

    tick: datetime  # aware UTC, whole seconds
    form: str  # the form that produced it: "cron '0 8 * * 1-5'", "every 1m30s", …
    # How a clock change made it, or None: "02:30 skipped by the clock change, shifted".
    dst: str | None = None
    # The calendar whose day it falls on: the tick does not run (calendar:<name>).
    skipped_by: str | None = None


class Schedule(Protocol):
    """When a job fires. Every implementation is immutable and clock-free.

    Its ``repr`` names its whole value: the daemon keeps one timer per distinct
    repr, so two schedules with equal reprs must have equal ticks.
    """

    def next_after(self, t: datetime) -> datetime | None:
        """The first tick strictly after the aware instant ``t`` that runs (aware UTC), or None."""
        ...

    def occasion_after(self, t: datetime) -> Occasion | None:
        """The first tick strictly after ``t``, those on a calendar's day included (marked)."""
        ...

    def describe(self) -> str:
        """A short English phrase for `pgcrond check` and `pgcrond next`."""
        ...

    def definition(self) -> dict[str, Any]:
        """The schedule as plain JSON data (the job's zone apart): what a replica registers."""
        ...


def run_key_for(tick: datetime) -> str:
    """The run key of a tick: its instant in UTC, ISO-8601, whole seconds."""
    if tick.tzinfo is None:
        raise ValueError("a tick must be an aware datetime")
    return tick.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def manual_run_key(now: datetime) -> str:
    """``manual:<UTC minute>``: a run asked for by hand, the same for askers in one minute."""
    return "manual:" + now.astimezone(UTC).strftime("%Y-%m-%dT%H:%MZ")


@functools.lru_cache(maxsize=4096)
def tick_of(run_key: str) -> datetime | None:
    """The tick a schedule run key names, or None for another run key (``manual:…``).

    Cached: the co-firing jobs of a tick share its run key, and every claim
    and record of each asks again.
    """
    try:
        return datetime.strptime(run_key, "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=UTC)
    except ValueError:
        return None


def utc_seconds(t: datetime) -> datetime:
    """An aware instant as a naive UTC datetime cut to the second (ticks are whole seconds)."""
    if t.tzinfo is None:
        raise ValueError("next_after needs an aware datetime")
    return t.astimezone(UTC).replace(microsecond=0, tzinfo=None)
