"""What the Python interpreter itself may cost a replica: its collector, its GIL.

CPython's defaults are made for short scripts. A replica holds its whole
configuration for hours and, while a tick fires, the short-lived objects of
thousands of runs, beside threads of its own (the HTTP server renders
``/metrics`` on one). Measured with bench.scale (10,000 co-firing jobs, one
replica; docs/performance.md, "What the interpreter cost"):

* the cyclic collector took about 45 % of the tick's CPU with its defaults
  (a young collection every 700 new container objects, full ones over every
  object alive): 6.6 s with them, 3.7 s with no collector at all. What is
  loaded once (modules, the configuration, the schedules) is now moved out
  of its sight after start-up and after each reload (``gc.freeze``), and the
  young generation is collected every 50,000 new objects: 4.0 s. Cyclic
  garbage is still collected, at most that many objects late.
* a thread that computes (a ``/metrics`` render) held the GIL for up to the
  switch interval (5 ms) each time the loop gave it up for a write (each log
  line): the longest loop stall of a tick went from ~0.4 s to ~0.2 s with a
  1 ms interval.
* what start-up, a reload or a big tick freed stays the process's unless
  handed back (``trim``).
"""

from __future__ import annotations

import ctypes
import functools
import gc
import sys
from collections.abc import Callable

YOUNG_THRESHOLD = 50_000
SWITCH_INTERVAL_S = 0.001


def tune() -> None:
    """The collector's thresholds and the GIL's switch interval (called once, at start)."""
    _, older, oldest = gc.get_threshold()
    gc.set_threshold(YOUNG_THRESHOLD, older, oldest)
    sys.setswitchinterval(SWITCH_INTERVAL_S)


def settle() -> None:
    """What is loaded now lives until the next reload: collect once, then freeze it.

    A reload unfreezes first, so that the replaced configuration's cycles are
    collected (about 30 ms of the loop at 10,000 jobs, once per reload).
    """
    gc.unfreeze()
    gc.collect()
    gc.freeze()
    trim()


def trim() -> None:
    """Hand the C heap's free pages back to the system (glibc's ``malloc_trim``).

    Loading 10,000 jobs makes and drops many more objects than it keeps (YAML
    nodes, the registry's definitions), and so does a big tick (its fires);
    glibc keeps the pages they freed (25 MiB at 10,000 jobs: at rest 130 MiB
    without this, 105 MiB with it, a few ms of work, the GIL released). Without
    glibc (musl, macOS) there is nothing to call.
    """
    malloc_trim = _malloc_trim()
    if malloc_trim is not None:
        malloc_trim(0)


@functools.cache
def _malloc_trim() -> Callable[[int], int] | None:
    # Looked up once: each CDLL made a few reference cycles of its own.
    try:
        # The process's own symbols, libc's among them (find_library runs ldconfig).
        function: Callable[[int], int] = ctypes.CDLL(None).malloc_trim
    except (OSError, AttributeError):
        return None
    return function
