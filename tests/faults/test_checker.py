"""The checker over hand-made rows: a clean history passes, each violation is caught."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta

import pytest

from pgcrond.tickplan import CLAIM_AHEAD_MAX
from tests.faults.checker import (
    INHERENT,
    Abandon,
    Crash,
    Fault,
    JobSpec,
    LeaseRow,
    LeaseVersion,
    LedgerRow,
    Pause,
    Report,
    Request,
    Window,
    abandons_in_log,
    check,
    crashes_in_log,
    table_text,
)

T0 = datetime(2026, 1, 1, tzinfo=UTC)
GRACE = timedelta(seconds=8)
TICK = JobSpec("tick", 1, GRACE)
SLOW = JobSpec("slow", 2, GRACE, forbid=True)
ONCE = JobSpec("seed", None, GRACE)
WINDOW = Window(T0, T0 + timedelta(seconds=2))


def at(seconds: float) -> datetime:
    return T0 + timedelta(seconds=seconds)


def key(seconds: int) -> str:
    return at(seconds).strftime("%Y-%m-%dT%H:%M:%SZ")


def row(
    job: JobSpec,
    tick: int | None,
    phase: str,
    when: float,
    *,
    token: int,
    attempt: int = 1,
    pid: int = 100,
) -> LedgerRow:
    return LedgerRow(
        job.code, "" if tick is None else key(tick), attempt, token, pid, phase, at(when)
    )


def lease(
    job: JobSpec,
    tick: int | None,
    status: str,
    *,
    token: int,
    attempt: int = 1,
    pid: int = 100,
    reason: str | None = None,
) -> LeaseRow:
    return LeaseRow(
        job.code,
        None if tick is None else key(tick),
        status,
        attempt,
        token,
        f"host:{pid}",
        reason,
        "INITIAL" if tick is None else "SCHEDULE",
    )


def claim(
    job: JobSpec,
    tick: int,
    when: float,
    *,
    token: int,
    status: str = "RUNNING",
    pid: int = 100,
    expires: float | None = None,
) -> LeaseVersion:
    return LeaseVersion(
        job.code,
        key(tick),
        status,
        token,
        f"host:{pid}",
        None,
        at(when),
        expires_at=None if expires is None else at(expires),
    )


def clean(job: JobSpec = TICK, ticks: range = range(3)) -> tuple[list[LedgerRow], list[LeaseRow]]:
    """Every tick of ``job`` ran once and was recorded: the history to spoil."""
    ledger, leases = [], []
    for n in ticks:
        token = 10 + n
        ledger += [
            row(job, n, "start", n + 0.01, token=token),
            row(job, n, "end", n + 0.02, token=token),
        ]
        leases.append(lease(job, n, "SUCCESS", token=token))
    return ledger, leases


def kinds(report: Report) -> list[str]:
    return [v.kind for v in report.violations]


def without(ledger: list[LedgerRow], tick: int) -> list[LedgerRow]:
    return [r for r in ledger if r.run_key != key(tick)]


def test_a_clean_history_has_no_violation() -> None:
    ledger, leases = clean()
    once_ledger = [row(ONCE, None, "start", 0.1, token=1), row(ONCE, None, "end", 0.2, token=1)]
    report = check(
        [TICK, ONCE],
        ledger + once_ledger,
        [*leases, lease(ONCE, None, "SUCCESS", token=1)],
        [],
        WINDOW,
    )
    assert [] == report.violations
    assert 4 == report.ticks_checked
    assert all(r[k] == 0 for r in report.rows() for k in r if k not in ("fault", "injected"))


def test_a_tick_with_no_finished_run_is_lost() -> None:
    ledger, leases = clean()
    ledger = [*without(ledger, 1), row(TICK, 1, "start", 1.01, token=11)]
    leases = [x for x in leases if x.run_key != key(1)] + [
        lease(TICK, 1, "FAIL", token=11, reason="abandoned")
    ]
    report = check([TICK], ledger, leases, [], WINDOW)
    assert ["lost_tick"] == kinds(report)
    assert key(1) == report.violations[0].run_key
    assert "abandoned" in report.violations[0].detail


def test_a_loss_is_excused_only_if_the_database_was_away_for_the_whole_grace() -> None:
    ledger, leases = clean()
    ledger, leases = without(ledger, 1), [x for x in leases if x.run_key != key(1)]
    whole = [Fault("partition", at(0.5), at(5)), Fault("pg_restart", at(4), at(10))]
    assert [] == check([TICK], ledger, leases, whole, WINDOW).violations
    part = [Fault("partition", at(0.5), at(5))]
    report = check([TICK], ledger, leases, part, WINDOW)
    assert ["lost_tick"] == kinds(report)
    assert ("partition",) == report.violations[0].causes
    # A fault that does not make the database unreachable excuses nothing.
    assert ["lost_tick"] == kinds(
        check([TICK], ledger, leases, [Fault("cut", at(1), at(20))], WINDOW)
    )


def test_a_forbid_job_s_skipped_tick_is_not_lost() -> None:
    window = Window(T0, T0 + timedelta(seconds=2))
    ledger = [row(SLOW, 0, "start", 0.1, token=1), row(SLOW, 0, "end", 1.5, token=1)]
    leases = [
        lease(SLOW, 0, "SUCCESS", token=1),
        lease(SLOW, 2, "SKIPPED", token=2, reason="overlap"),
    ]
    assert [] == check([SLOW], ledger, leases, [], window).violations
    # Not so for a job that allows overlap: there a SKIPPED tick is a lost one.
    allow = JobSpec("slow", 2, GRACE)
    assert ["lost_tick"] == kinds(check([allow], ledger, leases, [], window))


def ran_again() -> tuple[list[LedgerRow], list[LeaseRow]]:
    """Tick 1 ran (token 11, its effect at 1.02) and ran again as token 21, recorded SUCCESS."""
    ledger, leases = clean()
    ledger += [
        row(TICK, 1, "start", 4.0, token=21, attempt=2, pid=200),
        row(TICK, 1, "end", 4.1, token=21, attempt=2, pid=200),
    ]
    leases = [x for x in leases if x.run_key != key(1)] + [
        lease(TICK, 1, "SUCCESS", token=21, attempt=2, pid=200)
    ]
    return ledger, leases


def test_a_second_effect_by_a_still_current_owner() -> None:
    # Token 11 ended at 1.02 and was current then (token 21 was claimed at 3.9);
    # its outcome was lost, so the tick ran again.
    ledger, leases = ran_again()
    history = [claim(TICK, 1, 1.0, token=11), claim(TICK, 1, 3.9, token=21, pid=200)]
    report = check([TICK], ledger, leases, [], WINDOW, history)
    assert sorted(["duplicate_current", "lost_outcome"]) == sorted(kinds(report))
    duplicate = next(v for v in report.violations if v.kind == "duplicate_current")
    assert "token 11" in duplicate.detail and {100, 200} == duplicate.pids


def test_an_effect_whose_lease_lapsed_before_the_next_claim_is_the_inherent_limit() -> None:
    """Token 11 wrote at 1.02, 21 claimed at 3.9; 11's lease lapsed in between.

    At 2.0, after the effect: nothing of the owner's got through. At 1.01,
    before it: a frozen replica's command child wrote on (fresh-clone CI run
    111: 35 ms after the lease lapsed, 109 ms before the takeover), by an owner
    no longer current.
    """
    ledger, leases = ran_again()
    for expires in (2.0, 1.01):
        history = [
            claim(TICK, 1, 1.0, token=11, expires=expires),
            claim(TICK, 1, 3.9, token=21, pid=200, expires=6.0),
        ]
        report = check([TICK], ledger, leases, [], WINDOW, history)
        assert sorted(["duplicate_lapsed", "outcome_lapsed"]) == sorted(kinds(report)), expires
    # Taken over while the first owner's lease still held: the defect again.
    history[0] = claim(TICK, 1, 1.0, token=11, expires=2.0)
    history[1] = claim(TICK, 1, 1.5, token=21, pid=200, expires=6.0)
    report = check([TICK], ledger, leases, [], WINDOW, history)
    assert "duplicate_lapsed" not in kinds(report)


def test_an_effect_whose_run_its_owner_stopped_and_gave_back_is_the_inherent_limit() -> None:
    """Token 11 wrote at 1.02; its replica's shutdown stopped it and released the row at 1.3.

    Seed 6 of the long fault run: a command's child wrote its effect 80 ms
    before the shutdown's stop reached it, and died of that stop.
    """
    ledger, leases = ran_again()
    released = LeaseVersion(TICK.code, key(1), "FAIL", 11, "host:100", "released", at(1.3))
    history = [claim(TICK, 1, 1.0, token=11), released, claim(TICK, 1, 3.9, token=21, pid=200)]
    report = check([TICK], ledger, leases, [], WINDOW, history)
    assert sorted(["duplicate_released", "outcome_released"]) == sorted(kinds(report))
    # Released before its effect: that is no stop after the effect, but the defect.
    history[1] = LeaseVersion(TICK.code, key(1), "FAIL", 11, "host:100", "released", at(1.015))
    report = check([TICK], ledger, leases, [], WINDOW, history)
    assert sorted(["duplicate_current", "lost_outcome"]) == sorted(kinds(report))


def test_a_second_effect_by_a_fenced_owner_shows_its_older_token() -> None:
    ledger, leases = clean()
    # Token 11 stalled; token 21 took over at 2.5; token 11 woke and wrote at 3.0.
    ledger = [
        *without(ledger, 1),
        row(TICK, 1, "start", 1.01, token=11),
        row(TICK, 1, "start", 2.6, token=21, attempt=2, pid=200),
        row(TICK, 1, "end", 2.7, token=21, attempt=2, pid=200),
        row(TICK, 1, "end", 3.0, token=11),
    ]
    leases = [x for x in leases if x.run_key != key(1)] + [
        lease(TICK, 1, "SUCCESS", token=21, attempt=2, pid=200)
    ]
    history = [claim(TICK, 1, 1.0, token=11), claim(TICK, 1, 2.5, token=21, pid=200)]
    for rows in (history, []):  # the ledger's 'start' dates the claim without history
        report = check([TICK], ledger, leases, [], WINDOW, rows)
        # The fenced owner's outcome must not be recorded: no lost_outcome.
        assert ["duplicate_fenced"] == kinds(report)
        fenced = next(v for v in report.violations if v.kind == "duplicate_fenced")
        assert "token 11" in fenced.detail and "token 21 was claimed" in fenced.detail


def test_an_effect_by_an_owner_whose_row_was_closed_as_an_overlap_is_fenced_not_lost() -> None:
    ledger, leases = clean()
    # Token 11 stalled (SIGSTOP); its row was closed SKIPPED/overlap at 2.5 (a
    # newer tick of the forbid job ran), fencing it; it woke and wrote at 3.0.
    ledger = [
        *without(ledger, 1),
        row(TICK, 1, "start", 1.01, token=11),
        row(TICK, 1, "end", 3.0, token=11),
    ]
    leases = [x for x in leases if x.run_key != key(1)] + [
        lease(TICK, 1, "SKIPPED", token=21, pid=200, reason="overlap")
    ]
    closed = LeaseVersion(TICK.code, key(1), "SKIPPED", 21, "host:200", "overlap", at(2.5))
    history = [claim(TICK, 1, 1.0, token=11), closed]
    assert [] == kinds(check([TICK], ledger, leases, [], WINDOW, history))
    # Without the closing version it is still the defect it was.
    assert ["lost_outcome"] == kinds(check([TICK], ledger, leases, [], WINDOW, history[:1]))


def test_an_outcome_recorded_by_a_superseded_owner() -> None:
    ledger, leases = clean()
    # The row says token 11 succeeded, but token 21 claimed the tick after it.
    ledger += [
        row(TICK, 1, "start", 3.0, token=21, attempt=2, pid=200),
        row(TICK, 1, "cancelled", 3.5, token=21, attempt=2, pid=200),
    ]
    report = check([TICK], ledger, leases, [], WINDOW)
    assert ["fenced_outcome"] == kinds(report)
    assert "token 21 claimed" in report.violations[0].detail


def test_success_for_an_attempt_that_never_ended() -> None:
    ledger, leases = clean()
    ledger = [
        *without(ledger, 1),
        row(TICK, 1, "start", 1.01, token=11),
        row(TICK, 1, "cancelled", 1.5, token=11),
    ]
    report = check([TICK], ledger, leases, [], WINDOW)
    # It is lost, too: nothing finished.
    assert sorted(["fenced_outcome", "lost_tick"]) == sorted(kinds(report))


def test_a_lease_row_whose_token_goes_back() -> None:
    ledger, leases = clean()
    history = [
        claim(TICK, 1, 1.0, token=11),
        claim(TICK, 1, 1.5, token=21, pid=200),
        claim(TICK, 1, 1.6, token=11, status="SUCCESS"),
    ]
    report = check([TICK], ledger, leases, [], WINDOW, history)
    # Both: the row went back, and its outcome is by a superseded token.
    assert ["fenced_outcome", "fenced_outcome"] == kinds(report)
    assert any("went back" in v.detail for v in report.violations)


@pytest.mark.parametrize(("status", "token"), [("FAIL", 11), ("RUNNING", 11), ("SUCCESS", 99)])
def test_a_finished_run_whose_outcome_was_lost(status: str, token: int) -> None:
    ledger, leases = clean()
    leases = [x for x in leases if x.run_key != key(1)] + [lease(TICK, 1, status, token=token)]
    found = kinds(check([TICK], ledger, leases, [], Window(T0, T0 + timedelta(seconds=2))))
    assert "lost_outcome" in found


def test_a_row_still_running_after_settling() -> None:
    ledger, leases = clean()
    ledger = [*without(ledger, 2), row(TICK, 2, "start", 2.01, token=12)]
    leases = [x for x in leases if x.run_key != key(2)] + [lease(TICK, 2, "RUNNING", token=12)]
    report = check(
        [TICK], ledger, leases, [Fault("kill", at(2.5), at(4), frozenset({100}))], WINDOW
    )
    assert sorted(["lost_tick", "stuck_running"]) == sorted(kinds(report))
    assert all(v.causes == ("kill",) for v in report.violations)


def test_a_run_once_job_run_twice() -> None:
    ledger = [
        row(ONCE, None, "start", 0.1, token=1),
        row(ONCE, None, "end", 0.2, token=1),
        row(ONCE, None, "start", 5.0, token=2, attempt=2, pid=200),
        row(ONCE, None, "end", 5.1, token=2, attempt=2, pid=200),
    ]
    report = check(
        [ONCE], ledger, [lease(ONCE, None, "SUCCESS", token=2, attempt=2, pid=200)], [], WINDOW
    )
    assert sorted(["once_rerun", "lost_outcome"]) == sorted(kinds(report))
    # Never run at all is a loss.
    assert ["lost_tick"] == kinds(check([ONCE], [], [], [], WINDOW))


def slow_runs(first_end: float, first_phase: str = "end") -> list[LedgerRow]:
    return [
        row(SLOW, 0, "start", 0.1, token=1),
        row(SLOW, 0, first_phase, first_end, token=1),
        row(SLOW, 2, "start", 2.1, token=2, pid=200),
        row(SLOW, 2, "end", 5.1, token=2, pid=200),
    ]


def slow_leases() -> list[LeaseRow]:
    return [lease(SLOW, 0, "SUCCESS", token=1), lease(SLOW, 2, "SUCCESS", token=2, pid=200)]


def test_overlapping_runs_of_a_forbid_job() -> None:
    report = check([SLOW], slow_runs(3.1), slow_leases(), [], WINDOW)
    assert ["forbid_overlap"] == kinds(report)
    assert key(0) in report.violations[0].detail and key(2) in report.violations[0].detail
    # Back to back is fine.
    assert [] == check([SLOW], slow_runs(2.05), slow_leases(), [], WINDOW).violations


def test_an_overlap_by_a_run_whose_thread_was_abandoned_is_inherent() -> None:
    runs = slow_runs(3.1)
    # Replica 100 gave tick 0's thread up at 2.0 (its stop grace over): the
    # thread went on, unsupervised, until 3.1, overlapping tick 2 from 2.1.
    abandoned = [Abandon(100, at(2.0), SLOW.code, key(0), 1)]
    report = check([SLOW], runs, slow_leases(), [], WINDOW, abandons=abandoned)
    assert ["forbid_overlap_abandoned"] == kinds(report)
    assert "forbid_overlap_abandoned" in INHERENT
    # Abandoned only after the overlap began, or another run's: a defect still.
    for late in (
        Abandon(100, at(2.5), SLOW.code, key(0), 1),
        Abandon(300, at(2.0), SLOW.code, key(0), 1),
    ):
        report = check([SLOW], runs, slow_leases(), [], WINDOW, abandons=[late])
        assert ["forbid_overlap"] == kinds(report)


def test_abandoned_threads_are_read_from_a_replica_s_log() -> None:
    log = "\n".join(
        [
            '{"event": "run_started", "job": "slow", "timestamp": "2026-01-01T00:00:00Z"}',
            '{"job": "slow", "run_key": "2026-01-01T00:00:00Z", "attempt": 2, '
            '"event": "entrypoint_thread_abandoned", "timestamp": "2026-01-01T00:00:03+00:00"}',
            "not json",
        ]
    )
    assert [
        Abandon(7, datetime(2026, 1, 1, 0, 0, 3, tzinfo=UTC), "slow", "2026-01-01T00:00:00Z", 2)
    ] == abandons_in_log(log, 7)


def test_a_stalled_forbid_run_overlaps_only_if_it_goes_on_after_waking() -> None:
    stall = [Fault("pause", at(0.5), at(3.0), frozenset({100}))]
    # Woke at 3.0 and wrote its effect at 3.1, while tick 2 ran: an overlap.
    assert ["forbid_overlap"] == kinds(check([SLOW], slow_runs(3.1), slow_leases(), stall, WINDOW))
    # Woke and stopped: it did nothing while tick 2 ran (its lease is not SUCCESS then).
    leases = [lease(SLOW, 0, "FAIL", token=1), lease(SLOW, 2, "SUCCESS", token=2, pid=200)]
    found = kinds(check([SLOW], slow_runs(3.1, "cancelled"), leases, stall, WINDOW))
    assert "forbid_overlap" not in found


def test_a_stalled_forbid_run_that_woke_fenced_overlaps_as_the_lease_s_inherent_limit() -> None:
    """Tick 0's owner stopped past its lease; tick 2 was claimed and tick 0's row closed
    (SKIPPED/overlap, a new token) before it woke; it wrote its effect at once on waking."""
    stall = [Fault("pause", at(0.5), at(3.0), frozenset({100}))]
    history = [
        claim(SLOW, 0, 0.05, token=1),
        claim(SLOW, 2, 2.05, token=2, pid=200),
        LeaseVersion(SLOW.code, key(0), "SKIPPED", 3, "host:200", "overlap", at(2.5)),
    ]
    leases = [
        lease(SLOW, 0, "SKIPPED", token=3, reason="overlap"),
        lease(SLOW, 2, "SUCCESS", token=2, pid=200),
    ]
    report = check([SLOW], slow_runs(3.1), leases, stall, WINDOW, history)
    assert "forbid_overlap_fenced" in kinds(report)
    assert "forbid_overlap" not in kinds(report)
    assert "forbid_overlap_fenced" in INHERENT
    # Not fenced when it woke (nothing claimed it again): a defect.
    unfenced = check([SLOW], slow_runs(3.1), slow_leases(), stall, WINDOW, history[:2])
    assert "forbid_overlap" in kinds(unfenced)


def test_a_killed_forbid_run_is_active_until_the_kill() -> None:
    runs = [r for r in slow_runs(3.1) if not (r.run_key == key(0) and r.phase == "end")]
    leases = [lease(SLOW, 0, "RUNNING", token=1), lease(SLOW, 2, "SUCCESS", token=2, pid=200)]
    late_kill = [Fault("kill", at(2.5), at(4.0), frozenset({100}))]
    assert "forbid_overlap" in kinds(check([SLOW], runs, leases, late_kill, WINDOW))
    early_kill = [Fault("kill", at(1.0), at(2.0), frozenset({100}))]
    assert "forbid_overlap" not in kinds(check([SLOW], runs, leases, early_kill, WINDOW))


def test_runs_started_before_their_tick_or_after_the_grace() -> None:
    ledger, leases = clean()
    ledger = [
        *without(ledger, 1),
        row(TICK, 1, "start", -0.9, token=11),
        row(TICK, 1, "end", -0.8, token=11),
    ]
    ledger = [
        *without(ledger, 2),
        row(TICK, 2, "start", 2 + 9.0, token=12),
        row(TICK, 2, "end", 2 + 9.1, token=12),
    ]
    report = check([TICK], ledger, leases, [], WINDOW)
    assert sorted(["started_early", "started_late"]) == sorted(kinds(report))
    early = next(v for v in report.violations if v.kind == "started_early")
    assert key(1) == early.run_key and "1.900s before" in early.detail


def test_a_retry_after_the_grace_is_not_late() -> None:
    ledger, leases = clean()
    ledger = [
        *without(ledger, 1),
        row(TICK, 1, "start", 1.01, token=11),
        row(TICK, 1, "fail", 1.02, token=11),
        row(TICK, 1, "start", 1 + 9.0, token=21, attempt=2),
        row(TICK, 1, "end", 1 + 9.1, token=21, attempt=2),
    ]
    leases = [x for x in leases if x.run_key != key(1)] + [
        lease(TICK, 1, "SUCCESS", token=21, attempt=2)
    ]
    assert [] == check([TICK], ledger, leases, [], WINDOW).violations


def test_violations_are_attributed_to_the_faults_of_their_replicas_and_time() -> None:
    ledger, leases = clean()
    ledger = [*without(ledger, 1), row(TICK, 1, "start", 1.01, token=11, pid=300)]
    leases = [x for x in leases if x.run_key != key(1)] + [
        lease(TICK, 1, "RUNNING", token=11, pid=300)
    ]
    faults = [
        Fault("kill", at(1.5), at(3), frozenset({300})),  # its replica: a cause
        Fault("pause", at(1.5), at(3), frozenset({999})),  # another replica: not
        Fault("cut", at(30), at(30)),  # long after: not
        Fault("cut", at(1.2), at(1.2)),  # cluster-wide, meanwhile: a cause
    ]
    report = check([TICK], ledger, leases, faults, WINDOW)
    assert {("kill", "cut")} == {v.causes for v in report.violations}
    rows = {r["fault"]: r for r in report.rows()}
    assert 2 == rows["cut"]["injected"] and 1 == rows["kill"]["lost_tick"]
    assert 0 == rows["pause"]["lost_tick"] and 0 == rows["none"]["lost_tick"]
    assert 4 == rows["total"]["injected"] and 1 == rows["total"]["stuck_running"]
    assert "stuck_running" in table_text(report)


# -- sql: jobs ------------------------------------------------------------------

SQL = JobSpec("sql", 1, GRACE, sql=True)


def sql_clean(
    ticks: range = range(3),
) -> tuple[list[LedgerRow], list[LeaseRow], list[LeaseVersion]]:
    """Every tick's effect committed with its SUCCESS: no 'start' rows, one claim each."""
    ledger, leases, history = [], [], []
    for n in ticks:
        ledger.append(row(SQL, n, "end", n + 0.05, token=10 + n))
        leases.append(lease(SQL, n, "SUCCESS", token=10 + n))
        history.append(claim(SQL, n, n + 0.01, token=10 + n, expires=n + 2.0))
    return ledger, leases, history


