"""Wall-clock time and instants in one zone: offsets, transitions, the fold readings.

zoneinfo does not expose its transition table, so transitions are found by
probing and bisection; naive datetimes here are UTC instants unless named
``wall``.
"""

from __future__ import annotations

import functools
from datetime import UTC, datetime, timedelta
from zoneinfo import ZoneInfo

SECOND = timedelta(seconds=1)
# Longer than any DST gap or overlap on record (2 h for wartime double summer time).
LOOKBACK = timedelta(hours=3)
# How far apart the offset is probed for a transition: two changes closer than
# this (none on record in the IANA data since 1970) would be seen as one.
_PROBE = timedelta(hours=6)


def local_to_instant(wall: datetime, zone: ZoneInfo) -> datetime:
    """The instant a wall-clock time fires at under the default DST rule (shift, first).

    ``fold=0`` gives exactly that rule: a repeated time resolves to its first
    occurrence, and a skipped one is read with the offset before the gap.
    """
    local = wall.replace(tzinfo=zone, fold=0)
    offset = local.utcoffset()
    assert offset is not None  # a ZoneInfo always knows its offset
    return (wall.replace(tzinfo=None) - offset).replace(tzinfo=UTC)


def wall_of(instant: datetime, zone: ZoneInfo) -> datetime:
    """Naive UTC instant -> naive wall-clock time in ``zone``."""
    return instant + offset_at(instant, zone)


def offset_at(instant: datetime, zone: ZoneInfo) -> timedelta:
    """The UTC offset in force at a naive UTC instant."""
    offset = zone.utcoffset(zone.fromutc(instant.replace(tzinfo=zone)))
    assert offset is not None
    return offset


def offsets(wall: datetime, zone: ZoneInfo) -> tuple[timedelta, timedelta]:
    """Offsets of a wall time read with fold=0 and fold=1.

    Equal for an ordinary time; larger-then-smaller for a repeated time;
    smaller-then-larger for a skipped one.
    """
    before = zone.utcoffset(wall)
    after = zone.utcoffset(wall.replace(fold=1))
    assert before is not None and after is not None
    return before, after


def transition(zone: ZoneInfo, old: datetime, new: datetime) -> datetime:
    """The first naive UTC second in (old, new] already under the offset in force at ``new``.

    A bisection: zoneinfo does not expose its transition table.
    """
    target = offset_at(new, zone)
    low, high = 0, int((new - old).total_seconds())
    while high - low > 1:
        middle = (low + high) // 2
        if offset_at(old + timedelta(seconds=middle), zone) == target:
            high = middle
        else:
            low = middle
    return old + timedelta(seconds=high)


@functools.lru_cache(maxsize=1024)
def fall_backs(zone: ZoneInfo, year: int) -> tuple[tuple[datetime, timedelta, timedelta], ...]:
    """The zone's clock changes back in one UTC year: (instant, offset before, offset after).

    The wall times from ``instant + after`` to ``instant + before`` happen twice.
    """
    found = []
    probe = datetime(year, 1, 1)
    end = datetime(year + 1, 1, 1)
    previous = offset_at(probe, zone)
    while probe < end:
        following = offset_at(probe + _PROBE, zone)
        if following < previous:
            found.append((transition(zone, probe, probe + _PROBE), previous, following))
        previous, probe = following, probe + _PROBE
    return tuple(found)
