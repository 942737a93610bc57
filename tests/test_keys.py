"""Identities and keys: compatibility vectors from the reference implementations."""

from __future__ import annotations

import hashlib
import json
import os
import pickle
import subprocess
import sys
import unicodedata
from pathlib import Path
from typing import Any

import orjson
import pytest

from pgcrond.core import keys
from pgcrond.core.keys import Identity, lock_id, nestjs_hash_key
from pgcrond.errors import ValidationError

VECTORS: dict[str, Any] = json.loads(
    (Path(__file__).parent / "reference" / "key-vectors.json").read_text("utf-8")
)


@pytest.mark.parametrize("vector", VECTORS["idempotency_v2"], ids=lambda v: repr(v["code"]))
def test_idempotency_key_matches_the_nestjs_reference(vector: dict[str, Any]) -> None:
    identity = Identity.of(vector["type"], vector["code"], vector["run_key"])
    assert vector["key"] == identity.idempotency_key


@pytest.mark.parametrize(
    "vector", VECTORS["nestjs_pg_cron_lock_hashKey"], ids=lambda v: repr(v["key"])
)
def test_nestjs_lock_ids_match_the_reference(vector: dict[str, Any]) -> None:
    assert vector["lock_id"] == nestjs_hash_key(vector["key"])
    assert vector["lock_id"] == lock_id(vector["key"], "nestjs-pg-cron-lock")


def test_hex_form_is_the_same_digest_without_colons() -> None:
    identity = Identity.schedule("sync", "2026-01-01T00:00:00Z")
    assert ":" not in identity.idempotency_key_hex
    assert 64 == len(identity.idempotency_key_hex)
    import base64

    raw = base64.urlsafe_b64decode(identity.idempotency_key[3:] + "=")
    assert raw.hex() == identity.idempotency_key_hex


def test_values_are_trimmed_like_javascript() -> None:
    assert Identity.schedule("  a \n", "\ufeffb ") == Identity.schedule("a", "b")
    # U+001C is whitespace to Python's strip() but not to JavaScript's trim().
    with pytest.raises(ValidationError, match="control characters"):
        Identity.schedule("\x1ca", "b")


def test_different_run_keys_give_different_keys() -> None:
    first = Identity.schedule("job", "2026-01-01T00:00:00Z")
    second = Identity.schedule("job", "2026-01-01T00:01:00Z")
    assert first.idempotency_key != second.idempotency_key


@pytest.mark.parametrize(
    ("type_", "code", "run_key", "field", "message"),
    [
        ("SCHEDULE", "job", None, "run_key", "is required"),
        ("SCHEDULE", "job", "   ", "run_key", "must not be blank"),
        ("INITIAL", "job", "x", "run_key", "must be absent"),
        ("SCHEDULE", "", "x", "code", "must not be blank"),
        ("SCHEDULE", " \t", "x", "code", "must not be blank"),
        ("SCHEDULE", "a" * 201, "x", "code", "at most 200"),
        ("SCHEDULE", "job", "k" * 201, "run_key", "at most 200"),
        ("SCHEDULE", "jo\x00b", "x", "code", "control characters"),
        ("SCHEDULE", "job", "a\x07b", "run_key", "control characters"),
        ("SCHEDULE", 5, "x", "code", "must be a string"),
        ("OTHER", "job", "x", "type", "SCHEDULE or INITIAL"),
    ],
)
def test_identity_validation_names_the_field(
    type_: str, code: object, run_key: object, field: str, message: str
) -> None:
    with pytest.raises(ValidationError, match=message) as info:
        Identity.of(type_, code, run_key)
    assert field == info.value.field
    assert str(info.value).startswith(f"{field}: ")


def test_lock_id_is_sha256_of_the_namespaced_key() -> None:
    digest = hashlib.sha256(b"pgcrond:process-orders").digest()
    assert int.from_bytes(digest[:8], "big", signed=True) == lock_id("process-orders")
    assert 42 == lock_id(42)


def test_lock_ids_do_not_collide_across_100k_keys() -> None:
    ids = {lock_id(f"job-{n}") for n in range(100_000)}
    assert 100_000 == len(ids)


@pytest.mark.parametrize(
    ("key", "message"),
    [("", "must not be empty"), (2**63, "fit a bigint"), (True, "got bool"), (1.5, "float")],
)
def test_bad_lock_keys_raise_clear_errors(key: object, message: str) -> None:
    with pytest.raises(ValidationError, match=message):
        lock_id(key)  # type: ignore[arg-type]


def test_control_characters_are_exactly_unicode_s_cc_and_cs() -> None:
    """The one-search check refuses what a category lookup per character did, no more."""
    differ = [
        point
        for point in range(sys.maxunicode + 1)
        if (unicodedata.category(chr(point)) in ("Cc", "Cs"))
        != (keys._CONTROL.search(chr(point)) is not None)
    ]
    assert [] == differ


UNPICKLE_AND_LOOK_UP = """
import pickle, sys
from pgcrond.core.keys import Identity
carried = pickle.loads(sys.stdin.buffer.read())
fresh = Identity.schedule("report", "2026-03-29T01:30:00Z")
print({fresh: "found"}.get(carried, "missing"), carried.idempotency_key == fresh.idempotency_key)
"""


@pytest.mark.usefixtures("subprocesses")
def test_an_identity_pickled_to_another_process_is_found_there_by_its_equal() -> None:
    # The hash is kept once made; str hashes are salted per process, so a
    # pickled copy must not carry this process's.
    identity = Identity.schedule("report", "2026-03-29T01:30:00Z")
    assert hash(identity) and identity.idempotency_key
    done = subprocess.run(
        [sys.executable, "-c", UNPICKLE_AND_LOOK_UP],
        input=pickle.dumps(identity),
        capture_output=True,
        check=True,
        timeout=60,
        env={**os.environ, "PYTHONHASHSEED": "12345"},
    )
    assert b"found True" == done.stdout.strip()


def test_the_digest_payload_is_the_standard_compact_json_for_every_allowed_character() -> None:
    """orjson writes the key's payload: byte for byte what ``json`` (and Node) would write."""
    compact = json.JSONEncoder(separators=(",", ":"), ensure_ascii=False)
    allowed = [
        chr(point)
        for point in range(sys.maxunicode + 1)
        if unicodedata.category(chr(point)) not in ("Cc", "Cs")
    ]
    for start in range(0, len(allowed), 1000):
        text = "".join(allowed[start : start + 1000])
        fields = {"version": 2, "type": "SCHEDULE", "code": text, "runKey": text}
        assert compact.encode(fields).encode("utf-8") == orjson.dumps(fields), start