def test_a_clean_sql_history_has_no_violation() -> None:
    ledger, leases, history = sql_clean()
    report = check([SQL], ledger, leases, [], WINDOW, history)
    assert [] == report.violations
    assert 3 == report.effects


def test_an_sql_tick_ended_fail_as_its_owner_stalled_is_lost_unless_the_database_broke_it() -> None:
    """A peer was alive to take it over; only an outage or a cut excuses the FAIL."""
    ledger, leases, history = sql_clean()
    ledger = [r for r in ledger if r.run_key != key(1)]
    leases = [x for x in leases if x.run_key != key(1)] + [
        lease(SQL, 1, "FAIL", token=11, reason="timeout")
    ]
    for stall in ("sql_pause", "sql_cut", "pause"):
        stalled = [Fault(stall, at(1.1), at(5), frozenset({100}), "replica-0")]
        report = check([SQL], ledger, leases, stalled, WINDOW, history)
        assert ["lost_tick"] == kinds(report)
        assert (stall,) == report.violations[0].causes
    for broken in ("cut", "pg_restart", "partition"):
        assert (
            [] == check([SQL], ledger, leases, [Fault(broken, at(1.2), at(1.5))], WINDOW).violations
        )
    # Just before the tick: its pools were still connecting again.
    cut_before = [Fault("cut", at(-1), at(-1))]
    assert [] == check([SQL], ledger, leases, cut_before, WINDOW).violations
    # An entrypoint's FAIL is lost whatever broke.
    ledger, leases = clean()
    ledger = [*without(ledger, 1), row(TICK, 1, "start", 1.01, token=11)]
    leases = [x for x in leases if x.run_key != key(1)] + [lease(TICK, 1, "FAIL", token=11)]
    assert ["lost_tick"] == kinds(
        check([TICK], ledger, leases, [Fault("cut", at(1), at(2))], WINDOW)
    )


