"""Helpers for tests and benchmarks, like ``structlog.testing``: throwaway servers.

Not used by the daemon itself; importing it costs nothing at run time.
"""

from __future__ import annotations

from pgcrond.storage.embedded import LocalServer, throwaway

__all__ = ["LocalServer", "throwaway"]
