"""``pgcrond.testing``: a job's config without a file, as docs/jobs.md shows it."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from pgcrond.config.loader import load_config
from pgcrond.testing import job
from tests.jobs_fixture import docs_example


def test_the_docs_example_tests_pass() -> None:
    """Every test function of the "Testing a job without a daemon" example passes."""
    namespace: dict[str, Any] = {}
    exec(compile(docs_example("testing"), "docs/jobs.md#testing", "exec"), namespace)
    tests = [value for name, value in namespace.items() if name.startswith("test_")]
    assert 2 == len(tests)
    for test in tests:
        test()


def test_a_job_built_from_fields_is_the_job_a_file_holding_them_loads(tmp_path: Path) -> None:
    fields: dict[str, Any] = {
        "cron": "*/5 * * * *",
        "command": ["/bin/true"],
        "retries": 2,
        "timeout": "30s",
    }
    path = tmp_path / "jobs.yaml"
    path.write_text(
        yaml.safe_dump(
            {"database": {"url": "postgresql://unused@127.0.0.1/unused"}, "jobs": {"tidy": fields}}
        )
    )
    assert load_config([path]).jobs["tidy"] == job("tidy", **fields)