def test_a_job_started_under_a_parent_that_is_no_replica_is_an_orphan_start() -> None:
    ledger, leases = clean()
    replicas = frozenset({100})
    assert [] == check([TICK], ledger, leases, [], WINDOW, replicas=replicas).violations
    # The replica died between the fork and the job's start: its parent is init.
    ledger.append(row(TICK, 1, "start", 1.2, token=11, pid=1))
    report = check([TICK], ledger, leases, [], WINDOW, replicas=replicas)
    assert ["orphan_start"] == kinds(report)
    assert "parent pid 1" in report.violations[0].detail
    assert "orphan_start" not in INHERENT


def test_a_second_sql_effect_is_a_defect_even_by_a_fenced_owner() -> None:
    """After a newer claim: the lease's limit for an entrypoint, a defect for an sql: job."""
    ledger, leases, history = sql_clean()
    # Token 11 claimed at 1.01, token 21 took over at 3.0; both committed an effect.
    ledger.append(row(SQL, 1, "end", 3.5, token=21, attempt=2, pid=200))
    history.append(claim(SQL, 1, 3.0, token=21, pid=200))
    report = check([SQL], ledger, leases, [], WINDOW, history)
    assert "duplicate_sql" in kinds(report)
    assert not {"duplicate_fenced", "duplicate_lapsed"} & set(kinds(report))
    duplicate = next(v for v in report.violations if v.kind == "duplicate_sql")
    assert "committed twice" in duplicate.detail and {100, 200} == duplicate.pids
    # The same rows for an entrypoint job: only the inherent limit.
    entry = JobSpec("sql", 1, GRACE)
    ledger_with_starts = (
        ledger
        + [row(SQL, n, "start", n + 0.02, token=10 + n) for n in range(3)]
        + [row(SQL, 1, "start", 3.1, token=21, attempt=2, pid=200)]
    )
    assert "duplicate_sql" not in kinds(
        check([entry], ledger_with_starts, leases, [], WINDOW, history)
    )


