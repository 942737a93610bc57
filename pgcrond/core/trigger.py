"""Why a run runs: its trigger kind, handed to the job as ``PGCRON_TRIGGER``.

``schedule`` (its tick came), ``manual`` (``pgcrond trigger``), ``backfill``
(``pgcrond backfill``), ``catch_up`` (a missed tick run late by the job's
``catch_up`` policy), ``retry`` (a failed attempt claimed again) and
``takeover`` (a survivor reclaiming the tick of a replica that stopped
renewing its lease). A fire asks for its kind; the claim it wins says whether
the attempt is in fact a takeover or a retry (:func:`attempt_trigger`), and
the claim statement writes the same answer into the attempt record.
"""

from __future__ import annotations

from typing import Literal, get_args

TriggerKind = Literal["schedule", "manual", "backfill", "catch_up", "retry", "takeover"]
TRIGGER_KINDS: tuple[TriggerKind, ...] = get_args(TriggerKind)
# The kinds a fire asks for itself: a retry or a takeover is what a claim finds.
FIRE_KINDS: tuple[TriggerKind, ...] = ("schedule", "manual", "backfill", "catch_up")


def attempt_trigger(requested: TriggerKind, claimed_from: str | None) -> TriggerKind:
    """The kind of an attempt a claim asked as ``requested`` won from ``claimed_from``.

    ``claimed_from`` is the won row's own word: ``takeover`` (an expired
    RUNNING row), ``retry`` (a FAIL row due again) or None (a fresh row). A
    manual run or a backfill that reclaims a FAIL row runs as itself (a
    backfill files its ticks as FAIL rows due now); a tick's own fire, or a
    catch-up, that reclaims one is the retry of an earlier attempt. The claim
    statement (``claim`` in ``storage/sql/queries.sql``) writes the same rule.
    """
    if claimed_from == "takeover":
        return "takeover"
    if claimed_from == "retry" and requested in ("schedule", "catch_up"):
        return "retry"
    return requested
