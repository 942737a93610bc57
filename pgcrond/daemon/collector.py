"""What Python's cyclic garbage collector may cost a replica.

CPython's defaults (a young collection every 700 new container objects, full
ones over every object that survived two) are made for short scripts. A
replica holds its whole configuration for hours and, while a tick fires, the
short-lived objects of thousands of runs: at 10,000 co-firing jobs on one
replica the collector took about 45 % of the tick's CPU (bench.scale: 6.6 s
with the defaults, 3.7 s with no collector at all; docs/performance.md).

Two measures, both within what CPython documents for long-lived servers:

* what is loaded once (modules, the configuration, the schedules) is moved
  out of the collector's sight after start-up and after each reload
  (``gc.freeze``): full collections no longer walk it;
* the young generation is collected every 50,000 new objects rather than
  700, so a tick's runs are mostly freed by reference counting before a
  collection ever looks at them. Cyclic garbage still is collected, at most
  that many objects late.
"""

from __future__ import annotations

import gc

YOUNG_THRESHOLD = 50_000


def tune() -> None:
    """The thresholds a replica runs with (called once, at start)."""
    _, older, oldest = gc.get_threshold()
    gc.set_threshold(YOUNG_THRESHOLD, older, oldest)


def settle() -> None:
    """What is loaded now lives until the next reload: collect once, then freeze it.

    A reload unfreezes first, so that the replaced configuration's cycles are
    collected (about 30 ms of the loop at 10,000 jobs, once per reload).
    """
    gc.unfreeze()
    gc.collect()
    gc.freeze()
