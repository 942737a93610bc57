"""procrastinate's side of bench/side_by_side.py: the same jobs as periodic tasks.

Started the way procrastinate documents it, one worker per replica::

    python -m procrastinate --app=bench.procrastinate_app.app worker --concurrency J

The scenario comes from the environment (set by the benchmark):
``BENCH_PROCRASTINATE_DSN`` (procrastinate's own database), ``BENCH_JOBS``
(how many tasks), ``BENCH_CRON`` (procrastinate's cron: five fields, or six
with seconds *last*). Task ``job-NNN`` is registered with ``@app.periodic``;
the periodic deferrer inside every worker defers each tick (the
``procrastinate_periodic_defers`` unique key keeps one job per tick), and
whichever worker fetches the job runs it. The task body is the shared one,
:func:`bench.ledger_job.insert`, with the tick procrastinate passes as
``timestamp``.
"""

from __future__ import annotations

import os
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime
from typing import Any

import procrastinate

from bench import ledger_job

app = procrastinate.App(
    connector=procrastinate.PsycopgConnector(
        conninfo=os.environ.get("BENCH_PROCRASTINATE_DSN", ""),
    )
)


def _body(name: str) -> Callable[[int], Awaitable[None]]:
    async def run(timestamp: int) -> None:
        await ledger_job.insert(name, datetime.fromtimestamp(timestamp, UTC))

    run.__name__ = run.__qualname__ = name.replace("-", "_")
    return run


def _register(jobs: int, cron: str) -> None:
    for n in range(jobs):
        name = f"job-{n:03d}"
        task: Any = app.task(name=name)(_body(name))
        app.periodic(cron=cron, periodic_id=name)(task)


_register(int(os.environ.get("BENCH_JOBS", "0")), os.environ.get("BENCH_CRON", "* * * * * *"))
