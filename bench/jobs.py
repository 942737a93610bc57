"""Entrypoints for benchmarks: runs that cost nothing, so pgcrond's own cost shows."""

from __future__ import annotations

from pgcrond.run.context import RunContext


def noop(ctx: RunContext) -> None:
    """Do nothing."""
