"""The README's examples are real: its job file loads, its commands exist."""

from __future__ import annotations

import re
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from pgcrond.cli import HANDLERS
from pgcrond.config.loader import load_config
from tests.helpers.daemon_harness import PGCROND, cluster, wait_until

README = (Path(__file__).resolve().parent.parent / "README.md").read_text("utf-8")


def test_the_readme_job_file_is_a_valid_config(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    block = next(b for b in re.findall(r"```yaml\n(.*?)```", README, re.S) if "jobs:" in b)
    # The entrypoint it names belongs to the reader's application.
    app = tmp_path / "myapp"
    app.mkdir()
    (app / "__init__.py").write_text("")
    (app / "jobs.py").write_text("def seed_settings(ctx):\n    pass\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setenv("PGCROND_DATABASE_URL", "postgresql://pgcrond@db/app")
    path = tmp_path / "jobs.yaml"
    path.write_text(block)
    config = load_config([path])
    assert {"nightly-invoices", "cache-warm", "seed-settings"} == set(config.jobs)
    assert "advisory" == config.jobs["cache-warm"].guard
    sys.modules.pop("myapp.jobs", None)
    sys.modules.pop("myapp", None)


def test_every_pgcrond_command_the_readme_shows_exists() -> None:
    commands = set(re.findall(r"^\$? ?pgcrond ([a-z]+)", README, re.M))
    commands |= set(re.findall(r"`pgcrond ([a-z]+)", README))
    known = set(HANDLERS)
    assert commands
    assert commands <= known


# --- the README's `status` and `history` output ------------------------------

OPERATIONS = (Path(__file__).resolve().parent.parent / "docs" / "operations.md").read_text()
# A cell's shape: what stays the same from one run of the demo to the next.
SHAPES = (
    (re.compile(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ"), "TIME"),
    (re.compile(r"\b\d+(\.\d+)?(ms|s)\b"), "DURATION"),
    (re.compile(r"\S+:\d+(-\w+)?(?=\s|$)"), "OWNER"),
    (re.compile(r"\d+"), "N"),
)


def shape(cell: str) -> str:
    for pattern, name in SHAPES:
        cell = pattern.sub(name, cell)
    return cell


def table(text: str) -> tuple[list[str], list[list[str]]]:
    """Header columns and rows of a CLI listing (cells are apart by two spaces or more)."""
    header, *rows = [re.split(r"\s{2,}", line.strip()) for line in text.strip().splitlines()]
    return header, rows


def readme_output(command: str) -> str:
    """The lines the README shows under ``$ pgcrond COMMAND ...``, up to a blank line."""
    found = re.search(rf"^\$ pgcrond {command}[^\n]*\n(.*?)(?:\n\n|\n```)", README, re.S | re.M)
    assert found is not None, f"the README shows no `pgcrond {command}` output"
    return found.group(1)


@pytest.mark.usefixtures("system_processes")
def test_the_readme_status_and_history_output_is_what_the_demo_prints(
    pg_dsn: str, schema: str, tmp_path: Path
) -> None:
    """Three replicas run the demo of docs/operations.md; the CLI prints what the README shows.

    Compared: the header columns, and each row's shape (times, durations,
    owners and counts abstracted): per job for ``status``, and every
    ``history`` row is of a kind the README shows. The replicas are stopped
    first, so that no run is in progress when ``status`` reads.
    """
    section = OPERATIONS.split("## The demo behind the README's output", 1)[1]
    demo = re.search(r"```yaml\n(.*?)```", section, re.S)
    assert demo is not None
    text = demo.group(1).replace(
        "  url: ${PGCROND_DATABASE_URL}\n",
        f"  url: ${{PGCROND_DATABASE_URL}}\n  schema: {schema}\n",
    )
    with cluster(pg_dsn, schema, tmp_path) as running:
        path = running.write_config(text)
        replicas = running.start(path, 3)
        # Each kind of row the README shows, and ten rows newer than seed-settings'.
        wait_until(
            lambda: running.rows(
                "SELECT 1 FROM {leases} HAVING "
                "count(*) FILTER (WHERE code = 'nightly-report' AND attempt = 2 "
                "AND status = 'FAIL') > 0 "
                "AND count(*) FILTER (WHERE reason = 'timeout') > 0 "
                "AND count(*) FILTER (WHERE code = 'sync-invoices' AND status = 'SUCCESS') > 0 "
                "AND count(*) FILTER (WHERE status IN ('SUCCESS', 'FAIL') "
                "AND code <> 'seed-settings') >= 11"
            ),
            60,
            "the demo's runs",
        )
        for replica in replicas:
            replica.signal(signal.SIGTERM)
        assert [0, 0, 0] == [replica.wait_exit(60) for replica in replicas]
        status, history = (
            subprocess.run(
                [str(PGCROND), *args, "-c", str(path)],
                capture_output=True,
                text=True,
                env=running.env(),
                timeout=60,
                check=True,
            ).stdout
            for args in (["status"], ["history", "--limit", "10"])
        )
    # The jobs' table; the live replicas follow it (none now: all stopped).
    jobs, _, replicas_part = status.partition("\n\n")
    assert replicas_part.startswith("no live replica in the registry"), status
    shown_header, shown_rows = table(readme_output("status"))
    header, rows = table(jobs)
    assert shown_header == header, status
    assert {row[0]: [shape(cell) for cell in row] for row in shown_rows} == {
        row[0]: [shape(cell) for cell in row] for row in rows
    }, status
    shown_header, shown_rows = table(readme_output("history"))
    header, rows = table(history)
    assert shown_header == header, history
    # Ten ticks; the attempt records under a failed or retried one start with "└".
    assert 10 == len([row for row in rows if not row[0].startswith("└")])
    kinds = {tuple(shape(cell) for cell in row) for row in shown_rows}
    assert [] == [row for row in rows if tuple(shape(cell) for cell in row) not in kinds], history
