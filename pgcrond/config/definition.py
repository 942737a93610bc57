"""A job's canonical definition: what the registry stores, hashes and `pgcrond plan` diffs.

The definition is JSON (sorted keys, durations in seconds, zones by name), so
two replicas that load the same job produce the same bytes, whatever the YAML
looked like (anchors, defaults, key order). It is stored in the database and
printed by ``plan``, so it never holds a secret: environment and header
values become a short digest (a change still shows, the value does not), and
every other string goes through :func:`~pgcrond.core.redaction.redact`.

``source`` (file:line) and ``description`` are left out: moving a job in its
file or rewording its note changes nothing a replica does.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from collections.abc import Mapping
from datetime import datetime, timedelta
from json.encoder import encode_basestring
from pathlib import Path
from typing import Any
from zoneinfo import ZoneInfo

from pgcrond.config.models import Config, JobConfig
from pgcrond.core.hooks import Ping
from pgcrond.core.redaction import redact
from pgcrond.core.schedule import SCHEDULE_FORMS

# Of a sha256 hex digest: enough to tell definitions apart in a registry row
# of 10,000 jobs, short enough to keep that row small.
JOB_HASH_LENGTH = 12
_LEFT_OUT = frozenset({"code", "source_file", "source_line", "description"})
# Fields that are left out while unset (None), so that adding them changed no
# existing job's hash: replicas of two versions running one config show no drift.
_LEFT_OUT_UNSET = frozenset(
    {
        "on_start",
        "on_success",
        "on_recovery",
        "on_missed",
        "ping",
        "max_duration",
        "start_deadline",
        "pause_after_failures",
        "params",
        "max_concurrent",
    }
)
# Values shown only as a digest: they are where tokens and passwords live.
_SECRET_MAPPINGS = frozenset({"env", "headers"})

Definition = dict[str, Any]


def definition(job: JobConfig) -> Definition:
    """The job as JSON-ready data: every field that changes what a replica does."""
    fields = (f.name for f in dataclasses.fields(job) if f.init and f.name not in _LEFT_OUT)
    found = {
        name: _plain(name, value)
        for name in fields
        if (value := getattr(job, name)) is not None or name not in _LEFT_OUT_UNSET
    }
    if job.lock_key == job.code:
        # The default ("the job code"): a rename is shown as a rename, not as a new lock key.
        found["lock_key"] = None
    return found


def text_hash(text: str) -> str:
    """A job's hash, from its definition's :func:`canonical_text`."""
    return _sha256(text)[:JOB_HASH_LENGTH]


def canonical_text(value: object) -> str:
    """The JSON text hashes are made of: sorted keys, compact, non-ASCII kept."""
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def canonical_texts(config: Config) -> dict[str, str]:
    """Each job's definition as its canonical text: ``canonical_text(definition(job))``.

    The job hashes, the config hash and the registry's copy of the
    definitions are all made from these. Put together field by field: a
    field's value that several jobs share (one object: a default, a schedule,
    what the loader made one of) is encoded once, not once per job (at
    100,000 jobs encoding each whole was a third of a replica's start-up).
    """
    names = sorted(f.name for f in dataclasses.fields(JobConfig) if f.init)
    names = [name for name in names if name not in _LEFT_OUT]
    # (field, id of its value) -> (the value, kept so that its id stays its own; its text)
    encoded: dict[tuple[str, int], tuple[object, str]] = {}
    texts: dict[str, str] = {}
    for code, job in config.jobs.items():
        parts = []
        for name in names:
            value = getattr(job, name)
            if value is None and name in _LEFT_OUT_UNSET:
                continue
            if name == "lock_key" and value == job.code:
                # The default ("the job code"): see definition().
                parts.append('"lock_key":null')
                continue
            known = encoded.get((name, id(value)))
            if known is None:
                text = f"{canonical_text(name)}:{canonical_text(_plain(name, value))}"
                known = encoded[(name, id(value))] = (value, text)
            parts.append(known[1])
        texts[code] = "{" + ",".join(parts) + "}"
    return texts


def jobs_text(texts: Mapping[str, str]) -> str:
    """The canonical text of ``{code: definition}`` from each job's canonical text."""
    # A code as canonical_text() writes it (json.dumps of a str, non-ASCII
    # kept), without making an encoder per code.
    key = encode_basestring
    return "{" + ",".join(f"{key(code)}:{texts[code]}" for code in sorted(texts)) + "}"


def config_hash(config: Config, jobs: str | None = None) -> str:
    """The digest of every job's definition (and the cluster-wide settings jobs obey).

    ``jobs``: the :func:`jobs_text` of the config's :func:`canonical_texts`,
    when the caller made it already. The digest is of the canonical text of ``{"catch_up_window",
    "history_retention", "jobs", "spread"}``, put together from the jobs'
    texts in the order ``sort_keys`` gives (the same bytes, and so the same
    hash, as that whole document encoded at once: replicas of different
    versions agree).
    """
    if jobs is None:
        jobs = jobs_text(canonical_texts(config))
    whole = (
        f'{{"catch_up_window":{canonical_text(config.catch_up_window.total_seconds())},'
        f'"history_retention":{canonical_text(config.history_retention.total_seconds())},'
        f'"jobs":{jobs},'
        f'"spread":{canonical_text(config.spread.total_seconds())}}}'
    )
    return _sha256(whole)[:32]


def _secret_digest(value: object) -> str:
    return "sha256:" + _sha256(canonical_text(str(value)))[:8]


def _sha256(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def _plain(name: str, value: Any) -> Any:
    """``value`` as JSON data; ``name`` is the field it came from (for the secret mappings)."""
    if value is None or isinstance(value, bool | int | float):
        return value
    if isinstance(value, str):
        return redact(value)
    if isinstance(value, timedelta):
        return value.total_seconds()
    if isinstance(value, ZoneInfo):
        return value.key
    if isinstance(value, datetime):
        return value.isoformat()
    if isinstance(value, Path):
        return str(value)
    if isinstance(value, SCHEDULE_FORMS):
        # The zone is the job's own field; a schedule is its form and bounds.
        return value.definition()
    if isinstance(value, Mapping):
        if name in _SECRET_MAPPINGS:
            return {str(k): _secret_digest(v) for k, v in value.items()}
        return {str(k): _plain(str(k), v) for k, v in value.items()}
    if isinstance(value, tuple | list):
        return [_plain(name, item) for item in value]
    if isinstance(value, frozenset | set):
        return sorted(_plain(name, item) for item in value)
    if isinstance(value, Ping):
        # A ping URL is its check's credential (anyone holding it can report
        # the job healthy): shown as a digest, as env values are.
        return {**_plain_fields(value), "url": _secret_digest(value.url)}
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return _plain_fields(value)
    return redact(str(value))


def _plain_fields(value: Any) -> dict[str, Any]:
    """A dataclass's compared fields as JSON data, with its kind."""
    plain = {
        f.name: _plain(f.name, getattr(value, f.name))
        for f in dataclasses.fields(value)
        if f.compare
    }
    return {"kind": type(value).__name__, **plain}
