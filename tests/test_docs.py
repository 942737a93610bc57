"""The docs say what the files say: generated parts in step, history in the changelog only.

The benchmark tables of docs/performance.md are written by their benchmarks
(``python -m bench.docs``); the goals table, the README's performance
paragraph and the module map of docs/architecture.md are derived from those
tables and from the modules' docstrings. Each test here fails when a file
was changed by hand instead of regenerated, and names the command that
fixes it.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

import pgcrond
from bench import docs
from pgcrond.cli import main

ROOT = Path(__file__).resolve().parent.parent
CHANGELOG = ROOT / "CHANGELOG.md"
REGENERATE = "regenerate it: .venv/bin/python -m bench.docs --derived"


def section(path: Path, name: str) -> str:
    body = docs.section_of(path.read_text(), name)
    assert body is not None, f"{path.relative_to(ROOT)} has no '{name}' section"
    return body


def test_the_module_map_lists_every_module_and_no_other() -> None:
    assert docs.module_map() == section(docs.ARCHITECTURE, "module-map"), REGENERATE


def test_the_readme_figures_are_those_of_the_generated_tables() -> None:
    tables = docs.read_tables(docs.PERFORMANCE.read_text())
    assert docs.readme_paragraph(tables) == section(docs.README, "readme"), REGENERATE


def test_the_goals_table_is_derived_from_the_generated_tables() -> None:
    tables = docs.read_tables(docs.PERFORMANCE.read_text())
    assert docs.goals_table(tables) == section(docs.PERFORMANCE, "goals"), REGENERATE


@pytest.mark.parametrize("name", docs.TABLE_NAMES)
def test_every_benchmark_table_names_the_date_and_commit_of_its_run(name: str) -> None:
    body = section(docs.PERFORMANCE, name)
    assert docs.HEADER.search(body), f"{name}: rerun it: .venv/bin/python -m bench.docs {name}"
    table = next(t for t in docs.TABLES if t.name == name)
    assert table.command() in body, f"{name} was made by another command than bench.docs runs"


def test_the_figures_are_read_back_from_a_table_as_written() -> None:
    text = (
        "<!-- figures:begin side-by-side -->\n"
        "Run 2026-12-05 09:00 UTC at commit 0123456789 on 2 cores.\n\n"
        "|  | pgcrond | procrastinate | procrastinate ÷ pgcrond |\n|---|---|---|---|\n"
        "| lateness p99 | 24.1 ms | 821.0 ms | 34.10x |\n"
        "<!-- figures:end side-by-side -->\n"
    )
    tables = docs.read_tables(text)
    figures = tables["side-by-side"]
    assert ("2026-12-05 09:00", "0123456789") == (figures.run, figures.commit)
    assert {
        "": "lateness p99",
        "pgcrond": "24.1 ms",
        "procrastinate": "821.0 ms",
        "procrastinate ÷ pgcrond": "34.10x",
    } == figures.row(**{"": "lateness p99"})
    ledger = next(g for g in docs.GOALS if "ledger lateness p99" in g.goal)
    assert ("24.1 ms", True) == ledger.check(tables)
    assert 2012.0 == docs.number("1,156 / 2,012 ms", 1)


def test_a_table_is_written_only_between_its_markers_and_never_appended() -> None:
    text = "before\n<!-- figures:begin storage -->\nold\n<!-- figures:end storage -->\nafter\n"
    written = docs.replace_section(text, "storage", "new", docs.PERFORMANCE)
    assert "before\n<!-- figures:begin storage -->\nnew\n<!-- figures:end storage -->\nafter\n" == (
        written
    )
    with pytest.raises(SystemExit, match="no '<!-- figures:begin reload -->'"):
        docs.replace_section(text, "reload", "new", docs.PERFORMANCE)


def test_a_goal_whose_row_is_not_in_the_tables_reads_not_measured() -> None:
    assert all("not measured" in line for line in docs.goals_table({}).splitlines()[2:]), (
        "a goal was judged from a table that does not exist"
    )


def released() -> list[tuple[str, str]]:
    return re.findall(r"^## \[(\d+\.\d+\.\d+)\] - (\d{4}-\d\d-\d\d)$", CHANGELOG.read_text(), re.M)


def test_the_changelog_keeps_an_unreleased_section_on_top() -> None:
    headings = re.findall(r"^## .*$", CHANGELOG.read_text(), re.M)
    assert "## [Unreleased]" == headings[0]


def test_pgcrond_version_is_the_changelogs_latest_release(
    capsys: pytest.CaptureFixture[str],
) -> None:
    with pytest.raises(SystemExit) as exited:
        main(["--version"])
    assert 0 == exited.value.code
    latest, _ = released()[0]
    assert f"pgcrond {latest}\n" == capsys.readouterr().out
    assert latest == pgcrond.__version__


def test_every_release_of_the_changelog_says_what_was_added_changed_or_fixed() -> None:
    text = CHANGELOG.read_text()
    for version, _ in released():
        body = text.split(f"## [{version}]", 1)[1].split("\n## ", 1)[0]
        kinds = re.findall(r"^### (\w+)$", body, re.M)
        assert kinds, f"{version} has no entries"
        assert set(kinds) <= {"Added", "Changed", "Deprecated", "Removed", "Fixed", "Security"}


CITED = re.compile(r"\b[Ii]ssue [0-9]")
WRITTEN = [
    ROOT / "README.md",
    *sorted((ROOT / "docs").glob("*.md")),
    *sorted((ROOT / "pgcrond").rglob("*.py")),
    *sorted((ROOT / "tests").rglob("*.py")),
]


def test_no_doc_code_or_test_cites_an_issue_number() -> None:
    cited = [
        f"{path.relative_to(ROOT)}:{n}: {line.strip()}"
        for path in WRITTEN
        for n, line in enumerate(path.read_text().splitlines(), 1)
        if CITED.search(line)
    ]
    assert [] == cited, "say what is tested or decided; history belongs in CHANGELOG.md and git"


@pytest.mark.parametrize(("path", "most"), [("docs/performance.md", 180), ("docs/testing.md", 80)])
def test_a_doc_that_must_stay_short_does(path: str, most: int) -> None:
    """Its prose does: a benchmark's table (between figures markers) is a figure, not prose."""
    text = re.sub(
        r"<!-- figures:begin (\S+) -->.*?<!-- figures:end \1 -->",
        "",
        (ROOT / path).read_text(),
        flags=re.DOTALL,
    )
    assert len(text.splitlines()) <= most
