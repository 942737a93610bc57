"""The interpreter settings a replica runs with (pgcrond/daemon/interpreter.py)."""

from __future__ import annotations

import asyncio
import ctypes
import gc
import sys
import threading
import warnings
import weakref
from collections.abc import Iterator

import pytest

from pgcrond.daemon import interpreter


@pytest.fixture
def restored() -> Iterator[None]:
    thresholds, switch = gc.get_threshold(), sys.getswitchinterval()
    try:
        yield
    finally:
        gc.unfreeze()
        gc.set_threshold(*thresholds)
        sys.setswitchinterval(switch)


@pytest.mark.usefixtures("restored")
def test_tune_sets_the_young_threshold_and_the_switch_interval() -> None:
    interpreter.tune()
    assert gc.get_threshold()[0] == interpreter.YOUNG_THRESHOLD
    assert sys.getswitchinterval() == pytest.approx(interpreter.SWITCH_INTERVAL_S)


@pytest.mark.usefixtures("restored")
def test_settle_collects_the_replaced_configuration_and_freezes_the_new_one() -> None:
    class Job:
        def __init__(self) -> None:
            self.me = self  # a cycle: only the collector frees it

    old = [Job() for _ in range(100)]
    first = weakref.ref(old[0])
    interpreter.settle()
    frozen = gc.get_freeze_count()
    assert frozen > 0
    del old  # a reload replaces the configuration: the old one is cyclic garbage
    interpreter.settle()
    assert first() is None
    assert gc.get_freeze_count() > 0


def _rss_kib() -> int:
    with open("/proc/self/status") as status:
        return next(int(line.split()[1]) for line in status if line.startswith("VmRSS:"))


# glibc's mallopt parameter: freed memory at the heap's top beyond this is given
# back at once, by free() itself (malloc.h).
_M_TRIM_THRESHOLD = -1


def test_trim_hands_freed_pages_back_to_the_system() -> None:
    # free() gives pages back by itself only from the heap's top, and only past
    # a threshold; where the freed blocks land depends on what earlier tests
    # left in this worker's heap. With that threshold out of reach, only trim()
    # gives anything back (fresh-clone CI run 141: trim() found only 9 MiB of
    # the 64 to give, the rest presumably given back by free() already).
    mallopt = ctypes.CDLL(None).mallopt
    mallopt(_M_TRIM_THRESHOLD, 1 << 30)
    try:
        blocks = [bytearray(32 * 1024) for _ in range(2000)]  # 64 MiB, below mmap's threshold
        del blocks
        before = _rss_kib()
        interpreter.trim()
        assert before - _rss_kib() > 32 * 1024  # half of what was freed, at least
    finally:
        mallopt(_M_TRIM_THRESHOLD, 128 * 1024)  # glibc's default


@pytest.fixture
def collector_on() -> Iterator[None]:
    gc.enable()
    try:
        yield
    finally:
        gc.enable()


@pytest.mark.usefixtures("collector_on")
async def test_a_big_tick_holds_the_collector_off_until_no_fire_is_in_flight() -> None:
    ticks = interpreter.BigTicks()
    ticks.tick(interpreter.BIG_TICK - 1)
    assert gc.isenabled() and not ticks.in_flight
    ticks.tick(interpreter.BIG_TICK)
    assert not gc.isenabled() and ticks.in_flight
    assert ticks.idle()
    assert gc.isenabled() and not ticks.in_flight


@pytest.mark.usefixtures("collector_on")
async def test_a_big_tick_that_lasts_is_collected_again_after_the_bound(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(interpreter, "PAUSE_COLLECTOR_S", 0.05)
    ticks = interpreter.BigTicks()
    ticks.tick(interpreter.BIG_TICK)
    assert not gc.isenabled()
    # The loop's timers run in the order they are due: the bound's comes first.
    await asyncio.sleep(0.1)
    assert gc.isenabled()
    # The next big tick holds it off again.
    ticks.tick(interpreter.BIG_TICK)
    assert not gc.isenabled()
    ticks.resume()


@pytest.mark.usefixtures("collector_on")
async def test_a_collector_disabled_by_someone_else_stays_disabled() -> None:
    gc.disable()
    ticks = interpreter.BigTicks()
    ticks.tick(interpreter.BIG_TICK)
    ticks.idle()
    assert not gc.isenabled()


@pytest.mark.usefixtures("collector_on")
async def test_only_the_end_of_a_big_tick_asks_for_a_trim() -> None:
    ticks = interpreter.BigTicks()
    ticks.tick(interpreter.BIG_TICK - 1)
    assert not ticks.idle()
    ticks.tick(interpreter.BIG_TICK)
    assert ticks.idle()
    # Once told, not again.
    assert not ticks.idle()


@pytest.mark.usefixtures("subprocesses")
async def test_children_are_waited_for_through_a_pidfd_not_a_thread_each() -> None:
    """Python 3.11's default starts a waiting thread per child, on the loop."""
    if sys.version_info >= (3, 12):
        pytest.skip("Python 3.12 waits through a pidfd by itself")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        before = asyncio.get_child_watcher()
    try:
        assert interpreter.watch_children()
        threads = threading.active_count()
        children = [
            await asyncio.create_subprocess_exec("/bin/sh", "-c", "sleep 0.2; exit 3")
            for _ in range(5)
        ]
        during = threading.active_count()
        codes = await asyncio.wait_for(asyncio.gather(*(c.wait() for c in children)), 10)
    finally:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", DeprecationWarning)
            asyncio.set_child_watcher(before)
    assert [3] * 5 == codes
    assert threads == during