def test_an_sql_effect_without_its_success_is_a_lost_outcome_never_lapsed() -> None:
    ledger, leases, history = sql_clean()
    # The lease of token 11 lapsed at 2.0 before token 21 claimed at 3.9: for an
    # entrypoint that is the inherent limit; an sql: effect commits with its outcome.
    leases = [x for x in leases if x.run_key != key(1)] + [
        lease(SQL, 1, "FAIL", token=11, reason="abandoned")
    ]
    report = check([SQL], ledger, leases, [], WINDOW, history)
    assert ["lost_outcome"] == kinds(report)


def test_an_sql_success_without_its_effect_is_a_fenced_outcome() -> None:
    ledger, leases, history = sql_clean()
    report = check([SQL], without(ledger, 1), leases, [], WINDOW, history)
    assert sorted(["fenced_outcome", "lost_tick"]) == sorted(kinds(report))


def test_a_tick_s_start_is_its_first_claim_not_its_first_start_row() -> None:
    ledger, leases = clean()
    history = [claim(TICK, n, n + 0.005, token=10 + n) for n in range(3)]
    # Tick 1: attempt 1 claimed at once but was stopped before its 'start'
    # landed (a command's child still starting up); attempt 2 took it over and
    # started 9 s after the tick. The tick started in time: not late.
    ledger = [
        *without(ledger, 1),
        row(TICK, 1, "start", 1 + 9.0, token=21, attempt=2),
        row(TICK, 1, "end", 1 + 9.1, token=21, attempt=2),
    ]
    history += [claim(TICK, 1, 1 + 8.9, token=21)]
    leases = [x for x in leases if x.run_key != key(1)] + [
        lease(TICK, 1, "SUCCESS", token=21, attempt=2)
    ]
    assert [] == kinds(check([TICK], ledger, leases, [], WINDOW, history))
    # Tick 2's first claim came after the grace: late, whatever its rows say.
    history = [h for h in history if h.run_key != key(2)] + [claim(TICK, 2, 2 + 9.0, token=12)]
    ledger = [
        *without(ledger, 2),
        row(TICK, 2, "start", 2 + 9.1, token=12),
        row(TICK, 2, "end", 2 + 9.2, token=12),
    ]
    late = check([TICK], ledger, leases, [], WINDOW, history)
    assert ["started_late"] == kinds(late)
    assert "the first claim (token 12)" in late.violations[0].detail


