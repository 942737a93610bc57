"""What the Python interpreter itself may cost a replica: its collector, its GIL.

CPython's defaults are made for short scripts. A replica holds its whole
configuration for hours and, while a tick fires, the short-lived objects of
thousands of runs, beside threads of its own (the HTTP server renders
``/metrics`` on one). Measured with bench.scale (10,000 co-firing jobs, one
replica):

* the cyclic collector took about 45 % of the tick's CPU with its defaults
  (a young collection every 700 new container objects, full ones over every
  object alive): 6.6 s with them, 3.7 s with no collector at all. What is
  loaded once (modules, the configuration, the schedules) is moved out
  of its sight after start-up and after each reload (``gc.freeze``), and the
  young generation is collected every 50,000 new objects: 4.0 s. Cyclic
  garbage is still collected, at most that many objects late. A run makes
  no reference cycle, so while a big tick's runs are in flight the
  collector is held off altogether (:class:`BigTicks`).
* a thread that computes (a ``/metrics`` render) held the GIL for up to the
  switch interval (5 ms) each time the loop gave it up for a write (each log
  line): the longest loop stall of a tick went from ~0.4 s to ~0.2 s with a
  1 ms interval.
* what start-up, a reload or a big tick freed stays the process's unless
  handed back (``trim``).
* Python 3.11's asyncio waits for each child process (a ``command:`` job's)
  on a thread of its own, started on the loop: at 1,000 co-firing commands
  on 3 replicas the threads' starts were a quarter of the loop's time
  (``watch_children``).
"""

from __future__ import annotations

import asyncio
import ctypes
import functools
import gc
import os
import sys
import warnings
from collections.abc import Callable

YOUNG_THRESHOLD = 50_000
SWITCH_INTERVAL_S = 0.001


def tune() -> None:
    """The collector's thresholds and the GIL's switch interval (called once, at start)."""
    _, older, oldest = gc.get_threshold()
    gc.set_threshold(YOUNG_THRESHOLD, older, oldest)
    sys.setswitchinterval(SWITCH_INTERVAL_S)


def watch_children() -> bool:
    """Children waited for through a pidfd on the running loop, not a thread each.

    Python 3.12 and later do so by themselves where the kernel offers pidfds
    (Linux 5.3); 3.11's default starts a thread per child, on the loop. True
    when the pidfd watcher was set up here.
    """
    if sys.version_info >= (3, 12) or not hasattr(os, "pidfd_open"):
        return False
    try:
        os.close(os.pidfd_open(os.getpid()))
    except OSError:
        return False  # an older kernel, or a sandbox that forbids the call
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        watcher = asyncio.PidfdChildWatcher()
        watcher.attach_loop(asyncio.get_running_loop())
        asyncio.set_child_watcher(watcher)
    return True


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


# A tick of this many fires is big: the collector is held off while its runs
# are in flight, and what they freed is handed back once they are over.
BIG_TICK = 1000
# The collector is held off for at most this long: a big tick of long runs is
# collected as usual after it.
PAUSE_COLLECTOR_S = 10.0


class BigTicks:
    """What the interpreter does about a big tick (the scheduler says how big it is).

    While its runs are in flight the cyclic collector is held off. A run
    makes no reference cycle (``tests/test_runner_entrypoints.py``), so what
    a tick's thousands of fires hold is freed by reference counting as each
    ends; yet while they are alive their objects count as new ones, and the
    collector walked them every 50,000 (a young collection, 60-90 ms of the
    loop at 10,000 co-firing jobs on this machine) and again in its older
    generations (150-350 ms). Held off from the hand-on of a tick of
    ``BIG_TICK`` fires or more until no fire is in flight, or
    ``PAUSE_COLLECTOR_S`` at most: what cyclic garbage the tick makes
    elsewhere is collected at most that late. It only lets go of a pause it
    made (a collector someone else disabled stays so). Once no fire is in
    flight, what the big tick freed is worth handing back (:func:`trim`):
    :meth:`idle` says when.
    """

    def __init__(self) -> None:
        self._resume: asyncio.TimerHandle | None = None
        # Read from other threads too (the HTTP server's): one bool, set by the loop.
        self.in_flight = False

    def tick(self, fires: int) -> None:
        """A tick of ``fires`` fires is handed on."""
        if fires < BIG_TICK:
            return
        self.in_flight = True
        if self._resume is None and gc.isenabled():
            gc.disable()
            self._resume = asyncio.get_running_loop().call_later(PAUSE_COLLECTOR_S, self.resume)

    def idle(self) -> bool:
        """No fire is in flight now: True when a big tick's just ended."""
        ended, self.in_flight = self.in_flight, False
        self.resume()
        return ended

    def resume(self) -> None:
        """The collector back on (the tick is over, its bound ran out, or the replica stops)."""
        if self._resume is not None:
            self._resume.cancel()
            self._resume = None
            gc.enable()
