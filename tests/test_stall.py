"""The loop-stall probe on a real event loop: a step that holds the loop is seen, idle is quiet."""

from __future__ import annotations

import asyncio
import time

from pgcrond.daemon.stall import PERIOD_S, StallProbe


def _hold(seconds: float) -> None:
    """A step that keeps the loop from running anything else (a long render, say)."""
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        pass


async def test_a_step_holding_the_loop_is_reported_as_a_stall_of_at_least_its_length() -> None:
    seen: list[float] = []
    busy = True
    probe = StallProbe(lambda: busy, seen.append)
    probe.wake()
    await asyncio.sleep(PERIOD_S / 2)
    _hold(0.08)
    await asyncio.sleep(2 * PERIOD_S)
    busy = False
    probe.stop()
    # The wake-up due during the hold ran when the hold ended: its lag is
    # the rest of the hold, at least the hold less one period.
    assert probe.longest_s >= 0.08 - PERIOD_S
    assert seen[-1] == probe.longest_s


async def test_the_probe_goes_to_sleep_once_nothing_is_in_flight_and_wakes_again() -> None:
    asked = 0
    busy = True

    def in_flight() -> bool:
        nonlocal asked
        asked += 1  # once per wake-up
        return busy

    probe = StallProbe(in_flight, lambda _: None)
    began = time.monotonic()
    probe.wake()
    probe.wake()  # already running: no second timer
    await asyncio.sleep(5 * PERIOD_S)
    # One timer wakes at most once a period; two would wake twice as often.
    assert asked <= (time.monotonic() - began) / PERIOD_S + 1, "wake() started a second timer"
    busy = False
    await asyncio.sleep(5 * PERIOD_S)
    asleep = asked
    await asyncio.sleep(10 * PERIOD_S)
    assert asked == asleep, "the probe kept waking with nothing in flight"
    # A new tick wakes it, and a stall is seen again.
    probe.wake()
    _hold(0.05)
    await asyncio.sleep(2 * PERIOD_S)
    probe.stop()
    assert asked > asleep
    assert probe.longest_s >= 0.05 - PERIOD_S
    stopped = asked
    await asyncio.sleep(3 * PERIOD_S)
    assert asked == stopped, "stop() left the timer running"
