"""The shipped alert rules (deploy/prometheus/): valid for promtool, and firing on real metrics.

``promtool check rules`` validates both files (the PrometheusRule's ``spec``
is a rules file of its own); ``promtool test rules`` runs the stale, failing,
missed and no-replica rules against series whose names, labels and values
were scraped from a real ``pgcrond run`` (restarted in between: the gauges it
shows come from the lease table, not from this process's own runs). A real
Prometheus, scraping a real daemon every second, evaluates every rule's
expression and every query of the Grafana dashboard (deploy/grafana/). Each
rule's runbook_url names a section of docs/operations.md. Skipped only when
promtool or prometheus is not installed (Debian: ``apt-get install prometheus``).
"""

from __future__ import annotations

import contextlib
import json
import re
import shutil
import signal
import socket
import subprocess
import time
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families

from pgcrond.daemon.metrics import Metrics
from tests.helpers.daemon_harness import LEDGER, ROOT, Replica, cluster, config, wait_until
from tests.helpers.http import answer

RULES = ROOT / "deploy" / "prometheus" / "pgcrond-rules.yaml"
OPERATOR = ROOT / "deploy" / "prometheus" / "prometheusrule.yaml"
OPERATIONS = ROOT / "docs" / "operations.md"
RUNBOOK = "https://github.com/pgcrond/pgcrond/blob/main/docs/operations.md#"
DASHBOARD = ROOT / "deploy" / "grafana" / "pgcrond-dashboard.json"
PROMTOOL = shutil.which("promtool")
PROMETHEUS = shutil.which("prometheus")
needs_promtool = pytest.mark.skipif(
    PROMTOOL is None, reason="promtool not installed (Debian package prometheus)"
)
needs_prometheus = pytest.mark.skipif(
    PROMETHEUS is None, reason="prometheus not installed (Debian package prometheus)"
)
Sample = tuple[str, dict[str, str], float]


def promtool(*args: str) -> subprocess.CompletedProcess[str]:
    assert PROMTOOL is not None
    return subprocess.run(
        [PROMTOOL, *args], capture_output=True, text=True, timeout=60, check=False
    )


def rules_of(path: Path) -> list[dict[str, Any]]:
    document = yaml.safe_load(path.read_text())
    groups = document["spec"]["groups"] if "spec" in document else document["groups"]
    return [rule for group in groups for rule in group["rules"]]


def test_the_prometheusrule_holds_the_plain_rules_and_the_kubernetes_readiness_one() -> None:
    plain, operator = rules_of(RULES), rules_of(OPERATOR)
    assert plain == operator[: len(plain)]
    assert ["PgcrondNoReadyReplica"] == [rule["alert"] for rule in operator[len(plain) :]]
    assert {
        "PgcrondJobStale",
        "PgcrondJobFailing",
        "PgcrondTicksMissed",
        "PgcrondNoReplicaUp",
        "PgcrondConfigDrift",
    } == {rule["alert"] for rule in plain}
    document = yaml.safe_load(OPERATOR.read_text())
    assert ("monitoring.coreos.com/v1", "PrometheusRule") == (
        document["apiVersion"],
        document["kind"],
    )


def github_anchors(markdown: str) -> set[str]:
    """The fragment GitHub gives each heading: lower case, punctuation but - and _ dropped."""
    headings = re.findall(r"^#+ (.+)$", markdown, flags=re.MULTILINE)
    return {re.sub(r"[^\w\- ]", "", heading.lower()).replace(" ", "-") for heading in headings}


def test_every_alert_links_its_runbook_section_in_operations_md() -> None:
    anchors = github_anchors(OPERATIONS.read_text())
    rules = rules_of(OPERATOR)
    assert rules  # the PrometheusRule holds every plain rule too
    for rule in rules:
        url = rule["annotations"].get("runbook_url", "")
        assert url.startswith(RUNBOOK), f"{rule['alert']}: runbook_url {url!r}"
        assert url.removeprefix(RUNBOOK) in anchors, (
            f"{rule['alert']}: no heading in docs/operations.md has the anchor of {url}"
        )


@needs_promtool
@pytest.mark.usefixtures("system_processes")
def test_promtool_accepts_both_rule_files(tmp_path: Path) -> None:
    spec = tmp_path / "prometheusrule-spec.yaml"
    spec.write_text(yaml.safe_dump(yaml.safe_load(OPERATOR.read_text())["spec"]))
    checked = promtool("check", "rules", str(RULES), str(spec))
    assert 0 == checked.returncode, checked.stdout + checked.stderr
    assert "SUCCESS: 5 rules found" in checked.stdout
    assert "SUCCESS: 6 rules found" in checked.stdout


