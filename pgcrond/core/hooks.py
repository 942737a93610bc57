"""What to tell, and where, when a run starts, succeeds, fails, recovers or is missed.

Pure data; the daemon sends it (:mod:`pgcrond.daemon.hooks`), in the
background, bounded, never holding up the next tick. A job's hooks
(``on_start:``, ``on_success:``, ``on_failure:``, ``on_recovery:``,
``on_missed:``) are each a :class:`Hook`; ``ping:`` is a :class:`Ping`, sugar
over the same events for a dead-man's switch.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import timedelta
from typing import Literal
from urllib.parse import urlsplit, urlunsplit

# What a job's hooks hear, each under the YAML key that names its hook. The
# alerts that need a person (a run past max_duration, a start past
# start_deadline, a pause after repeated failures) go where failures go.
HookEvent = Literal[
    "run_started",
    "run_succeeded",
    "run_failed",
    "run_recovered",
    "tick_missed",
    "run_overdue",
    "start_overdue",
    "job_paused",
]
HOOK_OF_EVENT: dict[HookEvent, str] = {
    "run_started": "on_start",
    "run_succeeded": "on_success",
    "run_failed": "on_failure",
    "run_recovered": "on_recovery",
    "tick_missed": "on_missed",
    "run_overdue": "on_failure",
    "start_overdue": "on_failure",
    "job_paused": "on_failure",
}
HOOK_FIELDS = ("on_start", "on_success", "on_failure", "on_recovery", "on_missed")

# A ping's three calls, healthchecks.io's names for them.
PingState = Literal["start", "success", "fail"]
PING_OF_EVENT: dict[HookEvent, PingState] = {
    "run_started": "start",
    "run_succeeded": "success",
    "run_failed": "fail",
}
# Cronitor's telemetry names for the same three states.
_CRONITOR_STATE: dict[PingState, str] = {"start": "run", "success": "complete", "fail": "fail"}


@dataclass(frozen=True)
class Hook:
    """``on_failure: {webhook: URL, command: [argv], timeout: 10s, retries: 2}`` (any hook)."""

    webhook: str | None = None
    command: tuple[str, ...] | None = None
    # Per attempt, for the webhook's request and the command alike.
    timeout: timedelta = timedelta(seconds=10)
    # Extra attempts of the webhook on a connect error, 5xx or 429.
    retries: int = 2


@dataclass(frozen=True)
class Ping:
    """``ping: URL`` or ``ping: {url, cronitor: true, timeout, retries}``.

    healthchecks.io's convention by default (``URL/start``, ``URL``,
    ``URL/fail``); with ``cronitor`` the URL's ``?state=`` says which.
    """

    url: str
    cronitor: bool = False
    timeout: timedelta = timedelta(seconds=10)
    retries: int = 2

    def url_for(self, state: PingState) -> str:
        """Where the ping for ``state`` goes."""
        parts = urlsplit(self.url)
        if self.cronitor:
            query = "&".join(q for q in (parts.query, f"state={_CRONITOR_STATE[state]}") if q)
            return urlunsplit(parts._replace(query=query))
        if state == "success":
            return self.url
        return urlunsplit(parts._replace(path=f"{parts.path.rstrip('/')}/{state}"))
