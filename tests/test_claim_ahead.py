"""Claims won ahead of the tick: the round trip is over by the fire time, the run starts at it.

The daemon fires its scheduled lease ticks ``CLAIM_AHEAD`` before them (a
big tick by more, up to ``CLAIM_AHEAD_MAX``); the
claim statement wins a tick that early (as at the tick), the lease guard holds
the run until the database clock has reached the fire time, and an early claim
that would record SKIPPED (overlap, pause) writes nothing and is made again
at the tick. Against a real PostgreSQL, by its clock.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any
from zoneinfo import ZoneInfo

import psycopg
import pytest
import structlog

from pgcrond.config.loader import load_config
from pgcrond.config.models import JobConfig
from pgcrond.core.keys import Identity
from pgcrond.core.overlap import FORBID
from pgcrond.core.schedule import CronSchedule, run_key_for, tick_of
from pgcrond.core.timing import LeaseTiming
from pgcrond.daemon.scheduling import ScheduleTrigger, Scheduling
from pgcrond.decide import FireOutcome
from pgcrond.deferral import Deferral
from pgcrond.fire import Fire, Firing
from pgcrond.guard.base import ClaimRequest, Held
from pgcrond.guard.lease import LeaseGuard
from pgcrond.guard.memory import MemoryGuard
from pgcrond.storage.claims import Acquired, NotAcquired, Standing
from pgcrond.storage.db import Database
from pgcrond.storage.jobstate import pause
from pgcrond.storage.leases import LeaseStore
from pgcrond.storage.migrate import migrate
from pgcrond.tickplan import CLAIM_AHEAD, CLAIM_AHEAD_MAX, lead_for
from tests.helpers.daemon_harness import LEDGER, cluster, config, wait_until
from tests.helpers.store import database_now

TWO_S = LeaseTiming.build(timedelta(seconds=2), timedelta(0))
# The store below wins claims this far ahead (the daemon's CLAIM_AHEAD is a
# tenth of a second: too short to be sure a claim arrives inside it here).
AHEAD = timedelta(seconds=5)
# A fire time this far after the database clock: inside AHEAD, and far enough
# that a claim sent now is early even on a loaded machine.
EARLY = timedelta(seconds=2)
# How late an answer comes after its statement read the database's clock.
LAG = timedelta(seconds=1)


@pytest.fixture
async def ahead(pg_dsn: str, schema: str) -> AsyncIterator[LeaseStore]:
    """A migrated lease store that wins claims ``AHEAD`` before their fire time."""
    db = Database(pg_dsn)
    await db.open()
    store = LeaseStore(db, schema=schema, owner="test:ahead", claim_ahead=AHEAD)
    try:
        await migrate(store)
        yield store
    finally:
        await db.close()


def rows(pg_dsn: str, schema: str, code: str) -> list[dict[str, Any]]:
    with psycopg.connect(pg_dsn, autocommit=True, row_factory=psycopg.rows.dict_row) as conn:
        return conn.execute(
            "SELECT l.run_key, l.status, l.reason, l.acquired_at, a.started_at "
            f'FROM "{schema}".leases l '
            f'LEFT JOIN "{schema}".leases_attempts a ON a.lease_id = l.id '
            "WHERE l.code = %s ORDER BY l.run_key",
            (code,),
        ).fetchall()


def a_tick_ahead(code: str, pg_dsn: str) -> tuple[datetime, Identity]:
    """A fire time ``EARLY`` after the database's clock now (not a whole second: a jittered one)."""
    fire_time = database_now(pg_dsn) + EARLY
    return fire_time, Identity.schedule(code, run_key_for(fire_time))


async def won_ahead(store: LeaseStore, code: str, pg_dsn: str) -> tuple[datetime, Acquired]:
    """A tick ``EARLY`` ahead, claimed now with a 2 s lease: its fire time and the lease won."""
    fire_time, identity = a_tick_ahead(code, pg_dsn)
    lease = await store.claim(identity, TWO_S, fire_time=fire_time)
    assert isinstance(lease, Acquired)
    return fire_time, lease


