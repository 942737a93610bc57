"""Config that protects its user: its footguns are refused or explained."""

from __future__ import annotations

import io
import json
import textwrap
from pathlib import Path

import pytest

from pgcrond.cli import main
from pgcrond.config.loader import load_config
from pgcrond.errors import ConfigError, ConfigIssue, ExitCode

EMBEDDED = "database: {embedded: true}\n"


def write(tmp_path: Path, text: str, name: str = "pgcrond.yaml") -> Path:
    path = tmp_path / name
    path.write_text(textwrap.dedent(text))
    return path


def issues_of(paths: list[Path | str], **kwargs: object) -> list[ConfigIssue]:
    with pytest.raises(ConfigError) as raised:
        load_config(paths, environ={}, **kwargs)  # type: ignore[arg-type]
    return list(raised.value.issues)


@pytest.fixture(autouse=True)
def _no_database_url(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("PGCROND_DATABASE_URL", raising=False)


# --- durations need a unit ----------------------------------------------------------


@pytest.mark.parametrize("value", ["90", "'90'"])
def test_a_bare_number_is_refused_suggesting_seconds_or_milliseconds(
    tmp_path: Path, value: str
) -> None:
    path = write(
        tmp_path,
        EMBEDDED + f"jobs:\n  j:\n    once: true\n    command: [x]\n    timeout: {value}\n",
    )
    (issue,) = issues_of([path])
    assert (6, "j", "timeout") == (issue.line, issue.job, issue.field)
    assert "write 90s for seconds or 90ms for milliseconds" in issue.message


def test_zero_needs_no_unit(tmp_path: Path) -> None:
    path = write(
        tmp_path, EMBEDDED + "jobs:\n  j:\n    once: true\n    command: [x]\n    heartbeat: 0\n"
    )
    assert 0 == load_config([path], environ={}).jobs["j"].timing.heartbeat.total_seconds()


# --- lease against misfire_grace ------------------------------------------------------


def test_a_lease_no_replica_could_take_over_within_misfire_grace_is_refused(
    tmp_path: Path,
) -> None:
    path = write(
        tmp_path,
        EMBEDDED + 'jobs:\n  j:\n    cron: "* * * * *"\n    command: [x]\n'
        "    lease: 30s\n    misfire_grace: 10s\n",
    )
    (issue,) = issues_of([path])
    assert (6, "j", "lease") == (issue.line, issue.job, issue.field)
    assert "lease 30s is not shorter than misfire_grace 10s" in issue.message
    assert "no other replica can take the tick over" in issue.message


def test_a_short_misfire_grace_against_the_default_lease_blames_the_grace(tmp_path: Path) -> None:
    path = write(
        tmp_path,
        EMBEDDED + 'jobs:\n  j:\n    cron: "* * * * *"\n    command: [x]\n    misfire_grace: 3s\n',
    )
    (issue,) = issues_of([path])
    assert (6, "misfire_grace") == (issue.line, issue.field)
    assert "lease 1m is not shorter than misfire_grace 3s" in issue.message


def test_the_takeover_rule_broken_by_the_defaults_is_reported_once_at_the_defaults(
    tmp_path: Path,
) -> None:
    path = write(
        tmp_path,
        EMBEDDED + "defaults:\n  lease: 10m\n"
        'jobs:\n  a: {cron: "* * * * *", command: [x]}\n  b: {cron: "* * * * *", command: [x]}\n',
    )
    (issue,) = issues_of([path])
    assert (3, None, "defaults.lease") == (issue.line, issue.job, issue.field)


def test_run_once_jobs_and_advisory_jobs_are_not_held_to_the_takeover_rule(tmp_path: Path) -> None:
    path = write(
        tmp_path,
        EMBEDDED + "defaults:\n  lease: 10m\n  misfire_grace: 1m\n"
        "jobs:\n  boot: {once: true, command: [x]}\n"
        '  lock: {cron: "* * * * *", guard: advisory, command: [x]}\n',
    )
    assert {"boot", "lock"} == set(load_config([path], environ={}).jobs)


# --- every problem, sorted ------------------------------------------------------------


def test_every_bad_env_value_is_reported_at_its_own_line(tmp_path: Path) -> None:
    path = write(
        tmp_path,
        EMBEDDED + "jobs:\n  j:\n    once: true\n    command: [x]\n"
        "    env:\n      PORT: 8080\n      OK: fine\n      DEBUG: yes\n      LIST: [1]\n",
    )
    issues = issues_of([path])
    assert [(7, "env"), (9, "env"), (10, "env")] == [(i.line, i.field) for i in issues]
    assert ["PORT", "DEBUG", "LIST"] == [i.message.split(":")[0] for i in issues]


def test_issues_are_sorted_by_file_and_line(tmp_path: Path) -> None:
    first = write(
        tmp_path,
        'jobs:\n  b: {cron: "61 * * * *", command: [x]}\n  a: {once: true, command: 1}\n',
        "1.yaml",
    )
    second = write(
        tmp_path, EMBEDDED + "shutdown_grace: soon\njobs:\n  c: {once: true}\n", "2.yaml"
    )
    issues = issues_of([first, second])
    assert [(str(first), 2), (str(first), 3), (str(second), 2), (str(second), 4)] == [
        (i.file, i.line) for i in issues
    ]


def test_a_missing_file_does_not_also_report_no_database(tmp_path: Path) -> None:
    jobs = write(tmp_path, 'jobs:\n  a: {cron: "* * * * *", command: [x]}\n', "jobs.yaml")
    issues = issues_of([jobs, tmp_path / "database.yaml"])
    assert ["no such file or directory"] == [i.message for i in issues]


# --- CRON_TZ -------------------------------------------------------------------------


def test_a_cron_tz_prefix_sets_the_jobs_zone(tmp_path: Path) -> None:
    path = write(
        tmp_path,
        EMBEDDED + 'jobs:\n  j: {cron: "CRON_TZ=Europe/Berlin 30 2 * * *", command: [x]}\n',
    )
    job = load_config([path], environ={}).jobs["j"]
    assert "Europe/Berlin" == job.timezone.key
    assert "at 02:30 every day (Europe/Berlin)" in job.schedule.describe()


@pytest.mark.parametrize(
    ("cron", "extra", "message"),
    [
        (
            "CRON_TZ=Europe/Berln 30 2 * * *",
            "",
            "CRON_TZ: unknown time zone 'Europe/Berln'; use an IANA name, "
            "did you mean 'Europe/Berlin'?",
        ),
        (
            "CRON_TZ=Europe/Berlin 30 2 * * *",
            ", timezone: UTC",
            "CRON_TZ=Europe/Berlin disagrees with timezone: UTC",
        ),
        ("CRON_TZ= 30 2 * * *", "", "CRON_TZ= names no time zone"),
    ],
)
def test_a_wrong_cron_tz_prefix_is_a_clear_error(
    tmp_path: Path, cron: str, extra: str, message: str
) -> None:
    path = write(tmp_path, EMBEDDED + f'jobs:\n  j: {{cron: "{cron}", command: [x]{extra}}}\n')
    (issue,) = issues_of([path])
    assert ("j", "cron") == (issue.job, issue.field)
    assert message in issue.message
    assert "step" not in issue.message


# --- unset variables, stdin, exit codes ----------------------------------------------


UNSET = (
    'database: {url: "${PGCROND_TEST_NEVER_SET}"}\njobs:\n  a: {cron: "* * * * *", command: [x]}\n'
)


def test_check_lints_a_config_whose_variables_are_unset_with_a_warning(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = write(tmp_path, UNSET)
    assert ExitCode.OK == main(["check", str(path)])
    err = capsys.readouterr().err
    assert err.startswith(f"warning: {path}:1: field 'database.url': environment variable ")
    assert "PGCROND_TEST_NEVER_SET is not set" in err


def test_check_strict_refuses_unset_variables(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = write(tmp_path, UNSET)
    assert ExitCode.ERROR == main(["check", "--strict", str(path)])
    assert "PGCROND_TEST_NEVER_SET is not set; set it" in capsys.readouterr().err


def test_check_json_lists_the_warnings(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = write(tmp_path, UNSET)
    assert ExitCode.OK == main(["check", "--json", str(path)])
    (warning,) = json.loads(capsys.readouterr().out)["warnings"]
    assert (1, "database.url") == (warning["line"], warning["field"])


def test_the_loader_refuses_unset_variables_unless_linting(tmp_path: Path) -> None:
    path = write(tmp_path, UNSET)
    (issue,) = issues_of([path])
    assert "is not set" in issue.message
    config = load_config([path], environ={}, allow_unset=True)
    assert "${PGCROND_TEST_NEVER_SET}" == config.database.url
    assert 1 == len(config.warnings)


def test_check_dash_reads_stdin(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(
        "sys.stdin",
        io.StringIO(EMBEDDED + 'jobs:\n  a: {cron: "* * * * *", command: [x], timeout: 9}\n'),
    )
    assert ExitCode.ERROR == main(["check", "-"])
    assert "<stdin>:3: job 'a': field 'timeout': 9 has no unit" in capsys.readouterr().err
    monkeypatch.setattr(
        "sys.stdin", io.StringIO(EMBEDDED + 'jobs:\n  a: {cron: "* * * * *", command: [x]}\n')
    )
    assert ExitCode.OK == main(["check", "-"])
    assert "config OK: 1 job in <stdin>" in capsys.readouterr().out


def test_the_exit_codes_are_one_enum() -> None:
    from pgcrond.ops import session, trigger

    assert (0, 1, 2, 3) == (ExitCode.OK, ExitCode.FAILED, ExitCode.ERROR, ExitCode.NOT_RUN_HERE)
    assert ExitCode.NOT_RUN_HERE is trigger.EXIT_NOT_RUN_HERE
    assert ExitCode.ERROR is session.EXIT_ERROR


# --- one listen parser -----------------------------------------------------------------


@pytest.mark.parametrize("listen", ["::1:9464", "[]:9464", "host:", "9464", "h:70000", "h:٣"])
def test_check_and_run_and_the_server_refuse_the_same_listen_addresses(
    tmp_path: Path, listen: str, capsys: pytest.CaptureFixture[str]
) -> None:
    from pgcrond.daemon.http import parse_listen

    path = write(
        tmp_path,
        EMBEDDED + f'http: {{listen: "{listen}"}}\njobs:\n  a: {{once: true, command: [x]}}\n',
    )
    assert ExitCode.ERROR == main(["check", str(path)])
    with pytest.raises(SystemExit) as exited:
        main(["run", "-c", str(path), "--http", listen])
    assert ExitCode.ERROR == exited.value.code
    with pytest.raises(ValueError, match=r"http\.listen"):
        parse_listen(listen)


@pytest.mark.parametrize("listen", [":9464", "[::1]:9464", "localhost:0", ""])
def test_check_accepts_what_the_server_serves_on(tmp_path: Path, listen: str) -> None:
    path = write(
        tmp_path,
        EMBEDDED + f'http: {{listen: "{listen}"}}\njobs:\n  a: {{once: true, command: [x]}}\n',
    )
    assert listen == load_config([path], environ={}).http_listen
