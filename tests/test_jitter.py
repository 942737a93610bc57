"""Jitter: a stable shift of each tick's fire time, the same on every replica and process.

The shift is a pure function of (job code, tick, jitter); the run key and the
idempotency key stay the tick's. `pgcrond next` shows the shifted instants.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from datetime import UTC, datetime, timedelta
from pathlib import Path
from zoneinfo import ZoneInfo

import pytest

from pgcrond.catchup import plan_job
from pgcrond.cli import main
from pgcrond.config.loader import load_config
from pgcrond.config.models import Config
from pgcrond.core.jitter import fire_time, jitter_shift
from pgcrond.core.keys import Identity
from pgcrond.core.schedule import run_key_for, tick_of
from pgcrond.fire import Firing
from pgcrond.guard.lease import LeaseGuard
from pgcrond.storage.claims import Acquired
from pgcrond.storage.leases import LeaseStore
from pgcrond.storage.ticks import database_now
from tests.helpers.store import accounting

TICK = datetime(2026, 3, 29, 1, 0, tzinfo=UTC)
HOUR = timedelta(hours=1)


def test_the_same_code_and_tick_shift_by_the_same_amount_on_every_call() -> None:
    first = jitter_shift("nightly", TICK, timedelta(seconds=30))
    assert [first] * 5 == [jitter_shift("nightly", TICK, timedelta(seconds=30)) for _ in range(5)]


@pytest.mark.usefixtures("subprocesses")
def test_another_process_computes_the_same_shifts() -> None:
    """No per-process salt (Python's hash() has one): a replica elsewhere agrees."""
    ticks = [TICK + n * HOUR for n in range(20)]
    here = [jitter_shift("nightly", t, timedelta(seconds=30)) // timedelta(microseconds=1)
            for t in ticks]  # fmt: skip
    script = (
        "import json, sys\n"
        "from datetime import UTC, datetime, timedelta\n"
        "from pgcrond.core.jitter import jitter_shift\n"
        "ticks = [datetime.fromisoformat(t) for t in json.loads(sys.argv[1])]\n"
        "print(json.dumps([jitter_shift('nightly', t, timedelta(seconds=30))"
        " // timedelta(microseconds=1) for t in ticks]))\n"
    )
    there = subprocess.run(
        [sys.executable, "-c", script, json.dumps([t.isoformat() for t in ticks])],
        capture_output=True, text=True, check=True,
        env={"PYTHONHASHSEED": "12345", "PATH": "/usr/bin:/bin"},
        cwd=Path(__file__).resolve().parent.parent,
    )  # fmt: skip
    assert here == json.loads(there.stdout)


def test_a_shift_is_within_zero_and_the_jitter() -> None:
    for jitter in (timedelta(microseconds=1), timedelta(milliseconds=900), timedelta(minutes=4)):
        for n in range(2000):
            shift = jitter_shift(f"job-{n % 7}", TICK + n * HOUR, jitter)
            assert timedelta(0) <= shift < jitter


def test_shifts_spread_over_the_whole_jitter_across_many_ticks() -> None:
    """2,000 hourly ticks of one job over 30 s: every 3 s tenth gets a fair share."""
    jitter = timedelta(seconds=30)
    shifts = [jitter_shift("nightly", TICK + n * HOUR, jitter) for n in range(2000)]
    tenths = [0] * 10
    for shift in shifts:
        tenths[int(shift / jitter * 10)] += 1
    assert all(150 <= count <= 250 for count in tenths), tenths
    mean = sum(s.total_seconds() for s in shifts) / len(shifts)
    assert 14.0 <= mean <= 16.0
    # Different jobs at the same tick are spread too: the herd at :00 is broken up.
    herd = {jitter_shift(f"job-{n}", TICK, jitter) for n in range(100)}
    assert 100 == len(herd)


def test_no_jitter_is_no_shift_and_the_fire_time_is_the_tick_plus_its_shift() -> None:
    assert timedelta(0) == jitter_shift("nightly", TICK, timedelta(0))
    assert TICK == fire_time("nightly", TICK, timedelta(0))
    jitter = timedelta(seconds=30)
    assert TICK + jitter_shift("nightly", TICK, jitter) == fire_time("nightly", TICK, jitter)


def test_the_shift_depends_on_the_tick_to_the_second_not_on_its_zone() -> None:
    jitter = timedelta(seconds=30)
    berlin = TICK.astimezone(ZoneInfo("Europe/Berlin"))
    assert jitter_shift("nightly", TICK, jitter) == jitter_shift("nightly", berlin, jitter)
    assert jitter_shift("nightly", TICK, jitter) != jitter_shift("other", TICK, jitter)


@pytest.fixture
def jittered(tmp_path: Path) -> Path:
    path = tmp_path / "jobs.yaml"
    path.write_text(
        "database: {embedded: true}\n"
        "jobs:\n"
        '  hourly: {cron: "0 * * * *", jitter: 30s, command: ["/bin/true"]}\n'
        '  plain: {cron: "0 * * * *", command: ["/bin/true"]}\n'
    )
    return path


def test_next_shows_each_tick_with_the_instant_it_fires_at(
    jittered: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert 0 == main(["next", "-c", str(jittered), "-n", "2", "--from", "2026-03-29T00:30:00Z"])
    lines = capsys.readouterr().out.splitlines()
    ticks = [TICK, TICK + HOUR]
    shifts = [jitter_shift("hourly", t, timedelta(seconds=30)) for t in ticks]
    expected = []
    for tick, shift in zip(ticks, shifts, strict=True):
        ms = shift // timedelta(milliseconds=1)
        fires = (tick + shift).isoformat(timespec="milliseconds").replace("+00:00", "Z")
        expected.append(
            f"  {run_key_for(tick)}  {tick:%Y-%m-%d %H:%M:%S} UTC (+0000)"
            f"  fires {fires} (+{ms // 1000}.{ms % 1000:03d}s)"
        )
    assert expected == lines[1:3]
    # A job without jitter prints as before: the tick is the fire time.
    assert f"  {run_key_for(TICK)}  2026-03-29 01:00:00 UTC (+0000)" == lines[4]


def test_next_json_gives_the_shifted_instant_next_to_the_tick(
    jittered: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    args = ["next", "-c", str(jittered), "--job", "hourly", "-n", "1", "--json"]
    assert 0 == main([*args, "--from", "2026-03-29T00:30:00Z"])
    (tick,) = json.loads(capsys.readouterr().out)["jobs"][0]["ticks"]
    shift = jitter_shift("hourly", TICK, timedelta(seconds=30))
    assert run_key_for(TICK) == tick["utc"]
    assert (TICK + shift).isoformat(timespec="milliseconds").replace("+00:00", "Z") == tick["fires"]
    assert round(shift.total_seconds(), 6) == tick["shift_s"]


def jittered_per_second(tmp_path: Path) -> Config:
    path = tmp_path / "jobs.yaml"
    path.write_text(
        "database: {url: 'postgresql://unused@127.0.0.1/x'}\n"
        "jobs:\n"
        "  j: {cron: '* * * * * *', jitter: 900ms, misfire_grace: 3s, lease: 1s,"
        " command: ['true']}\n"
    )
    return load_config([path])


def test_a_ticks_window_at_start_counts_from_its_jittered_fire_time(tmp_path: Path) -> None:
    """A tick past its grace counted from the tick, not from its fire time, is still due."""
    job = jittered_per_second(tmp_path).jobs["j"]
    last = datetime(2026, 12, 3, 6, 41, 0, tzinfo=UTC)
    ticks = [last + timedelta(seconds=n) for n in range(1, 30)]
    # A tick whose shift takes its window past now, though tick + grace is before it.
    tick = next(t for t in ticks if jitter_shift("j", t, job.jitter) > timedelta(milliseconds=400))
    now = tick + job.misfire_grace + timedelta(milliseconds=200)
    planned = {p.tick: p.action for p in plan_job(job, last, now, window=timedelta(hours=1)).ticks}
    assert "due" == planned[tick]


async def test_a_due_tick_found_at_start_fires_at_its_jittered_fire_time(
    store: LeaseStore, tmp_path: Path
) -> None:
    """The start-up scan fires a due tick as the scheduler would: at tick + its shift.

    Fired at the bare tick, its claim (whose fire time it carries) was granted
    before the jittered instant: fresh-clone CI run 31 saw a jittered job's
    run claimed 300 ms before its fire time, by a replica that started between.
    """
    config = jittered_per_second(tmp_path)
    job = config.jobs["j"]
    now = await database_now(store)
    last = now.replace(microsecond=0) - timedelta(seconds=6)
    lease = await store.claim(Identity.schedule("j", run_key_for(last)))
    assert isinstance(lease, Acquired)
    assert await store.complete(lease)
    fired: list[tuple[datetime, Identity]] = []
    tasks: set[asyncio.Task[object]] = set()
    firing = Firing(guards=lambda _: LeaseGuard(store), replica="start:1")
    scan = accounting(
        store,
        config,
        firing,
        tasks,
        fire_now=lambda fires: fired.extend((fire.tick, fire.identity) for fire in fires),
    )
    await scan.scan()
    await asyncio.gather(*tasks)
    assert fired, "no due tick was fired"
    for at, identity in fired:
        tick = tick_of(identity.run_key or "")
        assert tick is not None
        assert fire_time("j", tick, job.jitter) == at
    assert any(at != tick_of(identity.run_key or "") for at, identity in fired)
