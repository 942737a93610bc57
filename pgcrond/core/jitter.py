"""Jitter: a stable, per-(job, tick) shift of the fire time, the same on every replica.

``0 * * * *`` on a hundred jobs fires a hundred claims (and a hundred runs)
in the same millisecond; ``jitter: 30s`` spreads them over 30 s. The shift is
a pure function of the job code, the tick and the jitter, so every replica
(and every restart, and ``pgcrond next``) computes the same fire time without
talking to the others. Only the fire time moves: the run key, and so the
identity and the idempotency key, stay the tick's.
"""

from __future__ import annotations

import hashlib
from datetime import datetime, timedelta

from pgcrond.core.schedule import run_key_for

# 64 bits of SHA-256 give a fraction of [0, 1) finer than a microsecond of
# any jitter the config accepts (it is below misfire_grace).
_SCALE = 2**64
_DOMAIN = b"pgcrond.jitter.v1\x00"


def jitter_shift(code: str, tick: datetime, jitter: timedelta) -> timedelta:
    """How far after ``tick`` the job fires: in ``[0, jitter)``, to the microsecond.

    Hashed from the code and the tick's run key (UTC, to the second), never
    from Python's ``hash()`` (salted per process) or the replica's clock.
    """
    if jitter <= timedelta(0):
        return timedelta(0)
    digest = hashlib.sha256(
        _DOMAIN + code.encode("utf-8") + b"\x00" + run_key_for(tick).encode("ascii")
    ).digest()
    fraction = int.from_bytes(digest[:8], "big") / _SCALE
    micros = int(fraction * (jitter // timedelta(microseconds=1)))
    # A fraction just below 1 could round up to the bound in float arithmetic.
    return min(timedelta(microseconds=micros), jitter - timedelta(microseconds=1))


def fire_time(code: str, tick: datetime, jitter: timedelta) -> datetime:
    """The instant the job fires for ``tick``: the tick plus its shift."""
    return tick + jitter_shift(code, tick, jitter)