async def test_a_claim_inside_claim_ahead_is_won_as_at_its_fire_time(
    ahead: LeaseStore, pg_dsn: str, schema: str
) -> None:
    fire_time, lease = await won_ahead(ahead, "ahead", pg_dsn)
    assert lease.db_now is not None and lease.db_now < fire_time  # it was early indeed
    [row] = rows(pg_dsn, schema, "ahead")
    assert ("RUNNING", fire_time, fire_time) == (
        row["status"],
        row["acquired_at"],
        row["started_at"],
    )


async def test_a_claim_earlier_than_that_is_not_due_and_writes_nothing(
    ahead: LeaseStore, pg_dsn: str, schema: str
) -> None:
    fire_time = database_now(pg_dsn) + AHEAD + timedelta(seconds=10)
    identity = Identity.schedule("too-early", run_key_for(fire_time))
    early = await ahead.claim(identity, TWO_S, fire_time=fire_time)
    assert isinstance(early, NotAcquired) and "not_due" == early.reason
    assert [] == rows(pg_dsn, schema, "too-early")


async def test_an_early_claim_that_would_skip_writes_nothing_and_is_judged_at_the_tick(
    ahead: LeaseStore, pg_dsn: str, schema: str
) -> None:
    """A forbid job's tick claimed while an earlier tick runs: not SKIPPED ahead of its time."""
    now = database_now(pg_dsn)
    running = await ahead.claim(
        Identity.schedule("forbid", run_key_for(now - timedelta(seconds=1))),
        LeaseTiming.build(timedelta(seconds=30), timedelta(0)),
        overlap=FORBID,
    )
    assert isinstance(running, Acquired)
    fire_time, identity = a_tick_ahead("forbid", pg_dsn)
    early = await ahead.claim(identity, TWO_S, overlap=FORBID, fire_time=fire_time)
    assert isinstance(early, NotAcquired) and "not_due" == early.reason
    assert early.wait is not None and early.wait <= EARLY
    assert ["RUNNING"] == [row["status"] for row in rows(pg_dsn, schema, "forbid")]
    # At the tick the earlier run is still going: now the overlap is recorded.
    await asyncio.sleep((fire_time - database_now(pg_dsn)).total_seconds())
    late = await ahead.claim(identity, TWO_S, overlap=FORBID, fire_time=fire_time)
    assert isinstance(late, NotAcquired) and "overlap" == late.reason
    skipped = [row for row in rows(pg_dsn, schema, "forbid") if row["status"] == "SKIPPED"]
    assert [("overlap", identity.run_key)] == [(r["reason"], r["run_key"]) for r in skipped]


async def test_an_early_claim_of_a_paused_job_writes_nothing(
    ahead: LeaseStore, pg_dsn: str, schema: str
) -> None:
    await pause(ahead, ["paused"], by="test", reason=None)
    fire_time, identity = a_tick_ahead("paused", pg_dsn)
    early = await ahead.claim(identity, TWO_S, fire_time=fire_time)
    assert isinstance(early, NotAcquired) and "not_due" == early.reason
    assert [] == rows(pg_dsn, schema, "paused")


async def test_the_guard_holds_a_claim_won_ahead_until_the_database_reaches_its_fire_time(
    ahead: LeaseStore, pg_dsn: str
) -> None:
    fire_time, identity = a_tick_ahead("held", pg_dsn)
    guard = LeaseGuard(ahead)
    timing = LeaseTiming.build(timedelta(seconds=30), timedelta(0))  # outlives the wait
    answer = await guard.claim(ClaimRequest(identity, fire_time, timing, deadline=None))
    assert isinstance(answer, Held)
    assert database_now(pg_dsn) >= fire_time


