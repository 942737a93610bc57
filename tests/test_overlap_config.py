"""Overlap policies in the YAML: concurrency, max_concurrent, and the per-run override."""

from __future__ import annotations

import re
import textwrap
from pathlib import Path

import pytest

from pgcrond.config.loader import load_config
from pgcrond.core.overlap import Overlap, parse_concurrency
from pgcrond.errors import ConfigError, ConfigIssue, ValidationError

ROOT = Path(__file__).resolve().parent.parent
EMBEDDED = "database: {embedded: true}\n"


def load(tmp_path: Path, text: str) -> dict[str, Overlap]:
    path = tmp_path / "pgcrond.yaml"
    path.write_text(EMBEDDED + textwrap.dedent(text))
    return {code: job.overlap for code, job in load_config([path], environ={}).jobs.items()}


def issues(tmp_path: Path, text: str) -> list[ConfigIssue]:
    path = tmp_path / "pgcrond.yaml"
    path.write_text(EMBEDDED + textwrap.dedent(text))
    with pytest.raises(ConfigError) as raised:
        load_config([path], environ={})
    return list(raised.value.issues)


def test_each_policy_is_read_with_its_bound(tmp_path: Path) -> None:
    overlaps = load(
        tmp_path,
        """\
        jobs:
          plain: {cron: "* * * * *", command: ["true"]}
          free: {cron: "* * * * *", command: ["true"], concurrency: allow}
          newest: {cron: "* * * * *", command: ["true"], concurrency: replace}
          queue: {cron: "* * * * *", command: ["true"], concurrency: buffer_one}
          three: {cron: "* * * * *", command: ["true"], max_concurrent: 3}
          two: {cron: "* * * * *", command: ["true"], concurrency: allow, max_concurrent: 2}
        """,
    )
    assert {
        "plain": Overlap("forbid", 1),
        "free": Overlap("allow", None),
        "newest": Overlap("replace", 1),
        "queue": Overlap("buffer_one", 1),
        "three": Overlap("allow", 3),
        "two": Overlap("allow", 2),
    } == overlaps


def test_max_concurrent_from_the_defaults_bounds_each_job_that_allows(tmp_path: Path) -> None:
    overlaps = load(
        tmp_path,
        """\
        defaults: {max_concurrent: 4}
        jobs:
          a: {cron: "* * * * *", command: ["true"]}
          b: {cron: "* * * * *", command: ["true"], max_concurrent: 1}
        """,
    )
    assert {"a": Overlap("allow", 4), "b": Overlap("allow", 1)} == overlaps


@pytest.mark.parametrize(
    ("fields", "field", "message"),
    [
        ("concurrency: replac", "concurrency", "'replac' is not one of: forbid, allow, replace"),
        ("max_concurrent: 0", "max_concurrent", "must be a whole number 1 or more"),
        ("max_concurrent: two", "max_concurrent", "must be a whole number 1 or more"),
        (
            "concurrency: forbid\n    max_concurrent: 2",
            "max_concurrent",
            "bounds concurrency: allow; under concurrency: forbid one tick of the job runs",
        ),
        (
            "concurrency: replace\n    guard: advisory",
            "concurrency",
            "needs guard: lease (the running ticks are counted in the lease table)",
        ),
        ("max_concurrent: 2\n    guard: advisory", "max_concurrent", "needs guard: lease"),
    ],
)
def test_a_bad_policy_is_one_issue_naming_file_line_job_and_field(
    tmp_path: Path, fields: str, field: str, message: str
) -> None:
    found = issues(
        tmp_path, f'jobs:\n  j:\n    cron: "* * * * *"\n    command: ["true"]\n    {fields}\n'
    )
    assert 1 == len(found), found
    issue = found[0]
    assert (str(tmp_path / "pgcrond.yaml"), "j", field) == (issue.file, issue.job, issue.field)
    assert message in issue.message
    # The line of the field at fault (the file starts with one database line).
    lines = (tmp_path / "pgcrond.yaml").read_text().splitlines()
    assert issue.line is not None
    assert lines[issue.line - 1].strip().startswith(f"{field}:")


def test_a_contradiction_set_by_the_defaults_is_blamed_on_the_defaults_once(
    tmp_path: Path,
) -> None:
    found = issues(
        tmp_path,
        """\
        defaults: {concurrency: buffer_one, max_concurrent: 2}
        jobs:
          j: {cron: "* * * * *", command: ["true"]}
          k: {cron: "* * * * *", command: ["true"]}
        """,
    )
    assert ["defaults.max_concurrent"] == [issue.field for issue in found]
    assert 2 == found[0].line  # the defaults' line


def test_the_documented_example_loads_with_the_policies_it_describes(tmp_path: Path) -> None:
    """docs/configuration.md, "Overlap policies": its YAML block, as the loader reads it."""
    text = (ROOT / "docs" / "configuration.md").read_text("utf-8")
    section = text.split("### Overlap policies", 1)[1].split("\n### ", 1)[0]
    (block,) = re.findall(r"```yaml\n(.*?)```", section, re.S)
    assert {
        "reindex": Overlap("replace", 1),
        "invoice-batch": Overlap("buffer_one", 1),
        "thumbnails": Overlap("allow", 3),
    } == load(tmp_path, block)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("forbid", Overlap("forbid", 1)),
        ("allow", Overlap("allow", None)),
        ("replace", Overlap("replace", 1)),
        ("buffer_one", Overlap("buffer_one", 1)),
        ("3", Overlap("allow", 3)),
    ],
)
def test_a_run_overrides_the_jobs_policy_for_itself(
    tmp_path: Path, text: str, expected: Overlap
) -> None:
    path = tmp_path / "pgcrond.yaml"
    path.write_text(EMBEDDED + 'jobs:\n  j: {cron: "* * * * *", command: ["true"]}\n')
    job = load_config([path], environ={}).jobs["j"]
    assert expected == job.with_concurrency(text).overlap
    assert Overlap("forbid", 1) == job.overlap  # the job itself is unchanged


@pytest.mark.parametrize("text", ["0", "-1", "replac", "", "2.5"])
def test_a_bad_override_names_the_field_and_the_choices(text: str) -> None:
    with pytest.raises(ValueError, match="is not one of: forbid, allow, replace, buffer_one"):
        parse_concurrency(text)


def test_an_override_an_advisory_job_cannot_hold_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "pgcrond.yaml"
    path.write_text(
        EMBEDDED + 'jobs:\n  j: {cron: "* * * * *", command: ["true"], guard: advisory}\n'
    )
    job = load_config([path], environ={}).jobs["j"]
    assert Overlap("allow", None) == job.with_concurrency("allow").overlap
    with pytest.raises(ValidationError, match="concurrency: 'buffer_one' needs guard: lease"):
        job.with_concurrency("buffer_one")
