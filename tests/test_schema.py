"""The published JSON Schema is generated from the field table and fits every shipped config."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import jsonschema  # type: ignore[import-untyped]
import pytest
import yaml

from pgcrond.cli import main
from pgcrond.config.schema import config_schema, schema_text, yaml_document

ROOT = Path(__file__).resolve().parent.parent
COMMITTED = ROOT / "docs" / "config.schema.json"


def validator() -> jsonschema.Draft202012Validator:
    schema = config_schema()
    jsonschema.Draft202012Validator.check_schema(schema)
    return jsonschema.Draft202012Validator(schema)


def errors(text: str) -> list[str]:
    return [e.message for e in validator().iter_errors(yaml_document(text))]


def test_the_committed_schema_is_the_generated_one(capsys: pytest.CaptureFixture[str]) -> None:
    """Regenerate with: pgcrond schema > docs/config.schema.json"""
    assert COMMITTED.read_text("utf-8") == schema_text()
    assert 0 == main(["schema"])
    assert COMMITTED.read_text("utf-8") == capsys.readouterr().out


def _shipped_configs() -> list[tuple[str, str]]:
    found = [("config/example.yaml", (ROOT / "config/example.yaml").read_text("utf-8"))]
    found.append(
        ("deploy/compose/pgcrond.yaml", (ROOT / "deploy/compose/pgcrond.yaml").read_text())
    )
    configmap = yaml.safe_load((ROOT / "deploy/kubernetes/configmap.yaml").read_text())
    found += [(f"configmap:{name}", text) for name, text in configmap["data"].items()]
    readme = (ROOT / "README.md").read_text("utf-8")
    blocks = [b for b in re.findall(r"```yaml\n(.*?)```", readme, re.S) if "jobs:" in b]
    found += [(f"README.md#{i}", block) for i, block in enumerate(blocks)]
    docs = (ROOT / "docs" / "configuration.md").read_text("utf-8")
    blocks = [b for b in re.findall(r"```yaml\n(.*?)```", docs, re.S) if "jobs:" in b]
    found += [(f"configuration.md#{i}", block) for i, block in enumerate(blocks)]
    return found


def _test_and_bench_configs(tmp_path: Path) -> list[tuple[str, str]]:
    from bench.daemon import write_config
    from tests.helpers import daemon_harness

    found = []
    for lease in (None, "2s"):
        path = tmp_path / f"bench-{lease}.yaml"
        write_config(path, 3, "* * * * * *", lease)
        found.append((f"bench.daemon:{lease}", path.read_text()))
    found.append(
        (
            "tests.helpers.daemon_harness.one_shot",
            daemon_harness.one_shot("s", seconds=3, sleep=1, lease="2s", heartbeat="500ms"),
        )
    )
    return found


@pytest.mark.parametrize(("name", "text"), _shipped_configs())
def test_every_shipped_config_is_valid_by_the_schema(name: str, text: str) -> None:
    assert [] == errors(text), name


def test_test_and_bench_configs_are_valid_by_the_schema(tmp_path: Path) -> None:
    for name, text in _test_and_bench_configs(tmp_path):
        assert [] == errors(text), name


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("jobs:\n  j: {cron: '* * * * *', command: [x], timeout: 90}\n", "is not valid"),
        ("jobs:\n  j: {cron: '* * * * *', command: [x], tiemout: 9s}\n", "tiemout"),
        ("jobs:\n  j: {cron: '* * * * *', once: true, command: [x]}\n", "is valid under each of"),
        ("jobs:\n  j: {cron: '* * * * *'}\n", "is not valid"),
        ("defaults: {cron: '* * * * *'}\n", "cron"),
        ("database: {schema: 1bad}\n", "does not match"),
    ],
)
def test_the_schema_refuses_what_the_loader_refuses(text: str, message: str) -> None:
    found = errors(text)
    assert found
    assert any(message in e for e in found), found


def test_the_schema_describes_every_field_with_its_default() -> None:
    schema: dict[str, Any] = config_schema()
    job = schema["$defs"]["job"]["properties"]
    assert "1m" == job["lease"]["default"]
    assert "forbid" == job["concurrency"]["default"]
    assert ["lease", "advisory"] == job["guard"]["enum"]
    assert "30d" == schema["properties"]["history_retention"]["default"]
    assert all(p["description"] for p in job.values())
