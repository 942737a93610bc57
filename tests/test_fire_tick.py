"""A tick's fires claimed together (``Firing.fire_tick``), over the in-memory guard.

The fires of one guard go a chunk a ``claim_many`` call; each answer is
decided at once: a won claim becomes a run of its own, a lost one ends there
(told to the events, no task), an outage past the window is a miss for each.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Coroutine, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from pgcrond.config.loader import load_config
from pgcrond.config.models import JobConfig
from pgcrond.core.keys import Identity
from pgcrond.core.schedule import run_key_for
from pgcrond.core.wheel import PER_TURN
from pgcrond.decide import FireOutcome
from pgcrond.events import FireEvents
from pgcrond.fire import Fire, Firing
from pgcrond.guard.base import ClaimRequest, Held, Refused
from pgcrond.guard.memory import MemoryGuard, Row


def jobs(tmp_path: Path, count: int) -> list[JobConfig]:
    path = tmp_path / "jobs.yaml"
    path.write_text(
        "database: {url: 'postgresql://unused@127.0.0.1/x'}\njobs:\n"
        + "".join(
            f"  job-{n}: {{cron: '* * * * *', entrypoint: 'bench.jobs:async_noop', "
            "lease: 2s, misfire_grace: 5s}\n"
            for n in range(count)
        )
    )
    return list(load_config([path]).jobs.values())


@dataclass
class Chunked(MemoryGuard):
    """The in-memory guard, noting the size of each ``claim_many`` call."""

    chunks: list[int] = field(default_factory=list)

    async def claim_many(self, requests: Sequence[ClaimRequest]) -> list[Held | Refused]:
        self.chunks.append(len(requests))
        return await super().claim_many(requests)


@dataclass
class Told(FireEvents):
    """What the fires told their events: fired, lost claims, misses."""

    lost: list[str] = field(default_factory=list)
    missed_causes: list[str] = field(default_factory=list)
    fired_count: int = 0

    def fired(self, job: JobConfig) -> None:
        self.fired_count += 1

    def claim_lost(self, job: JobConfig, reason: str) -> None:
        self.lost.append(reason)

    def missed(
        self, job: JobConfig, identity: Identity, tick: datetime, cause: str, recorded: bool
    ) -> None:
        self.missed_causes.append(cause)


class Runs(list[asyncio.Future[FireOutcome]]):
    """The runs a firing spawned (started on the wheel, a share a loop turn)."""

    def __init__(self) -> None:
        super().__init__()
        self.spawned = asyncio.Event()

    async def outcomes(self, count: int) -> list[FireOutcome]:
        while len(self) < count:
            self.spawned.clear()
            await asyncio.wait_for(self.spawned.wait(), 5)
        return list(await asyncio.gather(*self))


def firing(guard: MemoryGuard, told: FireEvents | None = None) -> tuple[Firing, Runs]:
    runs = Runs()

    def spawn(fire: Fire, carry: Coroutine[Any, Any, FireOutcome]) -> None:
        runs.append(asyncio.ensure_future(carry))
        runs.spawned.set()

    made = Firing(guards=lambda _: guard, replica="unit:1", spawn=spawn)
    if told is not None:
        made.events = told
    return made, runs


def tick_of(jobs_: list[JobConfig], tick: datetime) -> list[Fire]:
    return [Fire(job, tick, Identity.schedule(job.code, run_key_for(tick))) for job in jobs_]


async def test_a_tick_is_claimed_a_chunk_a_call_and_each_won_claim_runs(tmp_path: Path) -> None:
    guard = Chunked()
    made, runs = firing(guard)
    tick = datetime.now(UTC)
    fires = tick_of(jobs(tmp_path, PER_TURN + 3), tick)
    await made.fire_tick(fires)
    assert [PER_TURN, 3] == guard.chunks
    assert {"success"} == set(await runs.outcomes(len(fires)))
    assert {"SUCCESS"} == {row.status for row in guard.rows.values()}
    assert not any(made.in_flight(fire.identity) for fire in fires)


async def test_a_replica_that_defers_most_of_a_tick_still_claims_full_chunks(
    tmp_path: Path,
) -> None:
    """Chunks are made of the fires it claims, after the deferral, not of every fire."""
    guard = Chunked()
    made, runs = firing(guard)
    fires = tick_of(jobs(tmp_path, 3 * PER_TURN + 3), datetime.now(UTC))
    deferred = [fire for n, fire in enumerate(fires) if n % 3]
    await made.fire_tick(fires, defer=lambda fire: fire in deferred)
    assert [PER_TURN, 1] == guard.chunks
    assert {"success"} == set(await runs.outcomes(PER_TURN + 1))


async def test_a_lost_answer_ends_the_fire_with_no_task_of_its_own(tmp_path: Path) -> None:
    guard = Chunked()
    told = Told()
    made, runs = firing(guard, told)
    tick = datetime.now(UTC)
    [done, won] = tick_of(jobs(tmp_path, 2), tick)
    guard.rows[done.identity] = Row("SUCCESS", 1, 1, tick)
    await made.fire_tick([done, won])
    assert ["success"] == await runs.outcomes(1)
    assert (["done"], 2) == (told.lost, told.fired_count)
    assert not made.in_flight(done.identity)


async def test_an_outage_through_the_window_is_a_miss_for_each_fire(tmp_path: Path) -> None:
    guard = Chunked(script=deque(["unavailable"] * 50))
    told = Told()
    made, runs = firing(guard, told)
    # The window (misfire_grace 5 s) is nearly over.
    fires = tick_of(jobs(tmp_path, 2), datetime.now(UTC) - timedelta(seconds=4.9))
    await made.fire_tick(fires)
    assert ([], ["database_unavailable"] * 2) == (runs, told.missed_causes)


async def test_a_fire_in_flight_here_is_left_to_that_fire(tmp_path: Path) -> None:
    guard = Chunked()
    made, runs = firing(guard)
    [fire] = tick_of(jobs(tmp_path, 1), datetime.now(UTC))
    first = asyncio.ensure_future(made.fire(fire))
    await asyncio.sleep(0)
    assert made.in_flight(fire.identity)
    await made.fire_tick([fire])
    assert ([], []) == (guard.chunks, runs)
    assert "success" == await first


@pytest.mark.parametrize("started", [True, False])
async def test_a_started_or_run_once_fire_goes_on_alone(tmp_path: Path, started: bool) -> None:
    guard = Chunked()
    made, runs = firing(guard)
    [job] = jobs(tmp_path, 1)
    tick = datetime.now(UTC)
    identity = (
        Identity.schedule(job.code, run_key_for(tick)) if started else Identity.initial(job.code)
    )
    await made.fire_tick([Fire(job, tick, identity, started=started)])
    assert [] == guard.chunks
    assert ["success"] == await runs.outcomes(1)


async def test_a_guard_that_keeps_failing_ends_the_tick_s_fires_crashed(tmp_path: Path) -> None:
    @dataclass
    class Broken(MemoryGuard):
        async def claim_many(self, requests: Sequence[ClaimRequest]) -> list[Held | Refused]:
            raise RuntimeError("a bug")

    made, runs = firing(Broken())
    fires = tick_of(jobs(tmp_path, 2), datetime.now(UTC))
    await made.fire_tick(fires)
    assert [] == runs
    assert not any(made.in_flight(fire.identity) for fire in fires)