def test_an_sql_job_s_first_claim_bounds_its_start() -> None:
    ledger, leases, history = sql_clean()
    # Tick 1's first claim came 9 s late (attempt 1 failed then; attempt 2's
    # effect came later still): late. Tick 2 claimed more than CLAIM_AHEAD_MAX
    # before its tick: early.
    history = [h for h in history if h.run_key not in (key(1), key(2))] + [
        claim(SQL, 1, 1 + 9.0, token=11),
        claim(SQL, 2, 2 - CLAIM_AHEAD_MAX.total_seconds() - 0.5, token=12),
    ]
    report = check([SQL], ledger, leases, [], WINDOW, history)
    assert sorted(["started_early", "started_late"]) == sorted(kinds(report))
    # Without history the first attempt's effect dates it.
    late = [*without(ledger, 1), row(SQL, 1, "end", 1 + 9.0, token=11)]
    assert ["started_late"] == kinds(check([SQL], late, leases, [], WINDOW))


def test_an_sql_job_s_claim_may_come_claim_ahead_max_before_its_tick_its_effect_not() -> None:
    ledger, leases, history = sql_clean()
    ahead = CLAIM_AHEAD_MAX.total_seconds()
    # Tick 1 claimed CLAIM_AHEAD_MAX early (as the daemon may), its effect after the tick.
    history = [h for h in history if h.run_key != key(1)] + [claim(SQL, 1, 1 - ahead, token=11)]
    assert [] == kinds(check([SQL], ledger, leases, [], WINDOW, history))
    # Its effect before the tick: early, whatever the claim.
    early = [*without(ledger, 1), row(SQL, 1, "end", 1 - ahead / 2, token=11)]
    report = check([SQL], early, leases, [], WINDOW, history)
    assert ["started_early"] == kinds(report)
    assert key(1) == report.violations[0].run_key


