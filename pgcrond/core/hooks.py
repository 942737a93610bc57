"""What to tell when a job fails for good: a webhook and/or a command (``on_failure:``).

Pure data; the daemon sends it (:mod:`pgcrond.daemon.hooks`), in the
background, bounded, never holding up the next tick.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import timedelta


@dataclass(frozen=True)
class FailureHook:
    """``on_failure: {webhook: URL, command: [argv], timeout: 10s, retries: 2}``."""

    webhook: str | None = None
    command: tuple[str, ...] | None = None
    # Per attempt, for the webhook's request and the command alike.
    timeout: timedelta = timedelta(seconds=10)
    # Extra attempts of the webhook on a connect error, 5xx or 429.
    retries: int = 2
