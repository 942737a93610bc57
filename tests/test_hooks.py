"""Hooks for every state, and ping:, heard once per event across real replicas.

Three real daemons against one database, a real local HTTP receiver
(tests/helpers/hook_receiver.py) and real commands: each event reaches its hook once
across the cluster, a killed runner's tick taken over is not told twice, a
recovery is told once, and a ping follows healthchecks.io's convention.
"""

from __future__ import annotations

import html
import itertools
import json
import signal
import time
from collections import Counter
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from pgcrond.config.definition import definition
from pgcrond.config.loader import load_config
from pgcrond.core.hooks import Ping
from pgcrond.errors import ConfigError
from tests.helpers.daemon_harness import Cluster, at, cli, cluster, config, wait_until
from tests.helpers.hook_receiver import Receiver, receiving
from tests.helpers.http import answer


def hooks(receiver: Receiver, *names: str) -> str:
    return "".join(
        f"    {name}: {{webhook: {receiver.base}/hook, timeout: 5s}}\n" for name in names
    )


def stop_gracefully(running: Cluster) -> None:
    for replica in running.replicas:
        replica.signal(signal.SIGTERM)
    for replica in running.replicas:
        assert 0 == replica.wait_exit(30)


def of(events: list[dict[str, Any]], kind: str) -> list[dict[str, Any]]:
    return [e for e in events if e["event"] == kind]


def counted(count: Path, then: str) -> str:
    """A shell script counting its runs in ``count`` (``$n``: this one's, from 0), then ``then``."""
    return f"n=$(cat {count} 2>/dev/null || echo 0); echo $((n+1)) > {count}; {then}"


def flaky(script: str, more: str) -> str:
    """Job ``flaky``: ``script`` every two seconds, and ``more`` (its further YAML lines)."""
    return f"  flaky:\n    cron: \"*/2 * * * * *\"\n    shell: '{script}'\n{more}"


@pytest.mark.slow
@pytest.mark.usefixtures("system_processes")
def test_each_hook_and_ping_is_told_once_per_event_across_three_replicas(
    pg_dsn: str, schema: str, tmp_path: Path
) -> None:
    """Two failed ticks, then successes: every start, failure and success once, one recovery."""
    count = tmp_path / "count"
    # Tick n (0-based, counted by whichever replica runs it) fails while n < 2.
    script = counted(
        count, 'sleep 0.2; echo "tick $n"; [ "$n" -ge 2 ] || { echo "boom $n" >&2; exit 3; }'
    )
    with receiving() as receiver:
        jobs = flaky(
            script,
            f"    ping: {receiver.base}/ping/check-1\n"
            + hooks(receiver, "on_start", "on_success", "on_failure", "on_recovery"),
        )
        with cluster(pg_dsn, schema, tmp_path) as running:
            running.start(running.write_config(config(schema, jobs)), 3)
            wait_until(
                lambda: (
                    len(of(receiver.events(), "run_succeeded")) >= 2
                    and len(of(receiver.events(), "run_recovered")) >= 1
                ),
                40,
                "two successes after two failures",
            )
            # A clean stop: each replica sends what it still has to (the hooks'
            # drain), so every start told has its ping, every end its own.
            stop_gracefully(running)
    events = receiver.events()
    started, failed = of(events, "run_started"), of(events, "run_failed")
    succeeded, recovered = of(events, "run_succeeded"), of(events, "run_recovered")
    # Once per event: no attempt's start, no tick's end told twice.
    assert all(1 == n for n in Counter((e["run_key"], e["attempt"]) for e in started).values())
    assert all(1 == n for n in Counter(e["run_key"] for e in failed + succeeded).values())
    assert 2 == len(failed)
    assert {e["run_key"] for e in failed + succeeded} <= {e["run_key"] for e in started}
    assert ["boom 0", "boom 1"] == [e["output"]["stderr"]["text"].strip() for e in failed]
    assert {"fail"} == {e["outcome"] for e in failed} and {3} == {e["exit_code"] for e in failed}
    first_success = min(succeeded, key=lambda e: e["run_key"])
    assert 1 == len(recovered)
    assert (first_success["run_key"], 2) == (recovered[0]["run_key"], recovered[0]["failures"])
    # The same shape for every event.
    assert all(set(failed[0]) <= set(e) for e in events)
    # The ping: /start, then /fail with the output tail, or the URL itself on success.
    pings = [(p.path.removeprefix("/ping/check-1"), p.body.decode()) for p in receiver.pings()]
    ends = [path for path, _ in pings if path != "/start"]
    assert len(started) == len(pings) - len(ends)
    assert ["/fail", "/fail"] == ends[:2] and {""} == set(ends[2:])
    assert ("/start", "") == pings[0]
    assert "boom 0" in pings[1][1] and "exit" in pings[1][1].lower()
    for before, (path, _) in itertools.pairwise(pings):
        assert before[0] == "/start" or path == "/start", "every end follows its start"


