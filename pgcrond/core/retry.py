"""How long to wait before retrying a failed run.

Exponential backoff with "equal jitter": half of the delay is fixed, so a retry
never comes back immediately, and half is random, so jobs that failed together
(a database restart) do not retry in lockstep. Pure: the random source is passed
in by whoever wants reproducible delays.
"""

from __future__ import annotations

import random
from datetime import timedelta

# Past 2**62 times any base the cap has long been reached; stopping the
# exponent here keeps the arithmetic in floats that cannot overflow.
_MAX_DOUBLINGS = 62
_SMALLEST = timedelta(microseconds=1)


def retry_delay(
    attempt: int,
    base: timedelta,
    *,
    cap: timedelta = timedelta(hours=1),
    rng: random.Random | None = None,
) -> timedelta:
    """Delay before the run after ``attempt`` (1 = the first run failed).

    The full delay is ``min(cap, base * 2**(attempt-1))``; the result lies in
    ``[full/2, full)`` and is never zero.
    """
    if attempt < 1:
        raise ValueError(f"attempt must be >= 1, got {attempt}")
    if base <= timedelta(0) or cap <= timedelta(0):
        raise ValueError("base and cap must be positive")
    full = min(
        cap.total_seconds(),
        base.total_seconds() * 2.0 ** min(attempt - 1, _MAX_DOUBLINGS),
    )
    draw = rng.random() if rng is not None else random.random()
    # Rounding to whole microseconds could turn a tiny delay into zero.
    return max(timedelta(seconds=full / 2 + full / 2 * draw), _SMALLEST)
