"""The README's examples are real: its job file loads, its commands exist."""

from __future__ import annotations

import re
import sys
from pathlib import Path

import pytest

from pgcrond.cli import HANDLERS
from pgcrond.config.loader import load_config

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
