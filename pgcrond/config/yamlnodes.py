"""YAML nodes that remember where they were read, and the issues found in them.

The loader works on nodes rather than plain values so that every problem can
name its file and line; :class:`Issues` collects problems instead of raising,
so that one run of ``pgcrond check`` reports all of them.
"""

from __future__ import annotations

import difflib
from collections.abc import Sequence
from dataclasses import dataclass

import yaml

from pgcrond.errors import ConfigIssue

MERGE_TAG = "tag:yaml.org,2002:merge"


@dataclass(frozen=True)
class Located:
    """A YAML node and the file it was read from."""

    file: str
    node: yaml.Node

    @property
    def line(self) -> int:
        return int(self.node.start_mark.line) + 1


@dataclass(frozen=True)
class Section:
    """The known fields of one mapping (unknown and duplicate keys already reported).

    ``line`` is where a missing field is blamed: the job's key, the section's
    key, or None when the whole section is absent.
    """

    file: str
    line: int | None
    job: str | None
    prefix: str
    values: dict[str, Located]


# libyaml's parser when PyYAML was built with it (the wheels are): some ten
# times faster than the pure-Python one, which matters at thousands of jobs.
_LOADER: type[yaml.SafeLoader] = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


def compose(text: str) -> yaml.Node | None:
    """The root node of a YAML document; ``yaml.YAMLError`` on bad syntax."""
    return yaml.compose(text, Loader=_LOADER)


def construct(node: yaml.Node) -> object:
    """The plain value of a scalar node, as YAML's safe loader reads it."""
    if isinstance(node, yaml.ScalarNode) and node.tag == _STR:
        # What the safe loader's str constructor returns, without making a
        # loader for it: most scalars are text (a quarter of a 10,000-job load).
        return node.value
    return yaml.SafeLoader("").construct_object(node)


_STR = "tag:yaml.org,2002:str"


def kind(node: yaml.Node | object) -> str:
    """How a value is described in messages: "a list", "a number (90)", "text"."""
    if isinstance(node, yaml.MappingNode):
        return "a mapping"
    if isinstance(node, yaml.SequenceNode):
        return "a list"
    if isinstance(node, yaml.ScalarNode):
        node = construct(node)
    if node is None:
        return "nothing (null)"
    if isinstance(node, bool):
        return f"a boolean ({str(node).lower()})"
    if isinstance(node, int | float):
        return f"a number ({node})"
    if isinstance(node, str):
        return "text"
    return f"a {type(node).__name__}"


def mapping_expected(node: yaml.Node, what: str = "key") -> str:
    return f"must be a mapping of {what}: value, got {kind(node)}"


class Issues:
    """Problems found so far, each with file, line, job and field."""

    def __init__(self) -> None:
        self.found: list[ConfigIssue] = []
        self.warnings: list[ConfigIssue] = []

    def __len__(self) -> int:
        return len(self.found)

    def add(
        self, file: str, line: int | None, job: str | None, name: str | None, message: str
    ) -> None:
        self.found.append(ConfigIssue(file, line, job, name, message))

    def warn(
        self, file: str, line: int | None, job: str | None, name: str | None, message: str
    ) -> None:
        self.warnings.append(ConfigIssue(file, line, job, name, message))

    def at(self, section: Section, key: str, message: str, job: str | None = None) -> None:
        """Blame a field of a section: its own line if set, else the section's."""
        located = section.values.get(key)
        file, line = (
            (section.file, section.line) if located is None else (located.file, located.line)
        )
        self.add(file, line, job or section.job, section.prefix + key, message)

    def pairs(
        self, mapping: Located, job: str | None, name: str | None
    ) -> list[tuple[Located, Located]]:
        """Key and value nodes of a mapping node, YAML merge keys (``<<``) applied.

        Keys written in the mapping win over merged ones, as the merge-key spec
        says; only they can be duplicates worth reporting.
        """
        explicit: list[tuple[Located, Located]] = []
        merged: list[tuple[Located, Located]] = []
        node = mapping.node
        if not isinstance(node, yaml.MappingNode):
            return explicit
        for key_node, value_node in node.value:
            key, value = Located(mapping.file, key_node), Located(mapping.file, value_node)
            if key_node.tag == MERGE_TAG:
                sources = (
                    value_node.value if isinstance(value_node, yaml.SequenceNode) else [value_node]
                )
                for source in sources:
                    if isinstance(source, yaml.MappingNode):
                        merged.extend(self.pairs(Located(mapping.file, source), job, name))
                    else:
                        self.add(mapping.file, key.line, job, name, "<< must merge a mapping")
            elif isinstance(key_node, yaml.ScalarNode):
                explicit.append((key, value))
            else:
                self.add(mapping.file, key.line, job, name, "keys must be plain text")
        seen = {str(key.node.value) for key, _ in explicit}
        for key, value in merged:
            if str(key.node.value) not in seen:
                seen.add(str(key.node.value))
                explicit.append((key, value))
        return explicit

    def section(
        self,
        mapping: Located,
        line: int | None,
        job: str | None,
        prefix: str,
        allowed: Sequence[str],
    ) -> Section | None:
        """The allowed keys of a mapping; unknown keys get a did-you-mean."""
        name = prefix.rstrip(".") or None
        if not isinstance(mapping.node, yaml.MappingNode):
            self.add(mapping.file, mapping.line, job, name, mapping_expected(mapping.node))
            return None
        values: dict[str, Located] = {}
        lines: dict[str, int] = {}
        for key, value in self.pairs(mapping, job, name):
            text = str(key.node.value)
            if text in lines:
                message = f"duplicate key {text!r} (first at line {lines[text]})"
                self.add(mapping.file, key.line, job, prefix + text, message)
            elif text in allowed:
                values[text] = value
                lines[text] = key.line
            else:
                close = difflib.get_close_matches(text, allowed, n=1)
                hint = f"did you mean {close[0]!r}?" if close else f"allowed: {', '.join(allowed)}"
                self.add(
                    mapping.file, key.line, job, prefix + text, f"unknown key {text!r}; {hint}"
                )
        return Section(mapping.file, line, job, prefix, values)
