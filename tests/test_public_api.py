"""The public face: every name the docs import comes from ``pgcrond`` (or, for tests,
``pgcrond.testing``) and is importable from there."""

from __future__ import annotations

import ast
import importlib
import re
import subprocess
import sys
from pathlib import Path

import pytest

import pgcrond

ROOT = Path(__file__).resolve().parent.parent
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
FENCE = re.compile(r"```python\n(.*?)```", re.S)
# What users import: the package, and its helpers for their tests (like structlog.testing).
FACES = ("pgcrond", "pgcrond.testing")


def _documented_imports() -> list[tuple[str, str, str]]:
    """(doc, module, name) for every ``from pgcrond… import name`` in a python block."""
    found: list[tuple[str, str, str]] = []
    for doc in DOCS:
        for block in FENCE.findall(doc.read_text()):
            try:
                tree = ast.parse(block)
            except SyntaxError:
                continue  # a fragment with "..." placeholders; its imports are still lines
            for node in ast.walk(tree):
                if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("pgcrond"):
                    found.extend((doc.name, node.module or "", a.name) for a in node.names)
    return found


def test_the_docs_import_pgcrond_names_only_from_the_public_face() -> None:
    imports = _documented_imports()
    assert imports, "the docs show no pgcrond import: the scan is broken"
    assert [(d, m, n) for d, m, n in imports if m not in FACES] == []


@pytest.mark.parametrize("name", sorted({n for _, _, n in _documented_imports()}))
def test_every_documented_name_is_importable_from_pgcrond(name: str) -> None:
    [face] = {m for _, m, n in _documented_imports() if n == name}
    assert name in importlib.import_module(face).__all__
    assert getattr(importlib.import_module(face), name) is not None


@pytest.mark.parametrize("name", sorted(pgcrond.__all__))
def test_every_exported_name_resolves(name: str) -> None:
    assert getattr(pgcrond, name) is not None


def test_all_lists_exactly_the_lazily_exported_names() -> None:
    assert sorted(pgcrond.__all__) == sorted(["__version__", *pgcrond._EXPORTS])


def test_importing_pgcrond_imports_no_submodule_at_run_time() -> None:
    """The CLI imports the package first: a command that needs no database pays nothing for one."""
    tree = ast.parse((ROOT / "pgcrond" / "__init__.py").read_text())
    runtime = [node for node in tree.body if isinstance(node, ast.Import | ast.ImportFrom)]
    modules = sorted(
        (node.module or "") if isinstance(node, ast.ImportFrom) else node.names[0].name
        for node in runtime
    )
    assert modules == ["__future__", "importlib", "typing"]


@pytest.mark.usefixtures("subprocesses")
def test_the_daemon_imports_neither_the_synchronous_facades_nor_dotenv() -> None:
    """What a replica holds resident: the blocking portal (anyio) is the facades' alone, and
    python-dotenv is imported by a config that names an env file (bench.import_rss)."""
    probe = (
        "import sys, pgcrond.daemon.command; "
        "print(' '.join(m for m in ('anyio', 'pgcrond.storage.blocking', 'dotenv') "
        "if m in sys.modules))"
    )
    found = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, check=True
    ).stdout.split()
    assert found == []
