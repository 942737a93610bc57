"""The tick plan: what one schedule's tick becomes before any I/O. Pure, the clock passed in.

A schedule's tick is handed on to the jobs on it as :class:`Wave` s: the
fires due at one instant (the tick moved by each job's jitter), and when to
hand them on, by this replica's clock. Each fire carries its misfire window
(from its fire time) and its coalescing bound (``superseded_at``). A lease
job's wave is handed on ahead of its fire time by the tick's *lead*, so that
its claims (one statement a chunk, ``Guard.claim_many``) are answered by the
tick; the claim statement wins a tick at most :data:`CLAIM_AHEAD_MAX` early,
the guard holds each won run until the database's clock reaches its fire
time, and the lease counts from then, so a lead costs a run none of its
lease. An advisory job's wave is handed on at its fire time, and so is a
tick on a calendar's day (``skip_reason``): it is recorded SKIPPED, nothing
runs, and a claim ahead would only be judged again at the tick. Which replica a
fire prefers is asked when it is handed on (the live replicas may change
during the lead): :mod:`pgcrond.deferral`.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime, timedelta

from pgcrond import catchup
from pgcrond.config.models import JobConfig
from pgcrond.core.jitter import fire_time
from pgcrond.core.keys import Identity
from pgcrond.core.schedule import run_key_for
from pgcrond.fire import Fire

# How early the claim statement may win a tick; bounds every lead.
CLAIM_AHEAD_MAX = timedelta(seconds=2)
# The least lead of a tick: a claim's round trip on a loaded replica is
# 5-30 ms, so a tick's claims sent this early are answered by the tick.
CLAIM_AHEAD = timedelta(milliseconds=100)
# A tick's lead grows by this per job on its schedule: what handing on a fire
# and claiming it costs a loaded replica's loop, with room to spare (a
# 10,000-job tick: 1.6 s; its claims then all land before the tick).
LEAD_PER_JOB = timedelta(microseconds=150)


def lead_for(jobs: int, gap: timedelta | None) -> timedelta:
    """How long before a tick its ``jobs`` are handed on; ``gap``: to the schedule's next tick.

    Never more than half the gap: a per-second tick claimed before the one
    before it has run would find that one's forbid runs still going, and be
    claimed again at its time.
    """
    lead = min(CLAIM_AHEAD + jobs * LEAD_PER_JOB, CLAIM_AHEAD_MAX)
    return lead if gap is None else min(lead, max(gap / 2, CLAIM_AHEAD))


@dataclass(frozen=True, slots=True)
class Wave:
    """A tick's fires due at one instant, and when to hand them on (fire time less lead)."""

    hand_on: datetime
    fires: tuple[Fire, ...]


def plan_tick(
    jobs: Iterable[JobConfig],
    tick: datetime,
    following: datetime | None,
    skip_reason: str | None = None,
) -> list[Wave]:
    """The waves of ``tick`` (in UTC) of ``jobs``, earliest first.

    ``following``: the next tick that runs; ``skip_reason``: the tick is on a
    calendar's day (``calendar:<name>``), carried by each fire.
    """
    jobs = list(jobs)
    lead = lead_for(len(jobs), None if following is None else following - tick)
    run_key = run_key_for(tick)
    waves: dict[datetime, list[Fire]] = {}
    for job in jobs:
        # jitter: a stable shift of the fire time, the same on every replica;
        # misfire and lateness count from it, the run key stays the tick.
        at = fire_time(job.code, tick, job.jitter)
        ahead = lead if job.guard == "lease" and skip_reason is None else timedelta(0)
        fire = Fire(
            job,
            at,
            # Made as it is: a configured job's code passed the identity's own
            # rule at load (config.sources.code_problem), and the run key is a
            # tick's; checking both again cost a third of a 10,000-job plan.
            Identity("SCHEDULE", job.code, run_key),
            superseded_at=catchup.superseded_at(job, following),
            skip_reason=skip_reason,
        )
        waves.setdefault(at - ahead, []).append(fire)
    return [Wave(hand_on, tuple(fires)) for hand_on, fires in sorted(waves.items())]
