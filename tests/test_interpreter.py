"""The interpreter settings a replica runs with (pgcrond/daemon/interpreter.py)."""

from __future__ import annotations

import ctypes
import gc
import sys
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
