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
