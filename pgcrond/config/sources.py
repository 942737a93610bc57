"""The config's sources: paths to files, files to YAML, YAML to sections and jobs.

What is read here is only placed (each top-level section once, each job code
once across files); the values are read by the rest of the loader.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path

import yaml

from pgcrond.config.fields import TOP, TOP_SECTIONS
from pgcrond.config.yamlnodes import Issues, Located, compose, mapping_expected
from pgcrond.core.keys import Identity
from pgcrond.errors import ValidationError

# `pgcrond check -` reads the config from standard input, named so in messages.
STDIN = "-"
STDIN_NAME = "<stdin>"

# Where every command finds its config when no -c is given: this variable
# (paths separated by ':'), else this file in the working directory.
CONFIG_ENV = "PGCROND_CONFIG"
CONFIG_HERE = "pgcrond.yaml"


def config_paths(given: Sequence[str], environ: Mapping[str, str] = os.environ) -> list[str]:
    """The config a command reads: ``-c`` (or PATH) as given, else $PGCROND_CONFIG, else
    ``./pgcrond.yaml`` when it exists; ``[]`` when none of them names one."""
    if given:
        return list(given)
    if named := [path for path in environ.get(CONFIG_ENV, "").split(os.pathsep) if path]:
        return named
    return [CONFIG_HERE] if Path(CONFIG_HERE).is_file() else []


class Sources:
    """The files given, read: top-level sections by key, jobs by code."""

    def __init__(self, issues: Issues) -> None:
        self.issues = issues
        self.top: dict[str, Located] = {}
        self.jobs: dict[str, tuple[Located, Located]] = {}  # code -> (key, definition)
        # A file that cannot be read may hold the database section: do not also claim it is missing.
        self.unreadable = False

    def expand(self, paths: Sequence[str | Path]) -> list[str]:
        """Files in the order given; a directory contributes its ``*.yaml``/``*.yml``, sorted."""
        files: list[str] = []
        if not paths:
            self.issues.add("<arguments>", None, None, None, "no config file given; pass -c PATH")
        for raw in paths:
            if str(raw) == STDIN:
                files.append(STDIN)
                continue
            path = Path(raw)
            try:
                if path.is_dir():
                    found = sorted(p for p in path.iterdir() if p.suffix in (".yaml", ".yml"))
                    if not found:
                        self.issues.add(
                            str(path), None, None, None, "directory has no *.yaml or *.yml file"
                        )
                    files.extend(str(p) for p in found)
                elif path.exists():
                    files.append(str(path))
                else:
                    self.issues.add(str(path), None, None, None, "no such file or directory")
                    self.unreadable = True
            except OSError as exc:
                self.issues.add(str(path), None, None, None, f"cannot read: {exc.strerror or exc}")
                self.unreadable = True
        return files

    def read_file(self, file: str) -> None:
        name = STDIN_NAME if file == STDIN else file
        try:
            text = sys.stdin.read() if file == STDIN else Path(file).read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as exc:
            self.issues.add(name, None, None, None, f"cannot read: {exc}")
            self.unreadable = True
            return
        self.read_text(name, text)

    def read_text(self, name: str, text: str) -> None:
        """One file's text, ``name`` being what its issues call it."""
        try:
            root = compose(text)
        except yaml.YAMLError as exc:
            mark = getattr(exc, "problem_mark", None)
            line = None if mark is None else int(mark.line) + 1
            problem = getattr(exc, "problem", None) or str(exc)
            self.issues.add(name, line, None, None, f"YAML syntax error: {problem}")
            self.unreadable = True
            return
        if root is None:
            return  # an empty file adds nothing, which is fine in a directory of files
        top = self.issues.section(Located(name, root), 1, None, "", (*TOP_SECTIONS, *TOP))
        if top is None:
            return
        for key, value in top.values.items():
            if key == "jobs":
                self.collect_jobs(value)
            elif key in self.top:
                first = self.top[key]
                self.issues.add(
                    name,
                    value.line,
                    None,
                    key,
                    f"already set in {first.file}:{first.line}; top-level sections other "
                    "than jobs may appear in one file only",
                )
            else:
                self.top[key] = value

    def collect_jobs(self, jobs: Located) -> None:
        if not isinstance(jobs.node, yaml.MappingNode):
            self.issues.add(jobs.file, jobs.line, None, "jobs", mapping_expected(jobs.node, "code"))
            return
        for key, value in self.issues.pairs(jobs, None, "jobs"):
            code = own_copy(str(key.node.value))
            message = code_problem(code)
            if message is not None:
                self.issues.add(key.file, key.line, code, None, message)
            elif code in self.jobs:
                first = self.jobs[code][0]
                self.issues.add(
                    key.file,
                    key.line,
                    code,
                    None,
                    f"job code defined twice: first at {first.file}:{first.line}, "
                    f"again at {key.file}:{key.line}; job codes must be unique across files",
                )
            else:
                self.jobs[code] = (key, value)


def own_copy(text: str) -> str:
    """A string of its own, not the YAML tree's: kept for the replica's life.

    The tree's strings sit in the same allocator arenas as its nodes: one of
    them kept per job (the job's code, a key of every per-job mapping) kept
    the freed tree's arenas too, 200 MiB of a replica at rest at 100,000 jobs.
    """
    return text.encode("utf-8", "surrogatepass").decode("utf-8", "surrogatepass")


def code_problem(code: str) -> str | None:
    """What is wrong with a job code, by the rule of :class:`Identity` (the one the keys use).

    A code the identity would trim is refused rather than trimmed: ``"bom\\ufeff"``
    and ``"bom"`` would otherwise be two jobs sharing one idempotency key.
    """
    try:
        trimmed = Identity.initial(code).code
    except ValidationError as exc:
        return "job code " + str(exc).removeprefix(f"{exc.field}: ")
    if trimmed != code:
        return "job code must not start or end with whitespace"
    return None
