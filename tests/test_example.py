"""config/example.yaml shows every field of the JSON Schema, and the schema accepts it."""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import jsonschema  # type: ignore[import-untyped]
import yaml

from pgcrond.config.schema import config_schema, yaml_document

EXAMPLE = Path(__file__).resolve().parent.parent / "config" / "example.yaml"


def schema_fields(node: dict[str, Any], path: tuple[str, ...] = ()) -> Iterator[tuple[str, ...]]:
    """Every field path of the schema; ``*`` stands for any key (a job's code)."""
    definitions = config_schema().get("$defs", {})
    if "$ref" in node:
        node = definitions[node["$ref"].rsplit("/", 1)[1]]
    for key in ("anyOf", "oneOf", "allOf"):
        for choice in node.get(key, []):
            yield from schema_fields(choice, path)
    for name, sub in node.get("properties", {}).items():
        yield (*path, name)
        yield from schema_fields(sub, (*path, name))
    if isinstance(node.get("additionalProperties"), dict):
        yield from schema_fields(node["additionalProperties"], (*path, "*"))


def present(document: Any, path: tuple[str, ...]) -> bool:
    if not path:
        return True
    if not isinstance(document, dict):
        return False
    if path[0] == "*":
        return any(present(value, path[1:]) for value in document.values())
    return path[0] in document and present(document[path[0]], path[1:])


def test_the_example_sets_or_shows_in_a_comment_every_field_of_the_schema() -> None:
    """A field the example leaves out is one a reader of it never learns of: each is set,
    or, where setting it would change what the example does, named in a comment. A job's
    field that ``defaults:`` sets is shown there (a job overrides any of them, it says)."""
    text = EXAMPLE.read_text("utf-8")
    document = yaml.safe_load(text)
    comments = "\n".join(line.split("#", 1)[1] for line in text.splitlines() if "#" in line)
    fields = sorted(set(schema_fields(config_schema())))
    assert len(fields) > 100, "the walk found too few fields: it proves nothing"
    missing = [
        ".".join(path)
        for path in fields
        if not present(document, path)
        and not (path[:2] == ("jobs", "*") and present(document, ("defaults", *path[2:])))
        and not re.search(rf"\b{path[-1]}:", comments)
    ]
    assert [] == missing


def test_the_json_schema_accepts_the_example() -> None:
    validator = jsonschema.Draft202012Validator(config_schema())
    # Read as editors read it for the schema: dates and times stay text.
    document = yaml_document(EXAMPLE.read_text("utf-8"))
    assert [] == [error.message for error in validator.iter_errors(document)]


def test_the_example_has_a_job_that_runs_within_ten_seconds_of_start() -> None:
    """What `scripts/pgcrond run -c config/example.yaml` shows in its first minute."""
    jobs = yaml.safe_load(EXAMPLE.read_text("utf-8"))["jobs"]
    assert "*/10 * * * * *" == jobs["hello"]["cron"]
