"""Ticks accounted for: the newest recorded tick per job, MISSED rows, per-job truth.

A starting (or reconnecting) replica asks :func:`last_ticks` where each job's
record ends, computes the expected ticks after it (:mod:`pgcrond.catchup`)
and records those no replica ran with :func:`record_missed`. Recording is
idempotent (a tick with a row is left alone), so a race between replicas, or
with a live claim, never overwrites a run.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from pgcrond.core.keys import Identity
from pgcrond.core.schedule import run_key_for, tick_of
from pgcrond.core.timing import to_ms
from pgcrond.storage.leases import LeaseStore, storable

# Why a tick is MISSED, as stored in the row's reason (the CHECK of migration 2).
MISSED_REASONS = ("no_replica", "database_unavailable", "late")
# A tick on a day of one of its job's calendars is recorded SKIPPED/calendar:<name>.
CALENDAR_PREFIX = "calendar:"


@dataclass(frozen=True)
class Miss:
    """A tick to record without a run: MISSED (no replica could run it within its
    misfire_grace), or SKIPPED when its reason is ``calendar:<name>`` (a calendar's day)."""

    code: str
    tick: datetime
    reason: str
    why: str
    # The job's misfire_grace: the row is written only once tick + grace is
    # past by the database's clock.
    grace: timedelta

    @property
    def identity(self) -> Identity:
        return Identity.schedule(self.code, run_key_for(self.tick))

    @property
    def status(self) -> str:
        return "SKIPPED" if self.reason.startswith(CALENDAR_PREFIX) else "MISSED"


async def database_now(store: LeaseStore) -> datetime:
    """The database's clock (a replica's own may be skewed)."""
    row = await store.db.fetchone(store.queries.get("database_now"))
    assert row is not None  # one row, always
    now: datetime = row["now"]
    return now


@dataclass(frozen=True)
class RecordEnds:
    """Where each job's record ends (None: no row), and the database's clock then."""

    last: dict[str, datetime | None]
    db_now: datetime


async def last_ticks(
    store: LeaseStore,
    codes: list[str],
    *,
    within: timedelta,
    before: datetime | None = None,
) -> RecordEnds:
    """The newest tick with a row of each job, claimed within ``within``, and the database's now.

    ``before`` (the database's clock) leaves out rows claimed from then on:
    a starting replica passes the moment it started, so the ticks it and its
    peers claimed since cannot hide the gap left while no replica ran.
    """
    rows = await store.db.fetchall(
        store.queries.get("last_ticks"),
        {"codes": codes, "within_ms": to_ms(within), "before": before},
    )
    found: dict[str, datetime | None] = {code: None for code in codes}
    for row in rows:
        if row["last_run_key"] is not None:
            found[row["code"]] = tick_of(row["last_run_key"])
    return RecordEnds(found, rows[0]["db_now"])


@dataclass(frozen=True)
class Holder:
    """A live lease of a code: whose, and how long until it could lapse."""

    owner: str
    remaining: timedelta


async def running_scan(store: LeaseStore, code: str) -> Holder | None:
    """The live lease of any tick of ``code`` (by the database's clock), or None."""
    row = await store.db.fetchone(store.queries.get("running_scan"), {"code": code})
    return None if row is None else Holder(row["owner"], row["remaining"])


async def record_missed(store: LeaseStore, misses: list[Miss]) -> list[Miss]:
    """Record ``misses`` (MISSED, or SKIPPED) in one statement; the ones that had no row until now.

    A tick still inside its misfire_grace by the database's clock is not
    recorded (nor returned), whatever the caller's clock said.
    """
    if not misses:
        return []
    for miss in misses:
        if miss.status == "MISSED" and miss.reason not in MISSED_REASONS:
            raise ValueError(f"not a reason for MISSED: {miss.reason!r}")
    rows = await store.db.fetchall(
        store.queries.get("record_missed"),
        {
            "lock_keys": [m.identity.idempotency_key for m in misses],
            "codes": [m.code for m in misses],
            "run_keys": [m.identity.run_key for m in misses],
            "fire_times": [m.tick for m in misses],
            "grace_ms": [to_ms(m.grace) for m in misses],
            "statuses": [m.status for m in misses],
            "reasons": [m.reason for m in misses],
            # A calendar's day has no text: its reason says it, as its claim records it.
            "errors": [storable(m.why) if m.why else None for m in misses],
            "owner": store.owner,
        },
    )
    recorded = {(row["code"], row["run_key"]) for row in rows}
    return [m for m in misses if (m.code, m.identity.run_key) in recorded]


async def job_ticks(
    store: LeaseStore, codes: list[str], *, misses_within: timedelta = timedelta(hours=24)
) -> list[dict[str, Any]]:
    """Per job, in order: last tick, last success and failure, failures since, recent misses."""
    return list(
        await store.db.fetchall(
            store.queries.get("job_ticks"),
            {"codes": codes, "misses_within_ms": to_ms(misses_within)},
        )
    )
