"""A job's output as the log shows it: no secret, whole or in pieces, and nothing a
terminal would act on; ordinary values left as they are.

Each test runs a real job (a child process) from a real config, in a process
with pgcrond's own log set up (tests.jobs_fixture.logged_run), and reads the
log it wrote.
"""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

import pytest

from pgcrond.run.command import OUTPUT_LINE_CAP
from tests.jobs_fixture import logged_run

pytestmark = pytest.mark.usefixtures("subprocesses")

PEM = textwrap.dedent(
    """\
    -----BEGIN PRIVATE KEY-----
    MIIEvQIBADANBgkqhkiG9w0BAQEFAASCBKcwggSjAgEAAoIBAQC7VJTUt9Us8cKj
    MzEfYyjiWA4R4/M2bS1GB4t7NXp98C3SC6dVMvDuictGeurT8jNbvJZHtCSuYEvu
    NMoSfm76oqFvAp8Gy0iz5sxjZmSnXyCdPEovGhLa0VzMaQ8s+CLOyS56YyCFGeJZ
    -----END PRIVATE KEY-----
    """
)


def config(tmp_path: Path, job: str) -> Path:
    path = tmp_path / "jobs.yaml"
    path.write_text(
        "database: {url: 'postgresql://app@db/jobs'}\n"
        "jobs:\n  job:\n    once: true\n" + textwrap.indent(textwrap.dedent(job), "    ")
    )
    return path


def output_lines(log: str) -> list[str]:
    events = [json.loads(line) for line in log.splitlines()]
    return [e["line"] for e in events if e["event"] == "job_output"]


def test_every_line_of_a_multi_line_file_secret_and_a_piece_of_one_is_masked(
    tmp_path: Path,
) -> None:
    key = tmp_path / "key.pem"
    key.write_text(PEM)
    done = logged_run(
        config(
            tmp_path,
            f'env: {{KEY: "${{file:{key}}}"}}\n'
            # The key as it is, then a piece of each line.
            'shell: \'printf "%s\\n" "$KEY"; printf "%s\\n" "$KEY" | cut -c 10-50\'\n',
        )
    )
    body = [line for line in PEM.splitlines() if "-----" not in line]
    assert ["***"] * 10 == output_lines(done.stderr)
    assert not any(line[10:30] in done.stderr for line in body)


def test_a_secret_straddling_the_cut_of_a_long_line_leaves_no_head(tmp_path: Path) -> None:
    secret = tmp_path / "token"
    secret.write_text("tok-3f9a1c77e2d4\n")
    done = logged_run(
        config(
            tmp_path,
            f'env: {{TOKEN: "${{file:{secret}}}"}}\n'
            f'shell: \'printf "%0{OUTPUT_LINE_CAP - 6}d%s\\n" 0 "$TOKEN"\'\n',
        )
    )
    (line,) = output_lines(done.stderr)
    assert line.endswith("0***")
    assert "tok-3f" not in line


def test_ordinary_env_file_values_with_secret_looking_names_are_not_masked(
    tmp_path: Path,
) -> None:
    dotenv = tmp_path / "job.env"
    dotenv.write_text(
        "AUTH_MODE=none\nSESSION_TIMEOUT=3600\nKEY_ENABLED=true\nAPI_TOKEN=tok-5d8e0b12aa\n"
    )
    done = logged_run(
        config(
            tmp_path,
            f"env_file: {dotenv}\n"
            "shell: 'echo job nonexistent-none on vm:3600-abc, enabled: true; echo $API_TOKEN'\n",
        )
    )
    assert ["job nonexistent-none on vm:3600-abc, enabled: true", "***"] == output_lines(
        done.stderr
    )


@pytest.mark.parametrize("fmt", ["console", "json"])
def test_terminal_escapes_and_bidi_controls_of_a_job_are_escaped_in_the_log(
    tmp_path: Path, fmt: str
) -> None:
    done = logged_run(
        config(
            tmp_path,
            "shell: 'printf \"\\033]0;owned\\007\\033[2Jclear\\342\\200\\256evil\\n\"'\n",
        ),
        fmt,
    )
    assert "clear" in done.stderr
    assert not any(c in done.stderr for c in ("\x1b", "\x07", "\u202e"))
    if fmt == "json":
        assert ["\\x1b]0;owned\\x07\\x1b[2Jclear\\u202eevil"] == output_lines(done.stderr)