def scrape(replica: Replica) -> list[Sample]:
    url = f"http://{replica.http_address()}/metrics"
    text = answer(url, timeout=5).raise_for_status().text
    return [
        (sample.name, dict(sample.labels), sample.value)
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    ]


def value(samples: list[Sample], name: str, job: str) -> float | None:
    return next((v for n, labels, v in samples if n == name and labels.get("cronjob") == job), None)


def readyz(replica: Replica) -> str:
    url = f"http://{replica.http_address()}/readyz"
    response = answer(url, timeout=5)
    assert 200 == response.status_code  # a stale job never fails readiness
    return response.text


def series(samples: list[Sample], instance: str, *names: str) -> dict[str, float]:
    """Scraped samples as promtool series: labels as scraped (honor_labels), plus instance."""
    found = {}
    for name, labels, sample_value in samples:
        if name in names:
            shown = ", ".join(
                f'{k}="{v}"' for k, v in sorted({**labels, "instance": instance}.items())
            )
            found[f"{name}{{{shown}}}"] = sample_value
    return found


def flat(found: dict[str, float], points: int = 20) -> list[dict[str, str]]:
    return [{"series": s, "values": f"{v!r}x{points}"} for s, v in found.items()]


@needs_promtool
@pytest.mark.slow
@pytest.mark.usefixtures("system_processes")
def test_the_shipped_rules_fire_on_a_real_daemons_metrics_after_a_restart(
    pg_dsn: str, schema: str, tmp_path: Path
) -> None:
    jobs = (
        f'  ok: {{cron: "* * * * * *", entrypoint: {LEDGER}, alert_after: 1h}}\n'
        '  broken: {cron: "* * * * * *", shell: "exit 3", alert_after: 2s}\n'
    )
    # After the restart nothing fires: what the gauges show is the table's truth.
    quiet = jobs.replace('"* * * * * *"', '"0 0 1 1 *"')
    with cluster(pg_dsn, schema, tmp_path) as running:
        path = running.write_config(config(schema, jobs))
        (first,) = running.start(path, 1)

        def two_failures() -> bool:
            found = scrape(first)
            failures = value(found, "pgcrond_job_consecutive_failures", "broken") or 0
            return (
                failures >= 2
                and value(found, "pgcrond_job_last_success_timestamp_seconds", "ok") is not None
            )

        wait_until(two_failures, 20, "two failures of broken and a success of ok")
        first.signal(signal.SIGTERM)
        assert 0 == first.wait_exit(60)
        truth = running.rows(
            "SELECT code, max(finished_at) FILTER (WHERE status = 'SUCCESS') AS ok_at, "
            "max(finished_at) FILTER (WHERE status = 'FAIL') AS failed_at, "
            "count(*) FILTER (WHERE status = 'FAIL' AND retry_at IS NULL) AS failures "
            "FROM {leases} GROUP BY code"
        )
        running.write_config(config(schema, quiet))
        (second,) = running.start(path, 1, first=1)
        second.wait_event("alerts_seeded")
        samples = wait_until(
            lambda: (
                (found := scrape(second))
                and value(found, "pgcrond_job_stale", "broken") == 1.0
                and found
            ),
            15,
            "broken to be stale on the restarted replica",
        )
        detail = readyz(second)
    by_code = {row["code"]: row for row in truth}
    # Seeded from the table, to the microsecond, by a replica that ran nothing.
    assert by_code["ok"]["ok_at"].timestamp() == value(
        samples, "pgcrond_job_last_success_timestamp_seconds", "ok"
    )
    assert by_code["broken"]["failed_at"].timestamp() == value(
        samples, "pgcrond_job_last_failure_timestamp_seconds", "broken"
    )
    failures = value(samples, "pgcrond_job_consecutive_failures", "broken")
    assert by_code["broken"]["failures"] == failures
    assert 0.0 == value(samples, "pgcrond_job_stale", "ok")
    assert "stale: broken: no success for" in detail
    assert "stale: ok" not in detail

    names = (
        "pgcrond_job_stale",
        "pgcrond_job_paused",
        "pgcrond_job_consecutive_failures",
        "pgcrond_job_last_success_timestamp_seconds",
        "pgcrond_job_last_failure_timestamp_seconds",
    )
    scraped = series(samples, "replica-1", *names)
    stale_broken = [
        s for s in scraped if s.startswith("pgcrond_job_stale{") and 'cronjob="broken"' in s
    ]
    assert 1 == len(stale_broken)
    # The same replica's series, and another replica that saw broken succeed just now.
    saw_success = {s.replace('"replica-1"', '"replica-2"'): v for s, v in scraped.items()}
    saw_success[stale_broken[0].replace('"replica-1"', '"replica-2"')] = 0.0
    missed = list(series(samples, "replica-1", "pgcrond_missed_total"))
    assert missed  # present at 0 for each job and cause from the start
    stale_alert = {
        "exp_labels": {"cronjob": "broken", "severity": "warning"},
        "exp_annotations": rendered("PgcrondJobStale", "broken", 1.0),
    }
    failing_alert = {
        "exp_labels": {"cronjob": "broken", "severity": "warning"},
        "exp_annotations": rendered("PgcrondJobFailing", "broken", failures or 0),
    }
    missed_job = missed[0].split('cronjob="')[1].split('"')[0]
    tests = [
        {
            "interval": "1m",
            "input_series": flat(scraped),
            "alert_rule_test": [
                {"eval_time": "1m", "alertname": "PgcrondJobStale", "exp_alerts": []},
                {"eval_time": "5m", "alertname": "PgcrondJobStale", "exp_alerts": [stale_alert]},
                {"eval_time": "5m", "alertname": "PgcrondJobFailing", "exp_alerts": []},
                {
                    "eval_time": "15m",
                    "alertname": "PgcrondJobFailing",
                    "exp_alerts": [failing_alert],
                },
            ],
        },
        {
            # Stale only when every replica says so.
            "interval": "1m",
            "input_series": flat(scraped) + flat(saw_success),
            "alert_rule_test": [
                {"eval_time": "10m", "alertname": "PgcrondJobStale", "exp_alerts": []},
            ],
        },
        {
            "interval": "1m",
            "input_series": [
                {"series": missed[0], "values": "0 0 0 1 1 1 1 1 1 1"},
                {"series": 'up{instance="replica-1", job="pgcrond"}', "values": "0x10"},
            ],
            "alert_rule_test": [
                {"eval_time": "2m", "alertname": "PgcrondTicksMissed", "exp_alerts": []},
                {
                    "eval_time": "4m",
                    "alertname": "PgcrondTicksMissed",
                    "exp_alerts": [
                        {
                            "exp_labels": {"cronjob": missed_job, "severity": "warning"},
                            "exp_annotations": rendered("PgcrondTicksMissed", missed_job, 0),
                        }
                    ],
                },
                {
                    "eval_time": "3m",
                    "alertname": "PgcrondNoReplicaUp",
                    "exp_alerts": [
                        {
                            "exp_labels": {"severity": "critical"},
                            "exp_annotations": rendered("PgcrondNoReplicaUp", "", 0),
                        }
                    ],
                },
            ],
        },
    ]
    test_file = tmp_path / "rules-test.yaml"
    test_file.write_text(
        yaml.safe_dump({"rule_files": [str(RULES)], "evaluation_interval": "1m", "tests": tests})
    )
    tested = promtool("test", "rules", str(test_file))
    assert 0 == tested.returncode, tested.stdout + tested.stderr + test_file.read_text()
    assert "SUCCESS" in tested.stdout


