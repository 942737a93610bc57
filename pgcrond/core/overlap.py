"""Overlap policies: what a tick does while other ticks of its job still run.

A job says it with ``concurrency:`` (and ``max_concurrent:``); a manual run
or a backfill may override it for its own runs (``--concurrency``, read by
:func:`parse_concurrency`). The claim carries the job's :class:`Overlap`, and
the claim statement applies it under a per-job lock, by the database's count
of the job's live runs, so that it holds across replicas:

========== ===================== ==============================================
policy     runs at once          a tick that finds the bound reached
========== ===================== ==============================================
allow      ``max_concurrent``    SKIPPED/``overlap`` (no bound without it)
forbid     1                     SKIPPED/``overlap``
replace    1                     fences the running tick, which its owner stops
                                 and records SKIPPED/``replaced``; the new tick
                                 waits for that stop, then runs
buffer_one 1                     waits (FAIL/``waiting``, any replica starts it
                                 once the running tick ends); a tick that finds
                                 one waiting already is SKIPPED/``overlap``
========== ===================== ==============================================
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Literal, cast, get_args

Concurrency = Literal["forbid", "allow", "replace", "buffer_one"]
CONCURRENCY: tuple[str, ...] = get_args(Concurrency)


@dataclass(frozen=True, slots=True)
class Overlap:
    """One job's overlap policy, as a claim carries it to the database."""

    policy: Concurrency
    # How many ticks of the job may run at once across the cluster; None: any.
    limit: int | None

    @property
    def bounded(self) -> bool:
        """Whether the claim counts the job's running ticks (under the job's lock)."""
        return self.limit is not None


ALLOW = Overlap("allow", None)
FORBID = Overlap("forbid", 1)


@functools.cache
def overlap_of(concurrency: Concurrency, max_concurrent: int | None) -> Overlap:
    """The policy a job's ``concurrency`` and ``max_concurrent`` fields say.

    One object per policy, not one per job (a replica holds every job's).
    """
    if concurrency == "allow":
        return Overlap("allow", max_concurrent)
    return Overlap(concurrency, 1)


def parse_concurrency(text: str) -> tuple[Concurrency, int | None]:
    """An override's text -> (concurrency, max_concurrent); ValueError says what is wrong.

    ``forbid``, ``allow``, ``replace``, ``buffer_one``, or a whole number N
    (``allow`` with at most N at once).
    """
    value = text.strip()
    if value in CONCURRENCY:
        return cast(Concurrency, value), None
    if value.isdigit() and int(value) >= 1:
        return "allow", int(value)
    raise ValueError(
        f"{text!r} is not one of: {', '.join(CONCURRENCY)}, or a whole number N "
        "(at most N runs at once)"
    )
