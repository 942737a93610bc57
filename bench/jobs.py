"""Entrypoints for benchmarks: runs that cost nothing, so pgcrond's own cost shows."""

from __future__ import annotations

from pgcrond.run.context import RunContext


def noop(ctx: RunContext) -> None:
    """Do nothing."""


async def async_noop(ctx: RunContext) -> None:
    """Do nothing, on the daemon's loop: what is measured is pgcrond up to the call."""
