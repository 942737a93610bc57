"""What a fire tells the rest of the replica: the events protocol of :mod:`pgcrond.fire`.

The fire decides and records; what it decided is counted (metrics), accounted
for (MISSED rows, the outage window) and announced (hooks, pings, traces) by
subscribers of the daemon, which the fire layer must not import. A subscriber
overrides the events it cares about; every event here is a no-op.

The contract for every subscriber: called on the loop, in the fire's own
task (a tick's first claims, and the answers that end a fire, in the one
task that claims the tick's fires together: what an event names is what it
is about), so it returns at once (it may start a task of its own) and never
raises (an exception would end the fire; a subscriber catches its own).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from datetime import datetime
from typing import Any

from pgcrond.config.models import JobConfig
from pgcrond.core.keys import Identity
from pgcrond.core.outcome import RunResult
from pgcrond.core.trigger import TriggerKind
from pgcrond.guard.base import Held, Outcome


class FireEvents:
    """Every event of a fire, as a no-op: subscribe by overriding."""

    def fired(self, job: JobConfig) -> None:
        """This replica's timer went off for a tick of ``job`` (or a run was asked for)."""

    def first_start(
        self, job: JobConfig, identity: Identity, tick: datetime, preferred: Callable[[], bool]
    ) -> None:
        """This replica fires a tick's first start (no retry, takeover or catch-up);
        ``preferred()``: whether the tick prefers this replica (spread), or no replica
        (asked only by a subscriber that needs it: a hash per live replica)."""

    def claim_sent(self, job: JobConfig, identity: Identity) -> None:
        """A claim of ``identity`` goes out now (every try of it, through an outage too)."""

    def claim_won(self, job: JobConfig, held: Held) -> None:
        """This replica runs the attempt ``held`` (``held.claimed_from`` says how it came)."""

    def run_trigger(self, job: JobConfig, held: Held, trigger: TriggerKind) -> None:
        """The attempt ``held``, won here, runs as ``trigger`` (its ``PGCRON_TRIGGER``:
        schedule, manual, backfill, catch_up, retry, takeover); told after claim_won."""

    def claim_lost(self, job: JobConfig, reason: str) -> None:
        """Another replica runs or ran the tick; ``reason`` is the claim's answer."""

    def skipped(self, job: JobConfig, reason: str) -> None:
        """The tick is not run on purpose: ``paused``, ``overlap``, ``suspended``."""

    def paused(self, job: JobConfig, paused: bool) -> None:
        """A claim's answer said whether ``job`` is paused now."""

    def missed(
        self, job: JobConfig, identity: Identity, tick: datetime, cause: str, recorded: bool
    ) -> None:
        """No replica may run the tick any more: ``cause`` is late, coalesced or
        database_unavailable; ``recorded``: the guard already stored it (MISSED)."""

    def run_started(self, job: JobConfig, lateness_s: float) -> None:
        """An attempt starts here, ``lateness_s`` after its tick's fire time."""

    def run_finished(self, job: JobConfig, outcome: str, duration_s: float) -> None:
        """An attempt ended here: ``outcome`` is the runner's, or ``lease_lost``."""

    def recorded(self, job: JobConfig, kind: Outcome, final: bool) -> None:
        """The attempt's outcome is stored; ``final``: no retry time follows it."""

    def failed_for_good(self, job: JobConfig, held: Held, result: RunResult) -> None:
        """The attempt failed and no retry follows: the job's ``on_failure`` hooks."""

    def succeeded(self, job: JobConfig, held: Held, result: RunResult) -> None:
        """The attempt's SUCCESS is stored, by this replica: ``result`` is what it ran to."""

    def unrecorded(self, job: JobConfig, held: Held, reason: str) -> None:
        """The attempt ended here and this replica stores nothing of it: ``fenced`` (another
        replica took the tick over meanwhile), ``lease_lost``, ``not_recorded`` (the guard
        kept failing; the tick is taken over once its lease lapses)."""

    def missed_found(
        self, job: JobConfig, identity: Identity, tick: datetime, cause: str, why: str
    ) -> None:
        """This replica stored the tick MISSED after the fact: found at start or after an
        outage (``no_replica``, ``database_unavailable``), or late by its own clock."""

    def fire_done(self, job: JobConfig, identity: Identity, outcome: str) -> None:
        """This replica's fire of ``identity`` ended: ``outcome`` is what it came to here."""

    def database(self, operation: str, ok: bool) -> None:
        """A database call of ``operation`` (claim, finalize) got through, or did not."""


class FanOut(FireEvents):
    """Every event to each subscriber in turn, in the order given.

    Each event is bound once, here, to the subscribers that override it: a
    run tells a dozen events, most of which most subscribers leave alone, and
    an event added to :class:`FireEvents` reaches every subscriber with no
    change here.
    """

    def __init__(self, subscribers: Sequence[FireEvents]) -> None:
        for name in [name for name in vars(FireEvents) if not name.startswith("_")]:
            told = [
                getattr(subscriber, name)
                for subscriber in subscribers
                if getattr(type(subscriber), name) is not getattr(FireEvents, name)
            ]
            # An instance attribute, found before the class's no-op.
            if len(told) == 1:
                setattr(self, name, told[0])
            elif told:
                setattr(self, name, _fanned(tuple(told)))


def _fanned(told: tuple[Callable[..., None], ...]) -> Callable[..., None]:
    def fan(*args: Any, **kwargs: Any) -> None:
        for event in told:
            event(*args, **kwargs)

    return fan
