"""For tests, like ``structlog.testing``: a job without a file, the in-memory guard, servers.

:func:`job` builds a job's config from its fields, as the loader would from a
file; :class:`MemoryGuard` is the in-memory guard (lease semantics in a dict,
on a clock the test controls) that unit tests of the fire run against;
:func:`throwaway` and :class:`LocalServer` start PostgreSQL servers to throw
away. Not used by the daemon itself; importing it costs nothing at run time.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from pgcrond.config.loader import load_document
from pgcrond.config.models import JobConfig
from pgcrond.guard.memory import MemoryGuard
from pgcrond.storage.embedded import LocalServer, throwaway

__all__ = ["LocalServer", "MemoryGuard", "job", "throwaway"]

# A job's config needs a database section to load; a job built here never connects.
_NO_DATABASE: Mapping[str, object] = {"url": "postgresql://unused@127.0.0.1/unused"}


def job(
    code: str = "job", *, defaults: Mapping[str, object] | None = None, **fields: Any
) -> JobConfig:
    """The :class:`JobConfig` of ``jobs: {code: fields}`` (over ``defaults:``), without a file.

    Fields are written as in YAML (``cron="*/5 * * * *"``, ``timeout="30s"``,
    ``env={"A": "1"}``), checked as ``pgcrond check`` checks them: a mistake
    raises :class:`~pgcrond.errors.ConfigError` naming the job and the field.
    """
    document: dict[str, object] = {"database": dict(_NO_DATABASE), "jobs": {code: fields}}
    if defaults is not None:
        document["defaults"] = dict(defaults)
    return load_document(document, name="<pgcrond.testing.job>").jobs[code]
