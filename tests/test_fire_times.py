"""Runs of claims won ahead wait for their fire time on one timer, let go a chunk per turn."""

from __future__ import annotations

import asyncio
import time
from datetime import UTC, datetime, timedelta

from pgcrond.guard.fire_times import FireTimes
from pgcrond.storage.dbclock import ClockFloor


def floor_at(lag: timedelta = timedelta(0)) -> ClockFloor:
    """A floor fed by an answer that read the database's clock ``lag`` before it arrived now."""
    floor = ClockFloor()
    floor.saw(datetime.now(UTC) - lag, time.monotonic())
    return floor


async def test_waiters_go_no_sooner_than_the_floor_reaches_the_fire_time_a_chunk_a_turn() -> None:
    floor = floor_at()
    fire_times = FireTimes(floor, chunk=100)
    fire_time = datetime.now(UTC) + timedelta(milliseconds=200)
    loop = asyncio.get_running_loop()
    turn = 0

    def count_turns() -> None:
        nonlocal turn
        turn += 1
        loop.call_soon(count_turns)

    async def wait() -> tuple[float, int]:
        await fire_times.reached(fire_time)
        return loop.time(), turn

    waiters = [asyncio.ensure_future(wait()) for _ in range(250)]
    count_turns()
    gone = await asyncio.gather(*waiters)
    reached = floor.reaches(fire_time)
    assert reached is not None and min(at for at, _ in gone) >= reached
    per_turn: dict[int, int] = {}
    for _, in_turn in gone:
        per_turn[in_turn] = per_turn.get(in_turn, 0) + 1
    assert [100, 100, 50] == [per_turn[t] for t in sorted(per_turn)]
    assert sorted(per_turn) == list(range(min(per_turn), min(per_turn) + 3))  # turn after turn


async def test_a_tighter_floor_lets_every_waiter_of_the_fire_time_go_sooner() -> None:
    floor = floor_at(lag=timedelta(milliseconds=600))  # a slow answer: a loose bound
    fire_times = FireTimes(floor)
    fire_time = datetime.now(UTC) + timedelta(milliseconds=150)
    started = time.monotonic()
    first = asyncio.ensure_future(fire_times.reached(fire_time))
    await asyncio.sleep(0)
    floor.saw(datetime.now(UTC), time.monotonic())  # a quick answer: a tight one
    second = asyncio.ensure_future(fire_times.reached(fire_time))
    await asyncio.wait_for(asyncio.gather(first, second), 5)
    # By the first answer alone both would have waited 750 ms.
    assert time.monotonic() - started < 0.6


async def test_a_waiter_cancelled_meanwhile_is_passed_over() -> None:
    fire_times = FireTimes(floor_at(), chunk=1)
    fire_time = datetime.now(UTC) + timedelta(milliseconds=100)
    cancelled, kept = (asyncio.ensure_future(fire_times.reached(fire_time)) for _ in range(2))
    await asyncio.sleep(0)
    cancelled.cancel()
    await asyncio.wait_for(kept, 5)
    assert cancelled.cancelled()


async def test_a_fire_time_already_reached_or_with_no_recent_answer_is_not_waited_for() -> None:
    reached = FireTimes(floor_at())
    await asyncio.wait_for(reached.reached(datetime.now(UTC) - timedelta(seconds=1)), 0.05)
    unknown = FireTimes(ClockFloor())
    await asyncio.wait_for(unknown.reached(datetime.now(UTC) + timedelta(seconds=5)), 0.05)