def rendered(alert: str, job: str, alert_value: float) -> dict[str, str]:
    """The rule's annotations as Prometheus renders them for this job and value."""
    (rule,) = [r for r in rules_of(RULES) if r["alert"] == alert]
    shown = f"{alert_value:g}"
    return {
        key: text.replace("{{ $labels.cronjob }}", job).replace("{{ $value }}", shown)
        for key, text in rule["annotations"].items()
    }


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port


@contextlib.contextmanager
def prometheus(workdir: Path, target: str) -> Iterator[httpx.Client]:
    """A real Prometheus scraping ``target`` every second, with the shipped rules loaded."""
    assert PROMETHEUS is not None
    config = workdir / "prometheus.yml"
    config.write_text(
        yaml.safe_dump(
            {
                "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
                "rule_files": [str(RULES)],
                "scrape_configs": [
                    {"job_name": "pgcrond", "static_configs": [{"targets": [target]}]}
                ],
            }
        )
    )
    address = f"127.0.0.1:{free_port()}"
    with (workdir / "prometheus.log").open("wb") as log:
        server = subprocess.Popen(
            [
                PROMETHEUS,
                f"--config.file={config}",
                f"--storage.tsdb.path={workdir / 'tsdb'}",
                f"--web.listen-address={address}",
            ],
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=log,
        )
    try:
        with httpx.Client(base_url=f"http://{address}", timeout=5) as client:

            def ready() -> bool:
                assert server.poll() is None, (workdir / "prometheus.log").read_text()[-3000:]
                with contextlib.suppress(httpx.TransportError):
                    return client.get("/-/ready").status_code == 200
                return False

            wait_until(ready, 30, "prometheus to be ready")
            yield client
    finally:
        server.terminate()
        server.wait(30)