async def test_a_slow_answer_does_not_hold_its_run_past_the_tick_by_its_lag(
    ahead: LeaseStore, pg_dsn: str, schema: str
) -> None:
    """Held by the tightest answer seen, not by this claim's own, which lagged.

    The claim's statement reads the database clock, then spends ``LAG`` on
    its attempt record (a trigger sleeps: a slow commit, a busy server): by
    its own answer alone the run would be held ``LAG`` past its tick.
    """
    warm = await ahead.claim(Identity.schedule("warm", run_key_for(database_now(pg_dsn))), TWO_S)
    assert isinstance(warm, Acquired)  # a quick answer: the floor is tight
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        conn.execute(
            f'CREATE FUNCTION "{schema}".slow() RETURNS trigger LANGUAGE plpgsql AS '
            f"$$BEGIN PERFORM pg_sleep({LAG.total_seconds()}); RETURN NEW; END$$"
        )
        conn.execute(
            f'CREATE TRIGGER slow BEFORE INSERT ON "{schema}".leases_attempts '
            f'FOR EACH ROW EXECUTE FUNCTION "{schema}".slow()'
        )
    fire_time = database_now(pg_dsn) + 2 * LAG  # after the answer, inside AHEAD
    identity = Identity.schedule("lagged", run_key_for(fire_time))
    timing = LeaseTiming.build(timedelta(seconds=30), timedelta(0))
    answer = await LeaseGuard(ahead).claim(ClaimRequest(identity, fire_time, timing, deadline=None))
    assert isinstance(answer, Held)
    started = database_now(pg_dsn)
    assert fire_time <= started < fire_time + LAG / 2, started - fire_time


async def test_a_claim_won_ahead_counts_its_lease_from_the_fire_time(
    ahead: LeaseStore, pg_dsn: str, schema: str
) -> None:
    fire_time, lease = await won_ahead(ahead, "counted", pg_dsn)
    assert fire_time + TWO_S.lease == lease.expires_at
    assert lease.remaining is not None and lease.remaining > TWO_S.lease


async def test_a_heartbeat_before_the_fire_time_never_shortens_a_lease_won_ahead(
    ahead: LeaseStore, pg_dsn: str, schema: str
) -> None:
    fire_time, lease = await won_ahead(ahead, "beaten", pg_dsn)
    left = await ahead.heartbeat(lease)
    assert database_now(pg_dsn) < fire_time  # the heartbeat was before the tick indeed
    assert left is not None and left > TWO_S.lease
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        [(expires_at,)] = conn.execute(
            f'SELECT expires_at FROM "{schema}".leases WHERE code = %s', ("beaten",)
        ).fetchall()
    assert fire_time + TWO_S.lease <= expires_at


async def test_a_short_lease_claimed_ahead_is_run_with_its_whole_lease_from_the_tick(
    ahead: LeaseStore, pg_dsn: str
) -> None:
    """A 500 ms lease claimed 2 s ahead: held until the tick, then live for its lease."""
    fire_time, identity = a_tick_ahead("short", pg_dsn)
    short = LeaseTiming.build(timedelta(milliseconds=500), timedelta(0))
    guard = LeaseGuard(ahead)
    answer = await guard.claim(ClaimRequest(identity, fire_time, short, deadline=None))
    assert isinstance(answer, Held)
    lease = guard._open[identity].lease
    left = lease.stop_at - asyncio.get_running_loop().time()
    # The whole lease less its stop budget, from the tick (less the floor's slack).
    assert left >= (short.lease - short.stop_budget).total_seconds() - 0.1, left


def firing_ahead(ahead: LeaseStore, jobs: dict[str, JobConfig]) -> Firing:
    return Firing(guards=lambda _: LeaseGuard(ahead), replica="test:ahead", jobs=jobs.get)


def lease_job(tmp_path: Path, code: str, body: str) -> JobConfig:
    path = tmp_path / f"{code}.yaml"
    path.write_text(
        f"database: {{url: 'postgresql://unused@127.0.0.1/x'}}\njobs:\n  {code}: {body}\n"
    )
    return load_config([path]).jobs[code]


