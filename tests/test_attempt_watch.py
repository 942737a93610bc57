"""The attempt's watch: a timeout is a run that went on too long, not a loop that stood still."""

from __future__ import annotations

import asyncio
import time
from datetime import timedelta

from pgcrond.core.actions import ShellAction
from pgcrond.core.cancel import Cancellation
from pgcrond.run.attempt import Ending, Watch
from tests.jobs_fixture import make_request


def stand_still(seconds: float, then: asyncio.Future[None]) -> None:
    """Block the loop (a SIGSTOP, a stalled host); the work ends just after it wakes,
    as an answer read from a socket does."""
    time.sleep(seconds)
    asyncio.get_running_loop().call_later(0.05, then.set_result, None)


async def test_work_that_ends_as_a_stalled_loop_wakes_is_not_called_a_timeout() -> None:
    loop = asyncio.get_running_loop()
    work: asyncio.Future[None] = loop.create_future()
    request = make_request(ShellAction("true"), timeout=timedelta(milliseconds=100))
    watch = Watch(request, Cancellation(), time.monotonic())
    loop.call_soon(stand_still, 0.8, work)
    assert None is await watch.until_stop(work)


async def test_work_still_going_after_the_look_that_follows_a_stall_is_a_timeout() -> None:
    loop = asyncio.get_running_loop()
    work: asyncio.Future[None] = loop.create_future()
    request = make_request(ShellAction("true"), timeout=timedelta(milliseconds=100))
    watch = Watch(request, Cancellation(), time.monotonic())
    loop.call_soon(stand_still, 0.8, loop.create_future())
    assert Ending("timeout", "timeout after 0.1s") == await watch.until_stop(work)
