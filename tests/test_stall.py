"""The loop-stall probe on the loop it makes: a step that holds the loop is seen, idle is quiet."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Coroutine
from typing import Any

from pgcrond.daemon.stall import StallProbe


def _hold(seconds: float) -> None:
    """A step that keeps the loop from looking at anything else (a long render, say)."""
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        pass


def _run(probe: StallProbe, body: Coroutine[Any, Any, None]) -> None:
    with asyncio.Runner(loop_factory=probe.new_loop) as runner:
        runner.run(body)


def test_a_step_holding_the_loop_while_fires_are_in_flight_is_the_longest_stall() -> None:
    seen: list[float] = []
    probe = StallProbe(lambda: True, seen.append)

    async def body() -> None:
        await asyncio.sleep(0.01)
        _hold(0.08)
        await asyncio.sleep(0.01)

    _run(probe, body())
    assert probe.longest_s >= 0.08
    assert seen[-1] == probe.longest_s, "the gauge was not told the longest stall"


def test_a_turn_counts_when_fires_were_in_flight_at_its_start_or_its_end() -> None:
    in_flight = False
    probe = StallProbe(lambda: in_flight, lambda _: None)

    async def body() -> None:
        nonlocal in_flight
        await asyncio.sleep(0.01)
        _hold(0.05)  # idle at both ends: not a stall of ticks
        await asyncio.sleep(0.01)
        assert probe.longest_s < 0.05
        in_flight = True  # a tick's fires handed on in this turn
        _hold(0.06)
        await asyncio.sleep(0.01)
        assert probe.longest_s >= 0.06
        _hold(0.09)
        in_flight = False  # the last fire ended in this turn
        await asyncio.sleep(0.01)

    _run(probe, body())
    assert probe.longest_s >= 0.09


def test_a_loop_asleep_costs_the_probe_no_wake_up() -> None:
    turns = 0

    def counted() -> bool:
        nonlocal turns
        turns += 1  # at most twice a turn: as it begins and as it ends
        return True

    probe = StallProbe(counted, lambda _: None)

    async def body() -> None:
        await asyncio.sleep(0.3)

    _run(probe, body())
    # A probe on a timer would have woken the loop 30 times in 0.3 s.
    assert turns < 20