@pytest.mark.slow
@pytest.mark.usefixtures("system_processes")
def test_a_killed_runners_tick_taken_over_is_told_once(
    pg_dsn: str, schema: str, tmp_path: Path
) -> None:
    """Attempt 1's runner is killed mid-run: attempt 2's start and the success are told once."""
    with receiving() as receiver:
        jobs = (
            "  long:\n"
            f'    at: "{at(2)}"\n'
            "    shell: '[ \"$PGCRON_ATTEMPT\" = 1 ] && sleep 60; echo done'\n"
            "    lease: 3s\n"
            "    heartbeat: 1s\n" + hooks(receiver, "on_start", "on_success", "on_failure")
        )
        with cluster(pg_dsn, schema, tmp_path) as running:
            replicas = running.start(running.write_config(config(schema, jobs)), 3)
            names = {r.wait_event("replica_named")["replica"]: r for r in replicas}
            wait_until(lambda: of(receiver.events(), "run_started"), 30, "attempt 1's start")
            killed = of(receiver.events(), "run_started")[0]["replica"]
            names[killed].signal(signal.SIGKILL)
            wait_until(lambda: of(receiver.events(), "run_succeeded"), 30, "the takeover's success")
            running.stop_all()
    events = receiver.events()
    assert [(1, "schedule"), (2, "takeover")] == [
        (e["attempt"], e["trigger"]) for e in of(events, "run_started")
    ]
    (success,) = of(events, "run_succeeded")
    assert (2, "takeover") == (success["attempt"], success["trigger"])
    assert killed != success["replica"]
    assert [] == of(events, "run_failed")


def test_a_ping_follows_healthchecks_or_cronitor() -> None:
    plain = Ping("https://hc-ping.com/u-1")
    assert [
        "https://hc-ping.com/u-1/start",
        "https://hc-ping.com/u-1",
        "https://hc-ping.com/u-1/fail",
    ] == [plain.url_for(state) for state in ("start", "success", "fail")]
    cronitor = Ping("https://cronitor.link/p/k/job?env=prod", cronitor=True)
    assert "https://cronitor.link/p/k/job?env=prod&state=run" == cronitor.url_for("start")
    assert "https://cronitor.link/p/k/job?env=prod&state=complete" == cronitor.url_for("success")
    assert "https://cronitor.link/p/k/job?env=prod&state=fail" == cronitor.url_for("fail")


@pytest.mark.parametrize(
    ("fields", "field", "expected"),
    [
        ("ping: {url: 'http://x', cronitr: true}", "ping", "did you mean 'cronitor'"),
        ("ping: ftp://x", "ping", "must start with http:// or https://"),
        ("on_success: {timeout: 5s}", "on_success", "set webhook:, command:, or both"),
        ("start_deadline: 10m", "start_deadline", "must be shorter than misfire_grace (5m)"),
        ("pause_after_failures: 0", "pause_after_failures", "must be a whole number 1 or more"),
        ("guard: advisory, pause_after_failures: 3", "pause_after_failures", "needs guard: lease"),
    ],
)
def test_a_bad_observer_field_is_a_config_error_naming_file_line_and_field(
    tmp_path: Path, fields: str, field: str, expected: str
) -> None:
    path = tmp_path / "jobs.yaml"
    path.write_text(
        "database: {url: 'postgresql://x@127.0.0.1/x'}\n"
        "jobs:\n"
        f"  j: {{cron: '* * * * *', command: ['true'], {fields}}}\n"
    )
    with pytest.raises(ConfigError) as caught:
        load_config([path])
    text = str(caught.value)
    assert "jobs.yaml:3" in text and f"field '{field}'" in text and expected in text


def test_the_configuration_docs_example_of_hooks_loads(tmp_path: Path) -> None:
    text = (Path(__file__).resolve().parent.parent / "docs" / "configuration.md").read_text()
    section = text[text.index("### Hooks, ping and reports") :]
    example = section[section.index("```yaml\n") + 8 : section.index("```\n", 8)]
    path = tmp_path / "jobs.yaml"
    path.write_text("database: {url: 'postgresql://x@127.0.0.1/x'}\n" + example)
    backup = load_config([path]).jobs["backup"]
    assert "https://alerts.internal/pgcrond" == getattr(backup.on_failure, "webhook", None)
    assert Ping("https://hc-ping.com/0e1c2d3f-1111-2222-3333-444455556666") == backup.ping
    assert (3, 60.0) == (backup.pause_after_failures, backup.start_deadline.total_seconds())  # type: ignore[union-attr]