# -- detached requests ------------------------------------------------------------


def test_a_request_run_once_is_clean_and_one_never_run_is_lost() -> None:
    ledger, leases = clean()
    asked = [Request(TICK.code, "request:1", at(0.5)), Request(TICK.code, "request:2", at(0.6))]
    ledger += [
        LedgerRow(TICK.code, "request:1", 1, 50, 100, "start", at(0.7)),
        LedgerRow(TICK.code, "request:1", 1, 50, 100, "end", at(0.8)),
    ]
    leases.append(LeaseRow(TICK.code, "request:1", "SUCCESS", 1, 50, "host:100"))
    report = check([TICK], ledger, leases, [], WINDOW, requests=asked)
    assert ["lost_request"] == kinds(report)
    assert "request:2" == report.violations[0].run_key
    assert "no run at all" in report.violations[0].detail
    assert 5 == report.ticks_checked


def test_a_request_run_twice_by_current_owners_and_one_left_running() -> None:
    ledger, leases = clean()
    asked = [Request(TICK.code, "request:1", at(0.5)), Request(TICK.code, "request:2", at(0.6))]
    ledger += [
        LedgerRow(TICK.code, "request:1", 1, 50, 100, "start", at(0.7)),
        LedgerRow(TICK.code, "request:1", 1, 50, 100, "end", at(0.8)),
        LedgerRow(TICK.code, "request:1", 2, 51, 200, "start", at(4.0)),
        LedgerRow(TICK.code, "request:1", 2, 51, 200, "end", at(4.1)),
        LedgerRow(TICK.code, "request:2", 1, 60, 100, "start", at(0.7)),
    ]
    leases += [
        LeaseRow(TICK.code, "request:1", "SUCCESS", 2, 51, "host:200"),
        LeaseRow(TICK.code, "request:2", "RUNNING", 1, 60, "host:100"),
    ]
    history = [
        LeaseVersion(TICK.code, "request:1", "RUNNING", 50, "host:100", None, at(0.6)),
        LeaseVersion(TICK.code, "request:1", "RUNNING", 51, "host:200", None, at(3.9)),
    ]
    report = check([TICK], ledger, leases, [], WINDOW, history, requests=asked)
    assert sorted(["duplicate_current", "lost_outcome", "lost_request", "stuck_running"]) == sorted(
        kinds(report)
    )