def query(client: httpx.Client, expr: str) -> list[dict[str, Any]]:
    """The instant vector ``expr`` returns now (an error in the query fails the test)."""
    answer = client.get("/api/v1/query", params={"query": expr}).json()
    assert "success" == answer["status"], f"{expr}: {answer}"
    result: list[dict[str, Any]] = answer["data"]["result"]
    return result


def panel_queries() -> dict[str, str]:
    """Every dashboard panel's queries, with Grafana's variables as a user would pick them."""
    dashboard = json.loads(DASHBOARD.read_text())
    chosen = {"$job": "pgcrond", "$cronjob": ".*", "$__rate_interval": "10s"}
    found = {}
    for panel in dashboard["panels"]:
        for target in panel["targets"]:
            expr = target["expr"]
            for variable, value in chosen.items():
                expr = expr.replace(variable, value)
            assert "$" not in expr, f"{panel['title']}: a variable the test does not set"
            found[f"{panel['title']} {target['refId']}"] = expr
    return found


@needs_prometheus
@pytest.mark.slow
@pytest.mark.usefixtures("system_processes")
def test_every_rule_and_dashboard_query_returns_data_from_prometheus_scraping_a_real_daemon(
    pg_dsn: str, schema: str, tmp_path: Path
) -> None:
    """A failing job, a stale one and a missed tick, scraped by a real Prometheus.

    The missed ticks: ``gap`` (misfire_grace 1s) has no replica while the
    daemon is stopped, and the restarted one records them MISSED/no_replica
    on the same scrape target. Every alert's expression is evaluated (not its
    firing state: ``for:`` is minutes), PgcrondNoReplicaUp while no replica is up.
    """
    jobs = (
        f'  ok: {{cron: "* * * * * *", entrypoint: {LEDGER}, alert_after: 1h}}\n'
        '  broken: {cron: "* * * * * *", shell: "exit 3", alert_after: 2s}\n'
        '  gap: {cron: "* * * * * *", command: ["true"], misfire_grace: 1s, lease: 500ms}\n'
    )
    port = free_port()
    expressions = {rule["alert"]: rule["expr"] for rule in rules_of(RULES)}
    with cluster(pg_dsn, schema, tmp_path) as running:
        path = running.write_config(config(schema, jobs))

        def start(name: str) -> Replica:
            replica = Replica(
                name,
                path,
                tmp_path / f"{name}.log",
                running.env(),
                extra_args=["--http", f"127.0.0.1:{port}"],
            ).start()
            running.replicas.append(replica)
            replica.wait_event("daemon_ready", timeout=30)
            return replica

        first = start("replica-1")
        with prometheus(tmp_path, f"127.0.0.1:{port}") as client:

            def rule_health() -> dict[str, str]:
                groups = client.get("/api/v1/rules").json()["data"]["groups"]
                return {rule["name"]: rule["health"] for g in groups for rule in g["rules"]}

            # Prometheus loaded and evaluated each shipped rule without an error.
            everything_ok = {name: "ok" for name in expressions}
            wait_until(lambda: rule_health() == everything_ok, 15, "the rules' evaluation")

            # The next fire follows the fires: a later tick than a moment ago.
            def next_fire(code: str) -> float | None:
                found = query(client, f'pgcrond_next_fire_timestamp_seconds{{cronjob="{code}"}}')
                return float(found[0]["value"][1]) if found else None

            seen: float = wait_until(lambda: next_fire("ok"), 15, "a next fire of ok")
            assert seen > time.time() - 2  # per-second job: at most a scrape behind
            wait_until(lambda: (next_fire("ok") or 0) > seen, 15, "the next fire of ok to move on")
            # A reload adds a job: its next fire shows without a restart.
            running.write_config(
                config(schema, jobs + '  yearly: {cron: "0 0 1 1 *", command: ["true"]}\n')
            )
            first.signal(signal.SIGHUP)
            first.wait_event("config_reloaded")
            new_year = datetime(datetime.now(UTC).year + 1, 1, 1, tzinfo=UTC).timestamp()
            wait_until(lambda: next_fire("yearly") == new_year, 15, "yearly's next fire")

            first.signal(signal.SIGTERM)
            assert 0 == first.wait_exit(60)
            stopped = time.time()
            # No replica up: the one alert that needs none.
            wait_until(
                lambda: query(client, expressions["PgcrondNoReplicaUp"]),
                15,
                "PgcrondNoReplicaUp's expression to return data",
            )
            # gap's ticks (misfire_grace 1s) must be past their window when the
            # next replica scans, so that it records them MISSED.
            wait_until(lambda: time.time() > stopped + 2.5, 5, "gap's missed window")
            second = start("replica-2")
            second.wait_event(
                "ticks_accounted", where=lambda e: e.get("job") == "gap" and e["missed"] > 0
            )

            # The replicas agree, so the drift rule's condition holds no sample;
            # its series must be there, and its expression evaluate.
            quiet = {"PgcrondNoReplicaUp", "PgcrondConfigDrift"}
            wanted = {
                **{name: expr for name, expr in expressions.items() if name not in quiet},
                **panel_queries(),
                "pgcrond_config_drift": "max(pgcrond_config_drift) == 0",
            }
            assert [] == query(client, expressions["PgcrondConfigDrift"])

            def empty() -> list[str]:
                return [name for name, expr in wanted.items() if not query(client, expr)]

            with contextlib.suppress(AssertionError):
                wait_until(lambda: not empty(), 30, "every rule and panel to return data")
            assert [] == empty(), "no data from these rules and panels"
            stale = query(client, expressions["PgcrondJobStale"])
            failing = query(client, expressions["PgcrondJobFailing"])
            missed = query(client, expressions["PgcrondTicksMissed"])
    assert ["broken"] == [sample["metric"]["cronjob"] for sample in stale]
    assert ["broken"] == [sample["metric"]["cronjob"] for sample in failing]
    assert "gap" in [sample["metric"]["cronjob"] for sample in missed]


