"""The shipped alert rules (deploy/prometheus/): valid for promtool, and firing on real metrics.

``promtool check rules`` validates both files (the PrometheusRule's ``spec``
is a rules file of its own); ``promtool test rules`` runs the stale, failing,
missed and no-replica rules against series whose names, labels and values
were scraped from a real ``pgcrond run`` (restarted in between: the gauges it
shows come from the lease table, not from this process's own runs). Skipped
only when promtool is not installed (Debian: ``apt-get install prometheus``).
"""

from __future__ import annotations

import shutil
import signal
import subprocess
import urllib.request
from pathlib import Path
from typing import Any

import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families

from pgcrond.daemon.metrics import Metrics
from tests.daemon_harness import ROOT, Replica, cluster, wait_until
from tests.test_daemon import LEDGER, config

RULES = ROOT / "deploy" / "prometheus" / "pgcrond-rules.yaml"
OPERATOR = ROOT / "deploy" / "prometheus" / "prometheusrule.yaml"
PROMTOOL = shutil.which("promtool")
needs_promtool = pytest.mark.skipif(
    PROMTOOL is None, reason="promtool not installed (Debian package prometheus)"
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
    with urllib.request.urlopen(url, timeout=5) as response:
        text = response.read().decode()
    return [
        (sample.name, dict(sample.labels), sample.value)
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    ]


def value(samples: list[Sample], name: str, job: str) -> float | None:
    return next((v for n, labels, v in samples if n == name and labels.get("job") == job), None)


def readyz(replica: Replica) -> str:
    url = f"http://{replica.http_address()}/readyz"
    with urllib.request.urlopen(url, timeout=5) as response:
        assert 200 == response.status  # a stale job never fails readiness
        return str(response.read().decode())


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
        s for s in scraped if s.startswith("pgcrond_job_stale{") and 'job="broken"' in s
    ]
    assert 1 == len(stale_broken)
    # The same replica's series, and another replica that saw broken succeed just now.
    saw_success = {s.replace('"replica-1"', '"replica-2"'): v for s, v in scraped.items()}
    saw_success[stale_broken[0].replace('"replica-1"', '"replica-2"')] = 0.0
    missed = list(series(samples, "replica-1", "pgcrond_missed_total"))
    assert missed  # present at 0 for each job and cause from the start
    stale_alert = {
        "exp_labels": {"job": "broken", "severity": "warning"},
        "exp_annotations": rendered("PgcrondJobStale", "broken", 1.0),
    }
    failing_alert = {
        "exp_labels": {"job": "broken", "severity": "warning"},
        "exp_annotations": rendered("PgcrondJobFailing", "broken", failures or 0),
    }
    missed_job = missed[0].split('job="')[1].split('"')[0]
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
                            "exp_labels": {"job": missed_job, "severity": "warning"},
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
        key: text.replace("{{ $labels.job }}", job).replace("{{ $value }}", shown)
        for key, text in rule["annotations"].items()
    }


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