def get(address: str, path: str) -> str:
    return answer(f"http://{address}{path}").raise_for_status().text


@pytest.mark.slow
@pytest.mark.usefixtures("system_processes")
def test_pause_after_failures_pauses_at_the_third_in_a_row_and_a_success_resets_it(
    pg_dsn: str, schema: str, tmp_path: Path
) -> None:
    """F F S F F F: paused after the sixth tick, not the fifth; resumed, S F: not paused."""
    count = tmp_path / "count"
    script = counted(count, 'set -- F F S F F F S F S S S S; shift $n; [ "$1" = S ]')
    with receiving() as receiver:
        jobs = flaky(script, "    pause_after_failures: 3\n" + hooks(receiver, "on_failure"))
        with cluster(pg_dsn, schema, tmp_path) as running:
            path = running.write_config(config(schema, jobs))
            (replica,) = running.start(path, 1)
            paused = replica.wait_event("job_paused", timeout=40)
            assert "6" == count.read_text().strip(), "paused after the sixth tick, not before"
            assert ("pgcrond", "failed 3 times in a row", 3) == (
                paused["by"], paused["reason"], paused["failures"]
            )  # fmt: skip
            wait_until(
                lambda: running.rows("SELECT 1 FROM {leases} WHERE status = 'SKIPPED'"),
                10,
                "a tick skipped as paused",
            )
            _, status, _ = cli(running, "status", "-c", str(path), "--json")
            page = get(replica.http_address(), "/status")
            metrics = get(replica.http_address(), "/metrics")
            code, _, err = cli(running, "resume", "flaky", "-c", str(path))
            assert 0 == code, err
            # The ninth tick runs: the eighth (a failure after a success) paused nothing.
            wait_until(lambda: count.read_text().strip() == "9", 20, "the ninth tick")
            running.stop_all()
    [entry] = json.loads(status)["jobs"]
    assert ("pgcrond", "failed 3 times in a row") == (
        entry["paused"]["by"], entry["paused"]["reason"]
    )  # fmt: skip
    assert "paused — by pgcrond: failed 3 times in a row" in html.unescape(page)
    assert 'pgcrond_paused_after_failures_total{cronjob="flaky"} 1.0' in metrics
    assert 1 == len(replica.events("job_paused"))
    told = [(e["event"], e.get("failures")) for e in receiver.events()]
    assert ("job_paused", 3) in told and 1 == told.count(("job_paused", 3))