@needs_promtool
@pytest.mark.usefixtures("system_processes")
def test_the_drift_rule_fires_once_replicas_disagree_for_15_minutes(tmp_path: Path) -> None:
    """A rollout that finishes within 15 minutes stays quiet; one that stalls alerts."""
    exported = {sample.name for family in Metrics().registry.collect() for sample in family.samples}
    assert "pgcrond_config_drift" in exported
    alert = {
        "exp_labels": {"severity": "warning"},
        "exp_annotations": rendered("PgcrondConfigDrift", "", 1.0),
    }
    tests = [
        {
            "interval": "1m",
            "input_series": [
                # Two replicas: both report the drift while one lags behind.
                {"series": 'pgcrond_config_drift{instance="replica-1"}', "values": "0 1x20"},
                {"series": 'pgcrond_config_drift{instance="replica-2"}', "values": "0 1x20"},
                # A rollout done in ten minutes.
                {"series": 'pgcrond_config_drift{instance="replica-3"}', "values": "0 1x9 0x10"},
            ],
            "alert_rule_test": [
                {"eval_time": "14m", "alertname": "PgcrondConfigDrift", "exp_alerts": []},
                {"eval_time": "17m", "alertname": "PgcrondConfigDrift", "exp_alerts": [alert]},
            ],
        },
        {
            "interval": "1m",
            "input_series": [
                {"series": 'pgcrond_config_drift{instance="replica-1"}', "values": "0 1x9 0x10"},
            ],
            "alert_rule_test": [
                {"eval_time": "20m", "alertname": "PgcrondConfigDrift", "exp_alerts": []},
            ],
        },
    ]
    test_file = tmp_path / "drift-test.yaml"
    test_file.write_text(
        yaml.safe_dump({"rule_files": [str(RULES)], "evaluation_interval": "1m", "tests": tests})
    )
    tested = promtool("test", "rules", str(test_file))
    assert 0 == tested.returncode, tested.stdout + tested.stderr
    assert "SUCCESS" in tested.stdout
