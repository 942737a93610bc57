"""The replica's one wheel of timed wake-ups: never early, a slot late at most, a share a turn."""

from __future__ import annotations

import asyncio
import contextvars
import functools
import time
from collections.abc import Callable
from datetime import UTC, datetime, timedelta

from pgcrond.core.wheel import GRID_S, PER_TURN, wheel
from pgcrond.storage.dbclock import ClockFloor


async def test_a_wake_up_comes_no_sooner_than_asked_and_at_most_a_grid_slot_later() -> None:
    loop = asyncio.get_running_loop()
    asked = [loop.time() + delay for delay in (0.013, 0.05, 0.031, 0.05)]
    woken = await asyncio.gather(*(until(at) for at in asked))
    for at, came in zip(asked, woken, strict=True):
        assert at <= came < at + GRID_S + 0.02, (at, came)


async def until(at: float) -> float:
    await wheel().until(at)
    return asyncio.get_running_loop().time()


def counting_turns() -> Callable[[], int]:
    """Count the loop's turns from now on; the count so far."""
    loop = asyncio.get_running_loop()
    turn = 0

    def count() -> None:
        nonlocal turn
        turn += 1
        loop.call_soon(count)

    count()
    return lambda: turn


async def test_the_waiters_of_one_slot_wake_a_share_a_turn_turn_after_turn() -> None:
    loop = asyncio.get_running_loop()
    at = loop.time() + 0.05
    turns: list[int] = []
    turn = counting_turns()
    for _ in range(2 * PER_TURN + 50):
        wheel().call_at(at, lambda: turns.append(turn()))
    await asyncio.sleep(0.2)
    per_turn = [turns.count(t) for t in sorted(set(turns))]
    assert [PER_TURN, PER_TURN, 50] == per_turn
    assert sorted(set(turns)) == list(range(turns[0], turns[0] + 3))
    assert 0 == len(wheel())


async def test_a_wake_up_weighs_the_fires_it_carries_on_and_a_turn_holds_per_turn_of_them() -> None:
    """A tick's chunk (PER_TURN fires) takes a turn of its own; one heavier still, one alone."""
    loop = asyncio.get_running_loop()
    at = loop.time() + 0.05
    called: list[tuple[int, int]] = []
    turn = counting_turns()
    for weight in (PER_TURN, 1, PER_TURN - 1, 2, 2 * PER_TURN):
        wheel().call_at(at, functools.partial(lambda w: called.append((turn(), w)), weight), weight)
    await asyncio.sleep(0.2)
    first = called[0][0]
    by_turn = [[w for t, w in called if t == first + n] for n in range(4)]
    assert [[PER_TURN], [1, PER_TURN - 1], [2], [2 * PER_TURN]] == by_turn
    assert 0 == len(wheel())


async def test_an_earlier_wake_up_added_later_is_not_held_behind_a_later_one() -> None:
    loop = asyncio.get_running_loop()
    late = asyncio.ensure_future(until(loop.time() + 1.0))
    await asyncio.sleep(0)
    started = loop.time()
    await wheel().sleep(0.02)
    assert loop.time() - started < 0.5
    late.cancel()


async def test_a_time_already_come_is_not_waited_for() -> None:
    await asyncio.wait_for(wheel().until(asyncio.get_running_loop().time() - 1), 0.001)


async def test_a_cancelled_waiter_is_passed_over() -> None:
    loop = asyncio.get_running_loop()
    cancelled = asyncio.ensure_future(until(loop.time() + 0.03))
    kept = asyncio.ensure_future(until(loop.time() + 0.03))
    await asyncio.sleep(0)
    cancelled.cancel()
    await asyncio.wait_for(kept, 5)
    assert cancelled.cancelled()


async def test_a_run_won_ahead_waits_until_the_floor_reaches_its_fire_time() -> None:
    """What a lease guard's claim won ahead waits for: the database's clock, bounded from below."""
    floor = ClockFloor()
    floor.saw(datetime.now(UTC), time.monotonic())
    fire_time = datetime.now(UTC) + timedelta(milliseconds=100)
    at = floor.reaches(fire_time)
    assert at is not None
    assert at <= await until(at)


async def test_a_wake_up_runs_in_no_context_of_whoever_asked_for_it() -> None:
    """A run's log context or trace span never reaches the fires its wake-ups start."""
    run_key: contextvars.ContextVar[str | None] = contextvars.ContextVar("run_key", default=None)
    seen: list[str | None] = []
    done = asyncio.Event()

    async def a_run() -> None:
        run_key.set("request:10")
        wheel().call_soon(lambda: seen.append(run_key.get()))
        wheel().call_later(0.02, woken)

    def woken() -> None:
        seen.append(run_key.get())
        done.set()

    await asyncio.create_task(a_run())
    await asyncio.wait_for(done.wait(), 5)
    assert [None, None] == seen
