"""Every schedule example of docs/configuration.md prints what the page says it prints.

An example is a ```yaml block followed by ```console blocks that start with
``$ pgcrond next``: the YAML is loaded (with a database URL, which `next`
never uses) and each command's output must equal the block's lines.
"""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest

from pgcrond.cli import main

ROOT = Path(__file__).resolve().parent.parent
DOC = ROOT / "docs" / "configuration.md"
_BLOCK = re.compile(r"```(yaml|console)\n(.*?)```", re.S)


def examples() -> list[tuple[str, str, list[str], list[str]]]:
    """(name, yaml, the `next` arguments, the lines it prints) for each console block."""
    found: list[tuple[str, str, list[str], list[str]]] = []
    text = DOC.read_text("utf-8")
    section = text[text.index("### Schedules") : text.index("## Errors")]
    last_yaml = None
    for match in _BLOCK.finditer(section):
        kind, body = match.groups()
        if kind == "yaml":
            last_yaml = body
            continue
        command, *lines = body.rstrip("\n").split("\n")
        args = shlex.split(command.removeprefix("$ pgcrond "))
        assert last_yaml is not None and args[0] == "next", command
        found.append((f"{args[args.index('--job') + 1]}:{len(found)}", last_yaml, args, lines))
    return found


def test_the_schedule_section_has_an_example_of_every_form() -> None:
    shown = "\n".join(yaml for _, yaml, _, _ in examples())
    forms = (
        "once:", "at:", " L ", "LW", "15W", "friL", "#2", "?", "cron: [", "every:", "phase:",
        "between:", "skip_on:", "yearly:", "dst:", "repeated: both", "repeated: last",
        "skipped: skip",
    )  # fmt: skip
    for form in forms:
        assert form in shown, form


@pytest.mark.parametrize(
    ("yaml", "args", "lines"),
    [example[1:] for example in examples()],
    ids=[example[0] for example in examples()],
)
def test_an_example_prints_what_the_docs_show(
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    yaml: str,
    args: list[str],
    lines: list[str],
) -> None:
    (tmp_path / "jobs.yaml").write_text('database: {url: "postgresql://u@127.0.0.1/x"}\n' + yaml)
    monkeypatch.chdir(tmp_path)
    assert 0 == main(args)
    assert lines == capsys.readouterr().out.splitlines()
