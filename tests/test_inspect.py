"""`pgcrond check` and `pgcrond next` through the real argument parser."""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

import pytest

from pgcrond.cli import main

EXAMPLE = Path(__file__).resolve().parent.parent / "config" / "example.yaml"

BERLIN = textwrap.dedent(
    """\
    database: {embedded: true}
    jobs:
      nightly:
        cron: "30 2 * * *"
        timezone: Europe/Berlin
        command: ["/bin/echo", "hi"]
      boot:
        once: true
        shell: "true"
    """
)


@pytest.fixture
def berlin(tmp_path: Path) -> Path:
    path = tmp_path / "berlin.yaml"
    path.write_text(BERLIN)
    return path


@pytest.fixture(autouse=True)
def _no_database_url(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("PGCROND_DATABASE_URL", raising=False)


def test_check_passes_on_the_example_config(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["check", "-c", str(EXAMPLE)]) == 0
    out = capsys.readouterr().out
    assert out.startswith("config OK: 10 jobs")
    assert "nightly-berlin" in out and "at 02:30 every day (Europe/Berlin)" in out


def test_check_lists_one_line_per_job(berlin: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["check", "-c", str(berlin)]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == 3
    assert lines[1].split() == [
        "nightly", "cron", "'30", "2", "*", "*", "*':", "at", "02:30", "every", "day",
        "(Europe/Berlin)", "lease", "command:", "/bin/echo", "hi",
    ]  # fmt: skip
    assert lines[2].split()[:1] + lines[2].split()[-3:] == ["boot", "lease", "shell:", "true"]


def test_check_json_lists_jobs_with_their_fields(
    berlin: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["check", "-c", str(berlin), "--json"]) == 0
    document = json.loads(capsys.readouterr().out)
    nightly = document["jobs"][0]
    assert nightly["code"] == "nightly"
    assert nightly["timezone"] == "Europe/Berlin"
    assert nightly["action"] == {"type": "command", "argv": ["/bin/echo", "hi"]}
    assert (nightly["lease"], nightly["heartbeat"]) == ("1m", "20s")
    assert document["jobs"][1]["once"] is True
    assert document["database"]["embedded"] is True


def test_check_reports_every_issue_and_exits_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "bad.yaml"
    path.write_text("database: {embedded: true}\njobs:\n  a:\n    cron: '* * * * 9'\n    shell: x\n"
                    "  b:\n    once: true\n")  # fmt: skip
    assert main(["check", "-c", str(path)]) == 2
    err = capsys.readouterr().err.splitlines()
    assert err[0] == f"{path}:4: job 'a': field 'cron': day-of-week: 9 is out of range 0-7"
    assert err[1].startswith(f"{path}:6: job 'b': field 'action': no action")
    assert err[2] == "2 problems: fix these and run pgcrond check again"


def test_check_json_errors_are_machine_readable(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "bad.yaml"
    path.write_text(
        "database: {embedded: true}\njobs:\n  a:\n    cron: '* * * * 9'\n    shell: x\n"
    )
    assert main(["check", "-c", str(path), "--json"]) == 2
    assert json.loads(capsys.readouterr().out) == {
        "errors": [
            {
                "file": str(path),
                "line": 4,
                "job": "a",
                "field": "cron",
                "message": "day-of-week: 9 is out of range 0-7",
            }
        ]
    }


def test_next_prints_utc_and_local_ticks_through_spring_forward(
    berlin: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["next", "-c", str(berlin), "-n", "2", "--from", "2026-03-28T12:00:00Z"]) == 0
    assert capsys.readouterr().out.splitlines() == [
        "nightly: cron '30 2 * * *': at 02:30 every day (Europe/Berlin)",
        "  2026-03-29T01:30:00Z  2026-03-29 03:30:00 CEST (+0200)"
        "  02:30 skipped by the clock change, run at 03:30 (dst skipped: shift)",
        "  2026-03-30T00:30:00Z  2026-03-30 02:30:00 CEST (+0200)",
        "boot: once, at start (run-once)",
        "  at start (run-once)",
    ]


def test_next_json_for_one_job(berlin: Path, capsys: pytest.CaptureFixture[str]) -> None:
    args = ["next", "-c", str(berlin), "--job", "nightly", "-n", "3", "--json"]
    assert main([*args, "--from", "2026-10-24T12:00:00+00:00"]) == 0
    document = json.loads(capsys.readouterr().out)
    assert [job["code"] for job in document["jobs"]] == ["nightly"]
    form = "cron '30 2 * * *'"
    assert document["jobs"][0]["ticks"] == [
        {
            "utc": "2026-10-25T00:30:00Z",
            "local": "2026-10-25T02:30:00+02:00",
            "form": form,
            "dst": "02:30 repeated by the clock change, its first occurrence (dst repeated: first)",
        },
        {"utc": "2026-10-26T01:30:00Z", "local": "2026-10-26T02:30:00+01:00", "form": form},
        {"utc": "2026-10-27T01:30:00Z", "local": "2026-10-27T02:30:00+01:00", "form": form},
    ]


def test_next_with_an_unknown_job_lists_the_known_ones(
    berlin: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["next", "-c", str(berlin), "--job", "nope"]) == 2
    assert "no job 'nope'; known jobs: nightly, boot" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("extra", "message"), [(["--from", "yesterday"], "--from"), (["-n", "0"], "-n must be 1")]
)
def test_next_refuses_bad_arguments(
    berlin: Path, capsys: pytest.CaptureFixture[str], extra: list[str], message: str
) -> None:
    assert main(["next", "-c", str(berlin), *extra]) == 2
    assert message in capsys.readouterr().err


def test_next_on_an_invalid_config_exits_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "bad.yaml"
    path.write_text("jobs: {}\n")
    assert main(["next", "-c", str(path)]) == 2
    assert "fix these and run pgcrond check again" in capsys.readouterr().err
