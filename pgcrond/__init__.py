"""pgcrond: a distributed cron daemon guarded by PostgreSQL.

The public face: what jobs, applications and tests import. Everything else is
internal and may move between releases. Names are loaded on first use
(PEP 562), so ``import pgcrond`` (and so every CLI command) pays nothing for
psycopg until a name that needs it is asked for.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"

# name -> the module that defines it; the one table `__getattr__` and the
# docs test read.
_EXPORTS: dict[str, str] = {
    "RunContext": "pgcrond.run.context",
    "AdvisoryLease": "pgcrond.storage.advisory",
    "advisory_lock": "pgcrond.storage.advisory",
    "advisory_lock_sync": "pgcrond.storage.sync_advisory",
    "advisory_lock_id": "pgcrond.storage.advisory",
    "with_advisory_lock": "pgcrond.storage.advisory",
    "SyncAdvisoryLock": "pgcrond.storage.sync_advisory",
    "Database": "pgcrond.storage.db",
    "LocalServer": "pgcrond.testing",
    "throwaway": "pgcrond.testing",
    "ExitCode": "pgcrond.errors",
    "PgcrondError": "pgcrond.errors",
    "ValidationError": "pgcrond.errors",
    "ConfigError": "pgcrond.errors",
    "ConfigIssue": "pgcrond.errors",
    "DatabaseUnavailable": "pgcrond.errors",
    "DatabaseError": "pgcrond.errors",
    "LeaseLost": "pgcrond.errors",
    "Cancelled": "pgcrond.errors",
    "EntrypointError": "pgcrond.errors",
    "SqlJobFailed": "pgcrond.errors",
}

__all__ = [
    "AdvisoryLease",
    "Cancelled",
    "ConfigError",
    "ConfigIssue",
    "Database",
    "DatabaseError",
    "DatabaseUnavailable",
    "EntrypointError",
    "ExitCode",
    "LeaseLost",
    "LocalServer",
    "PgcrondError",
    "RunContext",
    "SqlJobFailed",
    "SyncAdvisoryLock",
    "ValidationError",
    "__version__",
    "advisory_lock",
    "advisory_lock_id",
    "advisory_lock_sync",
    "throwaway",
    "with_advisory_lock",
]

if TYPE_CHECKING:
    from pgcrond.errors import (
        Cancelled,
        ConfigError,
        ConfigIssue,
        DatabaseError,
        DatabaseUnavailable,
        EntrypointError,
        ExitCode,
        LeaseLost,
        PgcrondError,
        SqlJobFailed,
        ValidationError,
    )
    from pgcrond.run.context import RunContext
    from pgcrond.storage.advisory import (
        AdvisoryLease,
        advisory_lock,
        advisory_lock_id,
        with_advisory_lock,
    )
    from pgcrond.storage.db import Database
    from pgcrond.storage.sync_advisory import SyncAdvisoryLock, advisory_lock_sync
    from pgcrond.testing import LocalServer, throwaway


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'pgcrond' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(__all__)