# -- pause and resume -------------------------------------------------------------

# Paused from 0.5 (the command returned at 0.6) to 2.4 (resume began; returned at 2.5).
PAUSE = Pause(TICK.code, at(0.5), at(0.6), at(2.4), at(2.5))


def skipped(job: JobSpec, tick: int, when: float, *, token: int) -> LeaseVersion:
    return LeaseVersion(job.code, key(tick), "SKIPPED", token, "host:100", "paused", at(when))


def paused_history() -> tuple[list[LedgerRow], list[LeaseRow], list[LeaseVersion]]:
    """Ticks 1 and 2 fell while paused: SKIPPED/paused, not run."""
    ledger, leases = clean(ticks=range(1))
    leases += [lease(TICK, n, "SKIPPED", token=10 + n, reason="paused") for n in (1, 2)]
    history = [claim(TICK, 0, 0.01, token=10)] + [
        skipped(TICK, n, n + 0.01, token=10 + n) for n in (1, 2)
    ]
    return ledger, leases, history


def test_ticks_skipped_while_paused_are_not_lost() -> None:
    ledger, leases, history = paused_history()
    assert [] == check([TICK], ledger, leases, [], WINDOW, history, pauses=[PAUSE]).violations
    # A pause of every job holds this one too.
    every = Pause("*", PAUSE.begin, PAUSE.paused, PAUSE.lifting, PAUSE.lifted)
    assert [] == check([TICK], ledger, leases, [], WINDOW, history, pauses=[every]).violations


def test_a_tick_skipped_as_paused_with_no_pause_in_force_is_lost() -> None:
    ledger, leases, history = paused_history()
    other = Pause("other", PAUSE.begin, PAUSE.paused, PAUSE.lifting, PAUSE.lifted)
    report = check([TICK], ledger, leases, [], WINDOW, history, pauses=[other])
    assert ["lost_tick", "lost_tick"] == kinds(report)
    assert "no pause of the job in force" in report.violations[0].detail
    # Paused only until 1.5: tick 2's skip (at 2.01) came after the resume.
    short = Pause(TICK.code, at(0.5), at(0.6), at(1.4), at(1.5))
    report = check([TICK], ledger, leases, [], WINDOW, history, pauses=[short])
    assert [key(2)] == [v.run_key for v in report.violations]


def test_a_tick_claimed_while_its_job_was_paused_ran_while_paused() -> None:
    ledger, leases = clean()
    # Tick 1 was claimed at 1.01 and ran, while paused from 0.6 to 2.4.
    history = [claim(TICK, n, n + 0.01, token=10 + n) for n in range(3)]
    report = check([TICK], ledger, leases, [], WINDOW, history, pauses=[PAUSE])
    found = [v for v in report.violations if v.kind == "ran_while_paused"]
    assert [key(1), key(2)] == [v.run_key for v in found]
    assert "while tick was paused" in found[0].detail and {100} == found[0].pids
    # A claim whose statement reached the server before the pause command
    # returned (it read the job-state table before the pause committed) is not.
    racing = LeaseVersion(
        TICK.code, key(1), "RUNNING", 11, "host:100", None, at(1.01), stmt_at=at(0.55)
    )
    history[1] = racing
    assert [key(2)] == [
        v.run_key
        for v in check([TICK], ledger, leases, [], WINDOW, history, pauses=[PAUSE]).violations
    ]


def test_a_takeover_while_paused_and_a_claim_after_a_paused_skip_both_ran_while_paused() -> None:
    ledger, leases, history = paused_history()
    # Tick 0: its owner died; a survivor took it over at 1.5, during the pause.
    history.append(claim(TICK, 0, 1.5, token=20, pid=200))
    # Tick 2: skipped as paused at 2.01, then claimed again after the resume.
    history.append(claim(TICK, 2, 3.0, token=22, pid=200))
    report = check([TICK], ledger, leases, [], WINDOW, history, pauses=[PAUSE])
    found = [v for v in report.violations if v.kind == "ran_while_paused"]
    assert [key(0), key(2)] == [v.run_key for v in found]
    assert "after the tick was recorded SKIPPED/paused" in found[1].detail


# -- crashed fires ----------------------------------------------------------------


def log_line(**fields: object) -> str:
    return json.dumps({"timestamp": "2026-01-01T00:00:01.500000Z", "level": "info", **fields})


