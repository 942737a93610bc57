"""Schedule answers the page asks for on every request, kept while they hold."""

from __future__ import annotations

from datetime import datetime

from pgcrond.config.models import JobConfig
from pgcrond.core.schedule import Schedule, tick_of


class ScheduleMemo:
    """Schedule answers the page asks for on every request, kept while they hold.

    ``next_after`` is pure but not free (tens of microseconds); a thousand jobs
    asked afresh on every request would cost more than the page's queries.
    Entries are keyed by job code and dropped when the job's schedule object
    changes (a reload) or, for next fires, once the first has passed.
    """

    MAX_TICKS = 1 << 16

    def __init__(self) -> None:
        self._fires: dict[str, tuple[Schedule, list[datetime]]] = {}
        self._after: dict[tuple[str, str], tuple[Schedule, datetime | None]] = {}
        self._ticks: dict[str, datetime | None] = {}

    def next_fires(self, job: JobConfig, now: datetime, count: int) -> list[datetime]:
        cached = self._fires.get(job.code)
        fires = cached[1] if cached is not None and cached[0] is job.schedule else []
        fires = [fire for fire in fires if fire > now]
        after = fires[-1] if fires else now
        while len(fires) < count:
            fire = job.schedule.next_after(after)
            if fire is None:
                break
            fires.append(fire)
            after = fire
        self._fires[job.code] = (job.schedule, fires)
        return fires[:count]

    def tick(self, run_key: str | None) -> datetime | None:
        """The tick a run key names (None: a manual run or run-once), parsed once."""
        if run_key is None:
            return None
        if run_key not in self._ticks:
            if len(self._ticks) >= self.MAX_TICKS:
                self._ticks.clear()
            self._ticks[run_key] = tick_of(run_key)
        return self._ticks[run_key]

    def tick_after(self, job: JobConfig, run_key: str) -> datetime | None:
        """The tick after the one ``run_key`` names; None for a run key that is no tick."""
        cached = self._after.get((job.code, run_key))
        if cached is not None and cached[0] is job.schedule:
            return cached[1]
        tick = self.tick(run_key)
        after = None if tick is None else job.schedule.next_after(tick)
        if len(self._after) >= self.MAX_TICKS:
            self._after.clear()  # crude, and enough: it refills from the next request
        self._after[(job.code, run_key)] = (job.schedule, after)
        return after
