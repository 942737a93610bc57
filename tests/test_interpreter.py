"""The interpreter settings a replica runs with (pgcrond/daemon/interpreter.py)."""

from __future__ import annotations

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


def test_trim_hands_pages_freed_between_live_objects_back_to_the_system() -> None:
    # Freed blocks with live neighbours (what a load or a tick leaves): glibc
    # gives pages back by itself only from the heap's top, never from between.
    blocks, pins = [], []
    for _ in range(2000):
        blocks.append(bytearray(32 * 1024))  # 64 MiB in all, each below mmap's threshold
        pins.append(bytearray(600))  # kept: the block's pages lie inside the heap
    del blocks
    before = _rss_kib()
    interpreter.trim()
    assert before - _rss_kib() > 32 * 1024  # half of what was freed, at least
    assert len(pins) == 2000