@pytest.mark.slow
@pytest.mark.usefixtures("system_processes")
def test_max_duration_and_start_deadline_are_reported_and_the_run_goes_on(
    pg_dsn: str, schema: str, tmp_path: Path
) -> None:
    """A replica stalled over the tick starts the run late; it runs past max_duration; both
    are told, and the run still ends SUCCESS after its whole 2 s."""
    with receiving() as receiver:
        instant = at(5)
        jobs = (
            "  slow:\n"
            f'    at: "{instant}"\n'
            "    shell: 'sleep 2; echo ok'\n"
            "    max_duration: 500ms\n"
            "    start_deadline: 500ms\n" + hooks(receiver, "on_failure")
        )
        with cluster(pg_dsn, schema, tmp_path) as running:
            (replica,) = running.start(running.write_config(config(schema, jobs)), 1)
            tick = datetime.strptime(instant, "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=UTC)
            # Stopped from 1 s before the tick to 1.5 s after it: a margin for
            # this test's own sleep to wake late on a loaded machine.
            time.sleep(max(0.0, (tick - datetime.now(UTC)).total_seconds() - 1.0))
            replica.signal(signal.SIGSTOP)
            time.sleep(2.5)
            replica.signal(signal.SIGCONT)
            finished = replica.wait_event("run_finished", timeout=20)
            wait_until(lambda: len(receiver.events()) >= 2, 10, "both reports")
            metrics = get(replica.http_address(), "/metrics")
            rows = running.rows("SELECT status FROM {leases} WHERE code = 'slow'")
            running.stop_all()
    assert ("success", [{"status": "SUCCESS"}]) == (finished["outcome"], rows)
    assert finished["duration_ms"] >= 2000
    by_kind = {e["event"]: e for e in receiver.events()}
    assert {"start_overdue", "run_overdue"} == set(by_kind)
    assert by_kind["start_overdue"]["lateness_s"] > 0.5
    assert by_kind["run_overdue"]["running_s"] >= 0.5
    assert by_kind["run_overdue"]["attempt"] == 1
    assert 'pgcrond_runs_overdue_total{cronjob="slow"} 1.0' in metrics
    assert 'pgcrond_starts_overdue_total{cronjob="slow"} 1.0' in metrics


@pytest.mark.slow
@pytest.mark.usefixtures("system_processes")
def test_a_tick_missed_by_three_stalled_replicas_is_told_once(
    pg_dsn: str, schema: str, tmp_path: Path
) -> None:
    """All three stalled over the tick and past misfire_grace: one claim records it MISSED
    and only that replica tells on_missed."""
    with receiving() as receiver:
        instant = at(5)
        jobs = (
            "  missable:\n"
            f'    at: "{instant}"\n'
            "    command: ['true']\n"
            "    lease: 1s\n"
            "    misfire_grace: 2s\n" + hooks(receiver, "on_missed", "on_start")
        )
        with cluster(pg_dsn, schema, tmp_path) as running:
            replicas = running.start(running.write_config(config(schema, jobs)), 3)
            tick = datetime.strptime(instant, "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=UTC)
            # Stopped from 2.5 s before the tick to 3 s past it, past misfire_grace.
            time.sleep(max(0.0, (tick - datetime.now(UTC)).total_seconds() - 2.5))
            for replica in replicas:
                replica.signal(signal.SIGSTOP)
            time.sleep(5.5)
            for replica in replicas:
                replica.signal(signal.SIGCONT)

            def decided(replica: Any) -> bool:
                # Its own claim's answer, or (a replica that left the tick to
                # the one preferred for it) the look that found it settled:
                # neither fired nor followed (its only tick).
                return any(
                    e.get("run_key") == instant
                    for e in replica.events("tick_missed") + replica.events("claim_lost")
                ) or any(
                    e["ticks"] > e["fired"] + e["followed"]
                    for e in replica.events("deferred_looked")
                )

            wait_until(lambda: all(decided(r) for r in replicas), 20, "each replica's claim")
            wait_until(receiver.events, 10, "the on_missed hook")
            sent = [
                e
                for r in replicas
                for e in r.events("hook_sent")
                if e.get("hook_event") == "tick_missed"
            ]
            rows = running.rows("SELECT status, reason FROM {leases} WHERE code = 'missable'")
            running.stop_all()
    (missed,) = receiver.events()
    assert ("tick_missed", instant, "late") == (missed["event"], missed["run_key"], missed["error"])
    assert 1 == len(sent)
    assert [{"status": "MISSED", "reason": "late"}] == rows


def test_a_ping_url_is_shown_as_a_digest_in_the_jobs_definition(tmp_path: Path) -> None:
    """The registry and `plan` show a changed ping, never the URL that reports the check."""
    path = tmp_path / "jobs.yaml"
    path.write_text(
        "database: {url: 'postgresql://x@127.0.0.1/x'}\n"
        "jobs:\n"
        "  j: {cron: '* * * * *', command: ['true'], ping: 'https://hc-ping.com/u-secret-1'}\n"
    )
    shown = definition(load_config([path]).jobs["j"])
    assert "u-secret-1" not in json.dumps(shown)
    assert str(shown["ping"]["url"]).startswith("sha256:")
    assert (False, 2) == (shown["ping"]["cronitor"], shown["ping"]["retries"])


def test_only_a_job_with_a_hook_ping_report_or_pause_rule_is_observed(tmp_path: Path) -> None:
    """The observers are told of these jobs' fires only (daemon/observers.py's Watched)."""
    path = tmp_path / "jobs.yaml"
    path.write_text(
        "database: {url: 'postgresql://x@127.0.0.1/x'}\n"
        "jobs:\n"
        "  plain: {cron: '* * * * *', command: ['true']}\n"
        "  pinged: {cron: '* * * * *', command: ['true'], ping: 'https://hc-ping.com/u'}\n"
        "  timed: {cron: '* * * * *', command: ['true'], max_duration: 1h}\n"
        "  paused: {cron: '* * * * *', command: ['true'], pause_after_failures: 2}\n"
        "  told: {cron: '* * * * *', command: ['true'], on_missed: {command: ['true']}}\n"
    )
    jobs = load_config([path]).jobs
    assert {"pinged", "timed", "paused", "told"} == {c for c, j in jobs.items() if j.observed}