async def test_a_fast_clock_s_claim_ahead_never_cuts_a_healthy_run_short(
    ahead: LeaseStore, pg_dsn: str, tmp_path: Path
) -> None:
    """A replica 1.8 s fast claims its tick 1.8 s early: its 5 s lease still runs a 2 s job.

    Counted from the claim, the lease left the run 1.45 s after the tick (5 s
    less the wait, less the stop budget): it was stopped lease_expired before
    its first heartbeat, and run again as attempt 2.
    """
    fast = lease_job(tmp_path, "fast", "{cron: '* * * * *', lease: 5s, shell: 'sleep 2'}")
    fire_time = database_now(pg_dsn) + timedelta(seconds=1.8)
    identity = Identity.schedule("fast", run_key_for(fire_time))
    firing = firing_ahead(ahead, {"fast": fast})
    with structlog.testing.capture_logs() as logs:
        outcome = await firing.fire(Fire(fast, fire_time, identity))
    assert "success" == outcome
    assert [] == [e for e in logs if e["event"] == "lease_expired"]
    assert [1] == [e["attempt"] for e in logs if e["event"] == "run_started"]


async def fired_ahead_until_claimed(
    firing: Firing, job: JobConfig, pg_dsn: str, schema: str
) -> asyncio.Future[FireOutcome]:
    """``job``'s tick fired ``EARLY`` before it, once its claim is won (a RUNNING row)."""
    fire_time, identity = a_tick_ahead(job.code, pg_dsn)
    task = asyncio.ensure_future(firing.fire(Fire(job, fire_time, identity)))
    for _ in range(100):
        if [row["status"] for row in rows(pg_dsn, schema, job.code)] == ["RUNNING"]:
            return task
        await asyncio.sleep(0.02)
    raise AssertionError(f"{job.code}'s tick was not claimed ahead")


def touching(tmp_path: Path, code: str, marker: Path) -> JobConfig:
    return lease_job(tmp_path, code, f"{{cron: '* * * * *', lease: 30s, shell: 'touch {marker}'}}")


async def test_a_claim_won_ahead_is_released_at_a_forced_stop_and_never_started(
    ahead: LeaseStore, pg_dsn: str, schema: str, tmp_path: Path
) -> None:
    marker = tmp_path / "ran"
    job = touching(tmp_path, "stopped", marker)
    firing = firing_ahead(ahead, {"stopped": job})
    task = await fired_ahead_until_claimed(firing, job, pg_dsn, schema)
    firing.halt()  # a second SIGINT, or shutdown_grace: 0s
    assert "lose" == await asyncio.wait_for(task, 10)
    await asyncio.sleep(0.2)  # a run started at the tick would have touched it by now
    assert not marker.exists()
    [row] = rows(pg_dsn, schema, "stopped")
    assert ("FAIL", "released") == (row["status"], row["reason"])


async def test_a_reload_that_removes_a_job_after_its_claim_ahead_releases_the_tick(
    ahead: LeaseStore, pg_dsn: str, schema: str, tmp_path: Path
) -> None:
    marker = tmp_path / "ran"
    job = touching(tmp_path, "removed", marker)
    config = {"removed": job}
    firing = firing_ahead(ahead, config)
    task = await fired_ahead_until_claimed(firing, job, pg_dsn, schema)
    del config["removed"]  # the reload, before the tick
    assert "skip" == await asyncio.wait_for(task, 10)
    assert not marker.exists()
    [row] = rows(pg_dsn, schema, "removed")
    assert ("FAIL", "released") == (row["status"], row["reason"])


async def test_a_reload_that_changes_a_job_after_its_claim_ahead_runs_the_new_definition(
    ahead: LeaseStore, pg_dsn: str, schema: str, tmp_path: Path
) -> None:
    old, new = tmp_path / "old", tmp_path / "new"
    job = touching(tmp_path, "changed", old)
    config = {"changed": job}
    firing = firing_ahead(ahead, config)
    task = await fired_ahead_until_claimed(firing, job, pg_dsn, schema)
    config["changed"] = touching(tmp_path, "changed", new)  # the reload, before the tick
    assert "success" == await asyncio.wait_for(task, 10)
    assert (False, True) == (old.exists(), new.exists())


