"""What one attempt of a job came to: the result the fire records and the guard stores.

The runner makes it (:mod:`pgcrond.run.runner`); the fire, its guard, the
attempt records and the failure hooks read it. It is plain data, so that none
of them has to know how a job is run.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import timedelta
from typing import Literal

from pgcrond.core.output import OutputTail

Outcome = Literal["success", "fail", "timeout", "cancelled"]


@dataclass(frozen=True)
class RunResult:
    outcome: Outcome
    error: str | None
    exit_code: int | None
    duration_s: float
    # A failure's hints for its retry: not before this long (an HTTP
    # Retry-After), or never (a failure no retry can fix).
    retry_after: timedelta | None = None
    permanent: bool = False
    # The attempt's output as its record keeps it.
    output: OutputTail = field(default_factory=OutputTail, compare=False, repr=False)
