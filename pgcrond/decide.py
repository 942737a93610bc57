"""The fire's decisions as a table: (answer, fire state) -> the next step. Pure, no I/O.

A fire (:mod:`pgcrond.fire`) claims its identity, and whatever comes back is
looked up here: a won claim (``Held``), a refusal (``Refused``, by its
reason), no answer at all (``None``: the database stayed unreachable, or the
replica stops), or what a run came to (:class:`Ran`). The answer is the row's
key; the :class:`State` is what the fire knows besides it. The row gives one
:class:`Step`, which the fire carries out (claim again, run, log, tell the
events) and then comes back with the next answer:

========== ==================================================================
step       what the fire does
========== ==================================================================
run        runs the won claim, as the config in force defines the job
release    gives a won claim back unstarted (the replica halted, the job gone)
follow     claims again after ``wait`` (on the wheel); ``started``: the tick
           started, so from now on no misfire bound
resume     waits for ``pgcrond resume``, then claims again (no misfire bound)
miss       the tick is missed (``cause``; ``recorded``: the guard stored it)
skip       the tick is not run on purpose (``cause``: paused, overlap, the
           fire's own ``calendar:<name>``; ``recorded``: the guard stored it)
done       the fire ends with ``outcome``
========== ==================================================================

Every step carries ``outcome``: what this replica did with the tick so far
(what the fire returns once it ends), and ``lost``: this answer is the tick's
first lost claim here (the fire tells ``claim_lost``).

**Adding a row.** A new refusal reason (a guard answers it; add it to
``RefusalReason`` in ``guard/base.py``) gets a function ``(Refused, State) ->
Step`` here, registered in :data:`ROWS` under the reason; a new branch of an
existing reason is an ``if`` in its function. What the row needs to know of
the job is on ``state.job`` (the config in force when the fire claimed).
Every branch gets a test in ``tests/test_decide.py``: ``scripts/test`` holds
this module to 100 % of its branches with that file alone.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from datetime import timedelta
from typing import Literal

from pgcrond.config.models import JobConfig
from pgcrond.guard.base import Held, Refused

# What one fire came to on this replica. "lose": its claim lost (another replica
# runs or ran the tick); "lease_lost": it won, but lost the lease while running;
# "crashed": an unexpected error ended it (logged as fire_crashed).
FireOutcome = Literal[
    "success", "fail", "timeout", "cancelled", "lease_lost", "lose", "skip", "misfire", "crashed"
]
StepKind = Literal["run", "release", "follow", "resume", "miss", "skip", "done"]

# Re-check a held lease (claim, or look at, it again) a little after it could
# have expired, so the holder's last heartbeat and clock jitter do not make
# the check land just before it.
FOLLOW_MARGIN = timedelta(milliseconds=100)
# How often a retry that a newer running tick of its forbid job blocks is
# claimed again (at most; a shorter lease, sooner): the run it waits for ends,
# or its owner's lease lapses, within a lease.
BLOCKED_RETRY_RECHECK = timedelta(seconds=10)
# How often a tick that its overlap policy keeps waiting (buffer_one, replace)
# is claimed again: it starts within this of the running tick's end (or of
# the replaced run's stop), at one claim a second per waiting tick and replica.
WAITING_RECHECK = timedelta(seconds=1)


@dataclass(frozen=True, slots=True)
class Ran:
    """What a run of a won claim came to: its outcome, and whether a retry follows."""

    outcome: FireOutcome
    retry: bool


@dataclass(frozen=True, slots=True)
class State:
    """What a fire knows besides the answer."""

    job: JobConfig
    # What this replica did with the tick so far; None: nothing yet.
    outcome: FireOutcome | None = None
    # False: end at the first lost claim instead of following the tick (`pgcrond trigger`).
    follow: bool = True
    # The replica stops (no new claim) / its grace is over (no run starts).
    stopping: bool = False
    halted: bool = False
    # Whether the config in force still has the job (a reload may remove it).
    in_force: bool = True
    # The fire's own reason not to run the tick (calendar:<name>), or None.
    skip_reason: str | None = None


@dataclass(frozen=True, slots=True)
class Step:
    """What the fire does next (see the module docstring)."""

    kind: StepKind
    outcome: FireOutcome | None = None
    wait: timedelta = timedelta(0)
    started: bool = False
    cause: str | None = None
    recorded: bool = False
    lost: bool = False


Answer = Held | Refused | Ran | None


def decide(answer: Answer, state: State) -> Step:
    """The next step of a fire that got ``answer`` in ``state``."""
    if answer is None:
        return _no_answer(state)
    if isinstance(answer, Held):
        return _won(state)
    if isinstance(answer, Ran):
        return _ran(answer, state)
    return ROWS[answer.reason](answer, state)


def _no_answer(state: State) -> Step:
    if state.stopping:
        # No claim got through before the stop: the tick is the live
        # replicas' to run, or to record missed, not this one's to call missed.
        return Step("done", state.outcome or "lose")
    if state.skip_reason is not None:
        # A tick that never runs is no miss: the outage leaves it unrecorded.
        return Step("skip", "skip", cause=state.skip_reason)
    # Still unreachable at the end of the misfire window, which only a tick's
    # first start has (a tick this replica ran or follows has none).
    return Step("miss", "misfire", cause="database_unavailable")


def _won(state: State) -> Step:
    # Won, maybe ahead of the tick, and the tick has come: it runs as the
    # config in force says, and never once the replica is halted.
    if state.halted:
        return Step("release", state.outcome or "lose", cause="stopping")
    if not state.in_force:
        return Step("release", state.outcome or "skip", cause="job_removed")
    return Step("run", state.outcome)


def _ran(ran: Ran, state: State) -> Step:
    if ran.retry or ran.outcome == "lease_lost":
        # The tick started: followed until it is done (the retry, a takeover,
        # a give-back); the next claim says how long until then.
        return Step("follow", ran.outcome, started=True)
    return Step("done", ran.outcome)


def _not_due(refused: Refused, state: State) -> Step:
    # This replica's clock runs ahead of the database's, or a claim made
    # ahead of the tick is to be judged at the tick (an overlap, a pause).
    return Step("follow", state.outcome, wait=refused.wait or timedelta(0))


def _missed(refused: Refused, state: State) -> Step:
    if state.outcome is not None:
        return Step("done", state.outcome)
    # A guard with history stored the tick (MISSED/late or /coalesced, or FAIL/late).
    recorded = refused.status is not None
    return Step("miss", "misfire", cause=refused.reason, recorded=recorded)


def _paused(refused: Refused, state: State) -> Step:
    if state.follow and refused.status != "SKIPPED" and not state.job.suspended:
        # A started tick (a takeover or retry due) or a run-once job: it waits
        # for `pgcrond resume`, not for a replica's restart. (A new tick was
        # recorded SKIPPED; a YAML suspension ends with a reload, which fires
        # run-once jobs again.)
        return Step("resume", state.outcome, started=True)
    return Step("skip", state.outcome or "skip", cause="paused")


def _overlap(refused: Refused, state: State) -> Step:
    if refused.status == "FAIL":
        # A started tick's retry (or a claim given back), due while a newer
        # tick of this forbid job runs: it waits for that run to end, not
        # dropped (no replica would ever claim it again).
        wait = min(state.job.timing.lease, BLOCKED_RETRY_RECHECK)
        return Step("follow", state.outcome, wait=wait, started=True)
    return Step("skip", state.outcome or "skip", cause="overlap")


def _waiting(refused: Refused, state: State) -> Step:
    # Fired in time and written down as waiting: its policy, not a replica,
    # made it wait, so no misfire bound; whichever follower claims first
    # once the job's slot is free starts it.
    return Step("follow", state.outcome, wait=WAITING_RECHECK, started=True)


def _skipped(refused: Refused, state: State) -> Step:
    # The fire's own reason (a calendar's day): never run, never missed, however late.
    recorded = refused.status is not None
    return Step("skip", "skip", cause=refused.cause or state.skip_reason, recorded=recorded)


def _lost(refused: Refused, state: State) -> Step:
    """Another replica has the tick (held, a retry pending) or had it (done, failed)."""
    lost = state.outcome is None
    outcome = state.outcome or "lose"
    if refused.reason not in ("held", "retry_pending") or refused.wait is None:
        return Step("done", outcome, lost=lost)
    if (
        refused.reason == "retry_pending"
        and refused.identity.type == "INITIAL"
        and (refused.attempt or 0) > state.job.retries
    ):
        # Out of retries for this start: the next start of a replica tries the
        # run-once job again, not every follower now.
        return Step("done", outcome, lost=lost)
    if outcome == "lose" and not state.follow:
        # `pgcrond trigger` follows only its own retries: a tick it lost is the daemons'.
        return Step("done", outcome, lost=lost)
    # Some replica started the tick: followed until it is done, with no
    # misfire bound (its window bounded its first start only).
    return Step("follow", outcome, wait=refused.wait + FOLLOW_MARGIN, started=True, lost=lost)


# The refusal rows, by the refusal's reason (see "Adding a row" above).
ROWS: dict[str, Callable[[Refused, State], Step]] = {
    "not_due": _not_due,
    "late": _missed,
    "coalesced": _missed,
    "paused": _paused,
    "skipped": _skipped,
    "overlap": _overlap,
    "waiting": _waiting,
    "held": _lost,
    "retry_pending": _lost,
    "done": _lost,
    "failed": _lost,
}
