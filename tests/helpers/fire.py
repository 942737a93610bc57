"""Jobs whose fires decide fast: a short lease, no heartbeat, a one-second misfire window."""

from __future__ import annotations

from typing import Any

from pgcrond.config.models import JobConfig
from pgcrond.testing import job


def quick_job(code: str = "j", **fields: Any) -> JobConfig:
    """A per-minute job ``code`` with ``fields``, its lease 200 ms and its window 1 s."""
    return job(code, cron="* * * * *", lease="200ms", heartbeat="0s", misfire_grace="1s", **fields)
