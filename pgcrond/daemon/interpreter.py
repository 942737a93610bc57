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
  no reference cycle, so while a big tick's fires are in flight the
  collector is held off altogether (:class:`Bursts`).
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


# A burst of this many fires in flight at once holds the collector off ...
PAUSE_COLLECTOR_AT = 500
# ... for at most this long: a burst of long runs is collected as usual after it.
PAUSE_COLLECTOR_S = 10.0
# A burst of this many (a big tick) is followed, once over, by a trim().
TRIM_AFTER_FIRES = 1000


class Bursts:
    """What the interpreter does about a burst of fires in flight (a big tick).

    During it, the cyclic collector is held off. A run makes no reference
    cycle (``tests/test_runner_entrypoints.py``), so what a tick's thousands
    of fires hold is freed by reference counting as each ends; yet while they
    are alive their objects count as new ones, and the collector walked them
    every 50,000 (a young collection, 60-90 ms of the loop at 10,000
    co-firing jobs on this machine) and again in its older generations
    (150-350 ms). Held off from the moment ``PAUSE_COLLECTOR_AT`` fires are
    in flight until none is, or ``PAUSE_COLLECTOR_S`` at most, and not again
    until that burst is over (thousands of long runs in flight for hours are
    collected as usual): what cyclic garbage the burst makes elsewhere is
    collected at most that late. It only lets go of a pause it made (a
    collector someone else disabled stays so).

    After it, if it reached ``TRIM_AFTER_FIRES``, what its fires freed is
    worth handing back (:func:`trim`): :meth:`fires` says when.
    """

    def __init__(self) -> None:
        self._resume: asyncio.TimerHandle | None = None
        # The bound ran out during this burst: no second pause until it ends.
        self._spent = False
        self._most = 0
        self._in_flight = 0

    @property
    def big(self) -> bool:
        """Whether a big tick's fires are in flight now (``PAUSE_COLLECTOR_AT`` or more).

        Read from other threads too (the HTTP server's): one int, set by the loop.
        """
        return self._in_flight >= PAUSE_COLLECTOR_AT

    def fires(self, in_flight: int) -> bool:
        """Told the number of fires in flight each time it changes.

        True when a burst of ``TRIM_AFTER_FIRES`` or more has just ended.
        """
        self._in_flight = in_flight
        self._most = max(self._most, in_flight)
        if in_flight == 0:
            self._spent = False
            self.resume()
            big, self._most = self._most >= TRIM_AFTER_FIRES, 0
            return big
        if (
            self._resume is None
            and not self._spent
            and in_flight >= PAUSE_COLLECTOR_AT
            and gc.isenabled()
        ):
            gc.disable()
            loop = asyncio.get_running_loop()
            self._resume = loop.call_later(PAUSE_COLLECTOR_S, self._bound_ran_out)
        return False

    def _bound_ran_out(self) -> None:
        self._spent = True
        self.resume()

    def resume(self) -> None:
        """The collector back on (the burst is over, its bound ran out, or the replica stops)."""
        if self._resume is not None:
            self._resume.cancel()
            self._resume = None
            gc.enable()
