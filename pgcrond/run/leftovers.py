"""Entrypoint threads that a stop abandoned and that still run, by job.

Python cannot kill a thread: a synchronous in-process entrypoint that does not
end within its stop grace is abandoned (``entrypoint_thread_abandoned``) and
goes on until it returns, perhaps after its lease lapsed. A replica must not
start another run of a ``concurrency: forbid`` job beside it, so the fire asks
here before it claims. The state is the process's own, like its threads.
"""

from __future__ import annotations

import threading

_live: dict[str, list[threading.Thread]] = {}


def abandoned(job: str, thread: threading.Thread) -> None:
    """Remember ``thread``, a run of ``job`` left running after its stop."""
    _live.setdefault(job, []).append(thread)


def still_running(job: str) -> bool:
    """Whether a thread of ``job`` abandoned on this replica still runs."""
    threads = [thread for thread in _live.get(job, ()) if thread.is_alive()]
    if threads:
        _live[job] = threads
    else:
        _live.pop(job, None)
    return bool(threads)