def test_a_tick_s_lead_grows_with_its_jobs_to_claim_ahead_max_and_half_its_gap() -> None:
    """A tick with more jobs is claimed no later (its claims take longer), from CLAIM_AHEAD
    up to CLAIM_AHEAD_MAX, and never before the tick ahead of it (half the gap)."""
    minute, second = timedelta(minutes=1), timedelta(seconds=1)
    sizes = [1, 10, 100, 1_000, 10_000, 100_000]
    leads = [lead_for(n, minute) for n in sizes]
    assert sorted(leads) == leads and leads[0] < leads[-1]
    assert [CLAIM_AHEAD < lead <= CLAIM_AHEAD_MAX for lead in leads] == [True] * len(sizes)
    assert CLAIM_AHEAD_MAX == lead_for(100_000, minute) == lead_for(100_000, None)
    # Per-second ticks: a tick is not claimed before the one before it.
    assert [lead_for(n, second) <= second / 2 for n in sizes] == [True] * len(sizes)
    assert CLAIM_AHEAD == lead_for(1, timedelta(milliseconds=1))  # never less


def test_apscheduler_wakes_claim_ahead_max_before_each_tick() -> None:
    trigger = ScheduleTrigger(CronSchedule.parse("* * * * *", ZoneInfo("UTC")))
    now = datetime(2026, 1, 1, 0, 0, 30, tzinfo=UTC)
    first = trigger.get_next_fire_time(None, now)
    assert datetime(2026, 1, 1, 0, 1, tzinfo=UTC) - CLAIM_AHEAD_MAX == first
    assert datetime(2026, 1, 1, 0, 2, tzinfo=UTC) - CLAIM_AHEAD_MAX == (
        trigger.get_next_fire_time(first, now)
    )
    # Inside the lead of a tick: that tick, at once (not the one after it).
    inside = datetime(2026, 1, 1, 0, 1, tzinfo=UTC) - CLAIM_AHEAD_MAX / 2
    assert first == trigger.get_next_fire_time(None, inside)


async def test_a_big_tick_is_handed_on_its_lead_before_it_and_only_once(tmp_path: Path) -> None:
    """4,000 jobs on one schedule: their fires go out 0.7 s before the tick, not 0.1 s."""
    jobs = 4000
    path = tmp_path / "jobs.yaml"
    path.write_text(
        "database: {url: 'postgresql://unused@127.0.0.1/x'}\njobs:\n"
        + "".join(
            f"  job-{n}: {{cron: '0 0 1 1 *', entrypoint: 'bench.jobs:async_noop'}}\n"
            for n in range(jobs)
        )
    )
    loaded = load_config([path])
    loop = asyncio.get_running_loop()
    fired: list[tuple[str, float]] = []
    all_fired = asyncio.Event()

    def fire(fires: list[Fire]) -> None:
        fired.extend((fire.identity.run_key or "", loop.time()) for fire in fires)
        if len(fired) == jobs:
            all_fired.set()

    scheduling = Scheduling(config=lambda: loaded, fire=fire, stopping=lambda: False)
    scheduling.start()
    try:
        [key] = {repr(job.schedule) for job in loaded.jobs.values()}
        tick = datetime.now(UTC) + timedelta(seconds=2)
        due = loop.time() + 2
        lead = lead_for(jobs, None)
        # APScheduler's two entries for one schedule (a reload removed it and
        # added it back within the lead) fire the tick twice.
        scheduling._on_fire_group(key, tick - CLAIM_AHEAD_MAX)
        scheduling._on_fire_group(key, tick - CLAIM_AHEAD_MAX)
        # The schedule's next tick is the one waiting out its lead, not APScheduler's next.
        [(codes, upcoming)] = scheduling.next_ticks()
        assert (jobs, tick) == (len(codes), upcoming)
        await asyncio.wait_for(all_fired.wait(), 10)
        await asyncio.sleep(0.1)  # room for a second hand-on to show
        [(_, following)] = scheduling.next_ticks()
        assert loaded.jobs["job-0"].schedule.next_after(tick) == following
    finally:
        scheduling.shutdown()
    assert jobs == len(fired) and [run_key_for(tick)] == list({run_key for run_key, _ in fired})
    first = min(at for _, at in fired)
    assert due - lead.total_seconds() - 0.01 <= first < due - 3 * CLAIM_AHEAD.total_seconds()


