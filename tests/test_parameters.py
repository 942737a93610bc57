"""Parameters and the trigger kind: what a manual run hands its job, and why a run runs.

Pure rules first: which ``--env`` names a job takes (a variable name, not
``PGCRON_*``, one of its ``params:`` when it declares them), which values are
shown as ``***``, which kind an attempt is for each fire and claim. Then the
real thing: two replicas, ``pgcrond trigger --env`` through a request, the job
seeing its parameters and ``PGCRON_TRIGGER`` (as a variable and as
``ctx.trigger``), the kind in its attempt record, and both in ``pgcrond
history`` and ``pgcrond logs``, with the secret-looking value in no output
and no log line.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from pgcrond.config.loader import load_config
from pgcrond.core import params
from pgcrond.core.trigger import FIRE_KINDS, attempt_trigger
from pgcrond.errors import ConfigError
from tests.helpers.daemon_harness import PGCROND, cluster, config, quiet_cron, wait_until

# -- the rules ----------------------------------------------------------------------------


def test_env_assignments_become_parameters_of_declared_names() -> None:
    given = params.parse(["DAY=2026-11-30", "NOTE=a=b c"], code="report", declared=("DAY", "NOTE"))
    assert {"DAY": "2026-11-30", "NOTE": "a=b c"} == given
    # Undeclared: any valid name.
    assert {"X_1": ""} == params.parse(["X_1="], code="report", declared=None)


@pytest.mark.parametrize(
    ("assignment", "declared", "expected"),
    [
        (
            "DAYS=3",
            ("DAY", "DRY_RUN"),
            "--env DAYS: job 'report' does not declare it (params: DAY, DRY_RUN)",
        ),
        ("DAY", None, "--env 'DAY': expected NAME=VALUE"),
        ("1DAY=x", None, "is not a variable name"),
        ("MY-VAR=x", None, "is not a variable name"),
        ("PGCRON_TRIGGER=schedule", None, "'PGCRON_TRIGGER' is reserved"),
        ("DAY=a\0b", None, "NUL"),
    ],
)
def test_a_bad_parameter_is_refused_with_its_name(
    assignment: str, declared: tuple[str, ...] | None, expected: str
) -> None:
    with pytest.raises(ValueError) as caught:
        params.parse([assignment], code="report", declared=declared)
    assert expected in str(caught.value)


def test_a_parameter_given_twice_is_refused() -> None:
    with pytest.raises(ValueError, match="DAY: given twice"):
        params.parse(["DAY=1", "DAY=2"], code="report", declared=None)


def test_values_of_secret_looking_names_are_shown_masked() -> None:
    shown = params.shown({"DAY": "2026-11-30", "API_TOKEN": "t0ps3cret", "db_password": "x"})
    assert {"DAY": "2026-11-30", "API_TOKEN": "***", "db_password": "***"} == shown
    assert "DAY=2026-11-30 API_TOKEN=***" == params.text({"DAY": "2026-11-30", "API_TOKEN": "v"})


@pytest.mark.parametrize("asked", FIRE_KINDS)
def test_a_claim_of_a_fresh_row_runs_as_asked_and_a_takeover_is_one(asked: str) -> None:
    assert asked == attempt_trigger(asked, None)  # type: ignore[arg-type]
    assert "takeover" == attempt_trigger(asked, "takeover")


def test_a_reclaimed_failure_is_a_retry_unless_a_request_asked_for_it() -> None:
    assert "retry" == attempt_trigger("schedule", "retry")
    assert "retry" == attempt_trigger("catch_up", "retry")
    assert "retry" == attempt_trigger("retry", "retry")
    # A backfill files its ticks as FAIL rows due now; a manual run may find one.
    assert "backfill" == attempt_trigger("backfill", "retry")
    assert "manual" == attempt_trigger("manual", "retry")


def test_params_in_the_config_must_be_variable_names_and_not_reserved(tmp_path: Path) -> None:
    path = tmp_path / "jobs.yaml"
    path.write_text(
        "database: {url: 'postgresql://x@127.0.0.1/x'}\n"
        "jobs:\n"
        "  a: {cron: '0 3 * * *', command: ['true'], params: [DAY, DRY_RUN]}\n"
        "  b: {cron: '0 3 * * *', command: ['true'], params: [PGCRON_DAY]}\n"
        "  c: {cron: '0 3 * * *', command: ['true'], params: [DAY, DAY]}\n"
    )
    with pytest.raises(ConfigError) as caught:
        load_config([path])
    text = str(caught.value)
    assert "jobs.yaml:4: job 'b': field 'params': entry 0: 'PGCRON_DAY' is reserved" in text
    assert "jobs.yaml:5: job 'c': field 'params': entry 1: 'DAY' is listed twice" in text
    path.write_text(
        "database: {url: 'postgresql://x@127.0.0.1/x'}\njobs:\n"
        "  a: {cron: '0 3 * * *', command: ['true'], params: [DAY, DRY_RUN]}\n"
        "  d: {cron: '0 3 * * *', command: ['true']}\n"
    )
    jobs = load_config([path]).jobs
    assert ("DAY", "DRY_RUN") == jobs["a"].params
    assert jobs["d"].params is None


def test_the_configuration_docs_example_of_params_loads(tmp_path: Path) -> None:
    text = (Path(__file__).resolve().parent.parent / "docs" / "configuration.md").read_text()
    section = text[text.index("### Parameters: params") :]
    example = section[section.index("```yaml\n") + 8 : section.index("```\n", 8)]
    path = tmp_path / "jobs.yaml"
    path.write_text("database: {url: 'postgresql://x@127.0.0.1/x'}\n" + example)
    assert ("DAY", "DRY_RUN") == load_config([path]).jobs["report"].params


# -- through a real run -------------------------------------------------------------------

SECRET = "s3cr3t-t0ken-value"


def pgcrond(running_env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(PGCROND), *args],
        check=False,
        capture_output=True,
        text=True,
        env=running_env,
        timeout=60,
    )


@pytest.mark.slow
@pytest.mark.usefixtures("system_processes")
def test_trigger_env_reaches_the_job_and_is_recorded_and_shown(
    pg_dsn: str, schema: str, tmp_path: Path
) -> None:
    out = tmp_path / "context.json"
    ticked = tmp_path / "ticked.json"
    jobs = (
        f"  report:\n"
        f'    cron: "{quiet_cron()}"\n'
        f"    entrypoint: tests.jobs_fixture:write_context\n"
        f"    env: {{OUT: '{out}'}}\n"
        f"    params: [DAY, API_TOKEN]\n"
        f"  ticking:\n"
        f"    every: 1s\n"
        f"    entrypoint: tests.jobs_fixture:write_context\n"
        f"    env: {{OUT: '{ticked}'}}\n"
    )
    with cluster(pg_dsn, schema, tmp_path) as running:
        path = running.write_config(config(schema, jobs))
        replicas = running.start(path, 2)
        for replica in replicas:
            replica.wait_event("requests_listening", timeout=10)
        env = running.env()
        refused = pgcrond(env, "trigger", "-c", str(path), "report", "--env", "DAYS=3")
        done = pgcrond(
            env,
            "trigger",
            "-c",
            str(path),
            "report",
            "--env",
            "DAY=2026-11-30",
            "--env",
            f"API_TOKEN={SECRET}",
        )
        seen = json.loads(out.read_text())
        run_key = seen["run_key"]
        history = pgcrond(env, "history", "-c", str(path), "--job", "report")
        history_json = pgcrond(env, "history", "-c", str(path), "--job", "report", "--json")
        logs = pgcrond(env, "logs", "-c", str(path), "report")
        # A scheduled tick of the other job says so too.
        scheduled = wait_until(
            lambda: ticked.exists() and json.loads(ticked.read_text()), 15, "a tick"
        )
        recorded = running.rows(
            f'SELECT leases.run_key, a.trigger FROM {{leases}} JOIN "{schema}".leases_attempts a '
            "ON a.lease_id = leases.id WHERE leases.code = 'report'"
        )
        taken = [e for r in replicas for e in r.events("request_taken")]
        log_text = "".join(r.log_path.read_text() for r in replicas)
    assert 2 == refused.returncode
    assert "--env DAYS: job 'report' does not declare it (params: DAY, API_TOKEN)" in refused.stderr
    assert 0 == done.returncode, (done.stdout, done.stderr)
    # In the job: the parameters as variables, and why it runs, as a variable and in ctx.
    assert "manual" == seen["trigger"] == seen["env"]["PGCRON_TRIGGER"]
    assert ("2026-11-30", SECRET) == (seen["env"]["DAY"], seen["env"]["API_TOKEN"])
    assert "schedule" == scheduled["trigger"] == scheduled["env"]["PGCRON_TRIGGER"]
    # In the record, and shown: the secret-looking value as *** only.
    assert [{"run_key": run_key, "trigger": "manual"}] == recorded
    (entry,) = json.loads(history_json.stdout)
    assert {"DAY": "2026-11-30", "API_TOKEN": "***"} == entry["params"]
    assert ["manual"] == [a["trigger"] for a in entry["attempts"]]
    assert "TRIGGER" in history.stdout and " manual " in history.stdout, history.stdout
    assert "└ params" in history.stdout and "DAY=2026-11-30 API_TOKEN=***" in history.stdout
    assert "trigger manual, params DAY=2026-11-30 API_TOKEN=***" in logs.stdout, logs.stdout
    assert [{"DAY": "2026-11-30", "API_TOKEN": "***"}] == [e["params"] for e in taken]
    for text in (
        done.stdout,
        done.stderr,
        history.stdout,
        history_json.stdout,
        logs.stdout,
        log_text,
    ):
        assert SECRET not in text
