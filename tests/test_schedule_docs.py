"""Every schedule example of docs/configuration.md prints what the page says it prints.

An example is a ```yaml block followed by ```console blocks that start with
``$ pgcrond next``: the YAML is loaded (with a database URL, which `next`
never uses) and each command's output must equal the block's lines. A
```yaml block whose first line is ``# NAME.yaml`` is a file the next
example's config includes: it is written beside it.
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
_INCLUDED = re.compile(r"# (\S+\.yaml)\n")
Example = tuple[str, str, dict[str, str], list[str], list[str]]


def examples() -> list[Example]:
    """(name, yaml, the files it includes, the `next` arguments, the lines it prints) each."""
    found: list[Example] = []
    text = DOC.read_text("utf-8")
    section = text[text.index("### Schedules") : text.index("## Errors")]
    last_yaml = None
    included: dict[str, str] = {}
    files: dict[str, str] = {}
    for match in _BLOCK.finditer(section):
        kind, body = match.groups()
        named = _INCLUDED.match(body) if kind == "yaml" else None
        if named:
            included = {named[1]: body}
            continue
        if kind == "yaml":
            last_yaml, files, included = body, included, {}
            continue
        command, *lines = body.rstrip("\n").split("\n")
        args = shlex.split(command.removeprefix("$ pgcrond "))
        assert last_yaml is not None and args[0] == "next", command
        name = f"{args[args.index('--job') + 1]}:{len(found)}"
        found.append((name, last_yaml, files, args, lines))
    return found


def test_the_schedule_section_has_an_example_of_every_form() -> None:
    shown = "\n".join(yaml + "".join(files.values()) for _, yaml, files, _, _ in examples())
    forms = (
        "once:", "at:", " L ", "LW", "15W", "friL", "#2", "?", "cron: [", "every:", "phase:",
        "between:", "skip_on:", "yearly:", "include:", "dst:", "repeated: both", "repeated: last",
        "skipped: skip",
    )  # fmt: skip
    for form in forms:
        assert form in shown, form


@pytest.mark.parametrize(
    ("yaml", "files", "args", "lines"),
    [example[1:] for example in examples()],
    ids=[example[0] for example in examples()],
)
def test_an_example_prints_what_the_docs_show(
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    yaml: str,
    files: dict[str, str],
    args: list[str],
    lines: list[str],
) -> None:
    (tmp_path / "jobs.yaml").write_text('database: {url: "postgresql://u@127.0.0.1/x"}\n' + yaml)
    for name, text in files.items():
        (tmp_path / name).write_text(text)
    monkeypatch.chdir(tmp_path)
    assert 0 == main(args)
    assert lines == capsys.readouterr().out.splitlines()