async def test_a_deferred_fire_of_a_tick_not_yet_come_is_looked_at_the_delay_after_the_tick(
    tmp_path: Path,
) -> None:
    """Fired ahead, the hold-back still ends ``delay`` after the tick, when the preferred ran."""
    delay = timedelta(milliseconds=50)
    tick = datetime.now(UTC) + timedelta(milliseconds=150)
    guard = DefersAll()
    looked: asyncio.Future[datetime] = asyncio.get_running_loop().create_future()

    def fire_tick(fires: list[Fire]) -> None:
        looked.set_result(datetime.now(UTC))

    deferral = Deferral(
        Firing(guards=lambda _: guard, replica="me"),
        fire_tick,
        asyncio.ensure_future,
        lambda: delay,
    )
    identity = Identity.schedule("job", run_key_for(tick))
    the_job = load_config_text(tmp_path)
    assert deferral.offer(Fire(the_job, tick, identity))
    assert await asyncio.wait_for(looked, 5) >= tick + delay


@dataclass
class DefersAll(MemoryGuard):
    """Another replica is preferred for every tick, and none has a row yet."""

    def defers(self, identity: Identity) -> bool:
        return True

    async def standings(self, identities: Sequence[Identity]) -> dict[Identity, Standing]:
        return {}


def load_config_text(tmp_path: Path) -> JobConfig:
    path = tmp_path / "jobs.yaml"
    path.write_text(
        "database: {url: 'postgresql://unused@127.0.0.1/x'}\n"
        "jobs:\n  job: {cron: '* * * * *', command: ['true']}\n"
    )
    return load_config([path]).jobs["job"]


def runs_claimed_ahead(
    pg_dsn: str, schema: str, tmp_path: Path, jobs: str, replicas: int, by: timedelta
) -> None:
    """Job ``ahead`` (in ``jobs``) has a tick claimed more than ``by`` before it; no run is early.

    Run: by the database clock, its ledger's 'start' rows, each after its tick.
    """
    with cluster(pg_dsn, schema, tmp_path) as running:
        running.start(running.write_config(config(schema, jobs)), replicas)

        def claimed_ahead() -> list[dict[str, Any]] | None:
            leases = running.rows("SELECT run_key, created_at FROM {leases} WHERE code = 'ahead'")
            early = [
                row
                for row in leases
                if row["created_at"] < (tick_of(row["run_key"]) or row["created_at"]) - by
            ]
            return leases if len(leases) >= 3 and early else None

        wait_until(claimed_ahead, 30, f"a tick claimed more than {by} ahead of it")
        starts = running.rows("SELECT * FROM {ledger} WHERE phase = 'start' ORDER BY run_key")
    assert starts and len(starts) == len({row["run_key"] for row in starts})
    for row in starts:
        tick = tick_of(row["run_key"])
        assert tick is not None and tick <= row["at"], row


@pytest.mark.slow
@pytest.mark.usefixtures("system_processes")
def test_per_second_runs_start_at_their_tick_never_before_it(
    pg_dsn: str, schema: str, tmp_path: Path
) -> None:
    """Two replicas: claims are made ahead of the ticks, and no run starts before its tick."""
    jobs = f'  ahead: {{cron: "* * * * * *", entrypoint: {LEDGER}}}\n'
    runs_claimed_ahead(pg_dsn, schema, tmp_path, jobs, 2, timedelta(0))


@pytest.mark.slow
@pytest.mark.usefixtures("system_processes")
def test_a_schedule_with_many_jobs_is_claimed_further_ahead_and_never_run_early(
    pg_dsn: str, schema: str, tmp_path: Path
) -> None:
    """401 per-second jobs on one schedule: led by 160 ms, not 100 ms; no run before its tick."""
    many = 400
    assert lead_for(many + 1, timedelta(seconds=1)) > CLAIM_AHEAD + timedelta(milliseconds=50)
    jobs = f'  ahead: {{cron: "* * * * * *", entrypoint: {LEDGER}}}\n' + "".join(
        f'  many-{n}: {{cron: "* * * * * *", entrypoint: "bench.jobs:async_noop"}}\n'
        for n in range(many)
    )
    runs_claimed_ahead(pg_dsn, schema, tmp_path, jobs, 1, CLAIM_AHEAD)
