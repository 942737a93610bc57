"""Every bad duration, zone or URL is a ConfigError, never a traceback out of `check`."""

from __future__ import annotations

import contextlib
import json
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pgcrond.cli import main
from pgcrond.core.durations import parse_duration
from pgcrond.errors import ExitCode

SETTINGS = settings(
    max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)


@pytest.fixture(autouse=True)
def _clean(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("PGCROND_DATABASE_URL", raising=False)


def check(tmp_path: Path, text: str, capsys: pytest.CaptureFixture[str]) -> tuple[int, str]:
    """`pgcrond check --json` on ``text``: the exit code, and all it printed."""
    path = tmp_path / "fuzz.yaml"
    path.write_text(text, encoding="utf-8")
    code = main(["check", "--json", str(path)])
    out = capsys.readouterr()
    json.loads(out.out)  # one JSON document, not a traceback
    return code, out.out + out.err


def job_with(field: str, value: str) -> str:
    return 'database: {embedded: true}\njobs:\n  j:\n    cron: "* * * * *"\n    command: [x]\n' + (
        f"    {field}: {json.dumps(value)}\n"
    )


@pytest.mark.parametrize(
    ("field", "value", "message"),
    [
        ("timeout", "99999999999999999999d", "is too long"),
        ("lease", "9" * 400 + "s", "is too long"),
        ("timezone", "A" * 300, "too long for an IANA name"),
        ("timezone", "Europe", "unknown time zone 'Europe'"),
        ("timezone", "../../etc/passwd", "unknown time zone"),
        ("timezone", "x\x00y", "unknown time zone"),
    ],
)
def test_the_values_that_raised_are_now_config_errors(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], field: str, value: str, message: str
) -> None:
    code, output = check(tmp_path, job_with(field, value), capsys)
    assert ExitCode.ERROR == code
    assert message in output


DURATION_TEXT = st.one_of(
    st.text(alphabet="0123456789.msdh -e+", max_size=30),
    st.from_regex(r"\A\d{1,40}(\.\d{1,5})?(ms|s|m|h|d)\Z"),
    st.text(max_size=20),
)


@given(text=DURATION_TEXT)
def test_parse_duration_raises_only_value_error(text: str) -> None:
    with contextlib.suppress(ValueError):
        parse_duration(text)


@SETTINGS
@given(
    field=st.sampled_from(
        ["lease", "heartbeat", "timeout", "retry_delay", "min_hold", "misfire_grace"]
    ),
    value=DURATION_TEXT,
)
def test_any_duration_gives_a_clean_check(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], field: str, value: str
) -> None:
    code, _ = check(tmp_path, job_with(field, value), capsys)
    assert code in (ExitCode.OK, ExitCode.ERROR)


@SETTINGS
@given(
    zone=st.one_of(st.text(max_size=300), st.sampled_from(["UTC", "Europe/Berlin", "Etc/GMT+5"]))
)
def test_any_time_zone_gives_a_clean_check(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], zone: str
) -> None:
    code, _ = check(tmp_path, job_with("timezone", zone), capsys)
    assert code in (ExitCode.OK, ExitCode.ERROR)


@SETTINGS
@given(cron=st.text(max_size=60))
def test_any_cron_expression_gives_a_clean_check(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], cron: str
) -> None:
    text = (
        "database: {embedded: true}\njobs:\n  j:\n    command: [x]\n"
        + f"    cron: {json.dumps(cron)}\n"
    )
    code, _ = check(tmp_path, text, capsys)
    assert code in (ExitCode.OK, ExitCode.ERROR)


PASSWORD = "Zq7-secret"


@SETTINGS
@given(
    before=st.text(alphabet="ab:@/?#%[],=", max_size=6),
    after=st.text(alphabet="ab1:@/?#%[],=.", max_size=12),
    scheme=st.sampled_from(["postgresql://", "postgres://"]),
)
def test_any_url_gives_a_clean_check_that_never_shows_the_password(
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    before: str,
    after: str,
    scheme: str,
) -> None:
    url = f"{scheme}app:{before}{PASSWORD}{after}@db/x"
    text = f"database: {{url: {json.dumps(url)}}}\njobs:\n  j: {{once: true, command: [x]}}\n"
    code, output = check(tmp_path, text, capsys)
    assert code in (ExitCode.OK, ExitCode.ERROR)
    assert PASSWORD not in output