def test_crashes_are_found_in_a_replica_s_log_and_ordinary_events_are_not() -> None:
    text = "\n".join(
        [
            log_line(
                event="run_finished",
                job="tick",
                run_key=key(0),
                outcome="fail",
                error="RuntimeError: attempt 1 fails on purpose",
            ),
            log_line(
                event="fire_crashed",
                level="error",
                job="tick",
                run_key=key(1),
                exception="Traceback (most recent call last):\n  File ...\n"
                "asyncio.exceptions.InvalidStateError: invalid state",
            ),
            log_line(
                event="Task exception was never retrieved\nfuture: <Task ...>",
                level="error",
                exception="Traceback ...\nKeyError: 'x'",
            ),
            log_line(event="uncaught_exception", level="critical"),
            log_line(event="heartbeat_sent", exception="Traceback ...\nValueError: odd"),
            "Traceback (most recent call last):",
            '  File "x.py", line 1, in <module>',
            "ZeroDivisionError: division by zero",
            "job output that is not JSON",
        ]
    )
    found = crashes_in_log(text, "replica-0", 321)
    assert [
        ("fire_crashed", "tick", key(1), "asyncio.exceptions.InvalidStateError: invalid state"),
        ("Task exception was never retrieved", "", "", "KeyError: 'x'"),
        ("uncaught_exception", "", "", ""),
        ("heartbeat_sent", "", "", "ValueError: odd"),
        ("traceback", "", "", "ZeroDivisionError: division by zero"),
    ] == [(c.event, c.job, c.run_key, c.detail) for c in found]
    assert {("replica-0", 321, at(1.5))} == {(c.replica, c.pid, c.at) for c in found}


def test_a_crashed_fire_is_a_defect_attributed_to_its_replica_s_faults() -> None:
    ledger, leases = clean()
    crash = Crash("replica-0", 321, at(1.5), "fire_crashed", "tick", key(1), "InvalidStateError")
    faults = [Fault("blackhole", at(1.0), at(2.0)), Fault("kill", at(1.0), at(2.0), frozenset({9}))]
    report = check([TICK], ledger, leases, faults, WINDOW, crashes=[crash])
    assert ["crashed_fire"] == kinds(report)
    assert ("blackhole",) == report.violations[0].causes
    assert "fire_crashed on replica-0 (pid 321)" in report.violations[0].detail
    assert 1 == {r["fault"]: r for r in report.rows()}["total"]["crashed_fire"]


BOUNDED = JobSpec("bounded", 1, GRACE, bound=2)


def bounded_runs(third_start: float) -> list[LedgerRow]:
    """Ticks 0 and 1 run 0.1-3.1 and 1.1-4.1; tick 2 starts at ``third_start``."""
    return [
        row(BOUNDED, 0, "start", 0.1, token=1),
        row(BOUNDED, 0, "end", 3.1, token=1),
        row(BOUNDED, 1, "start", 1.1, token=2, pid=200),
        row(BOUNDED, 1, "end", 4.1, token=2, pid=200),
        row(BOUNDED, 2, "start", third_start, token=3, pid=300),
        row(BOUNDED, 2, "end", third_start + 3, token=3, pid=300),
    ]


def bounded_leases() -> list[LeaseRow]:
    return [
        lease(BOUNDED, n, "SUCCESS", token=n + 1, pid=pid)
        for n, pid in ((0, 100), (1, 200), (2, 300))
    ]


def test_more_runs_at_once_than_a_jobs_bound_is_a_defect_and_the_bound_itself_is_not() -> None:
    report = check([BOUNDED], bounded_runs(2.1), bounded_leases(), [], WINDOW)
    assert ["above_bound"] == kinds(report)
    assert "above_bound" not in INHERENT
    assert "3 runs active at once" in report.violations[0].detail
    assert report.rows()[-1]["above_bound"] == 1  # a column of the table
    # The third starts as the first ends: two at a time, the bound, is fine.
    assert [] == check([BOUNDED], bounded_runs(3.1), bounded_leases(), [], WINDOW).violations


def test_a_bounded_jobs_skipped_or_replaced_tick_is_not_lost() -> None:
    ledger = without(bounded_runs(3.1), 2)
    for reason in ("overlap", "replaced"):
        leases = [*bounded_leases()[:2], lease(BOUNDED, 2, "SKIPPED", token=3, reason=reason)]
        assert [] == check([BOUNDED], ledger, leases, [], WINDOW).violations
    # Without a bound (and not forbid), a skipped tick is lost.
    plain = JobSpec("bounded", 1, GRACE)
    leases = [*bounded_leases()[:2], lease(BOUNDED, 2, "SKIPPED", token=3, reason="overlap")]
    assert ["lost_tick"] == kinds(check([plain], ledger, leases, [], WINDOW))


def test_a_run_above_the_bound_from_a_wake_after_its_tick_was_closed_is_inherent() -> None:
    """Tick 0's owner stopped past its lease; its tick was closed SKIPPED/replaced (a new
    token) before it woke, and it went on a moment after waking beside ticks 1 and 2."""
    stall = [Fault("pause", at(0.5), at(2.5), frozenset({100}))]
    history = [
        claim(BOUNDED, 0, 0.05, token=1),
        LeaseVersion(BOUNDED.code, key(0), "SKIPPED", 4, "host:200", "replaced", at(2.3)),
    ]
    leases = [lease(BOUNDED, 0, "SKIPPED", token=4, reason="replaced"), *bounded_leases()[1:]]
    report = check([BOUNDED], bounded_runs(2.1), leases, stall, WINDOW, history=history)
    assert ["above_bound_fenced"] == kinds(report)
    assert "above_bound_fenced" in INHERENT
