"""The replica registry: a row per replica, with the config it runs or last ran.

Written by :mod:`pgcrond.daemon.registry` (join at start and reload, a touch
at most every :data:`TOUCH_EVERY`, leave at a clean stop); read by
``pgcrond status``, the status page and ``pgcrond plan``. A row whose
``last_seen`` is older than :data:`GONE_AFTER` is a replica that died without
leaving: it is not listed, and its name may be taken again. A clean stop
marks the row stopped and keeps it, so that ``plan`` with no replica running
compares against the config the cluster last ran (:func:`last_seen`); a
replica's join deletes the rows not seen for :data:`KEEP_STOPPED`.
"""

from __future__ import annotations

import json
import uuid
import zlib
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from psycopg.types.json import Jsonb

from pgcrond.core.timing import to_ms
from pgcrond.errors import ReplicaNameTaken
from pgcrond.storage.leases import LeaseStore

TOUCH_EVERY = timedelta(minutes=1)
# Three touches missed: a replica whose database was briefly out of reach is
# not taken for gone, one that died is within minutes.
GONE_AFTER = timedelta(minutes=3)
# How long the row of a stopped (or dead) replica is kept: a cluster stopped
# for longer than this plans against the jobs' history alone.
KEEP_STOPPED = timedelta(days=30)
_AT = "%Y-%m-%dT%H:%M:%S%z"


def packed(value: Mapping[str, Any]) -> bytes:
    """``value`` as an :class:`Entry` holds it: its JSON text, compressed (fast, not small)."""
    return packed_text(json.dumps(value, separators=(",", ":"), ensure_ascii=False))


def packed_text(text: str) -> bytes:
    """A JSON text as an :class:`Entry` holds it (made elsewhere already: not encoded again)."""
    return zlib.compress(text.encode("utf-8"), 1)


def _unpacked(value: bytes) -> Jsonb:
    # JSON text already: handed to the driver as it is (str of a str is itself).
    return Jsonb(zlib.decompress(value).decode("utf-8"), dumps=str)


@dataclass(frozen=True)
class Entry:
    """What one replica writes: its name, the instance that holds it, and its config."""

    name: str
    instance: uuid.UUID
    version: str
    config_hash: str
    # JSON, packed once (:func:`packed`): code -> short digest of the job's
    # canonical definition, and code -> canonical definition
    # (config/definition.py). Kept for the life of the process but read only
    # by a join: as objects, 10,000 jobs' definitions were 20 MB of a
    # replica's memory; as JSON text 7.5 MB; packed, 50 KB.
    job_hashes: bytes
    definitions: bytes


@dataclass(frozen=True)
class LiveReplica:
    """A row of the registry seen within :data:`GONE_AFTER` (or, from :func:`last_seen`,
    the one seen last)."""

    name: str
    version: str
    config_hash: str
    config_at: datetime
    job_hashes: dict[str, str]
    started_at: datetime
    last_seen: datetime
    # Read only by `plan` (None otherwise): code -> canonical definition.
    definitions: dict[str, Any] | None = None


async def join(store: LeaseStore, entry: Entry) -> None:
    """Write ``entry``'s row; :class:`ReplicaNameTaken` if another live instance has the name."""
    params = {
        "name": entry.name,
        "instance": entry.instance,
        "version": entry.version,
        "config_hash": entry.config_hash,
        "job_hashes": _unpacked(entry.job_hashes),
        "definitions": _unpacked(entry.definitions),
        "gone_after_ms": to_ms(GONE_AFTER),
        "keep_stopped_ms": to_ms(KEEP_STOPPED),
    }
    if await store.db.fetchone(store.queries.get("registry_join"), params) is not None:
        return
    holder = await store.db.fetchone(store.queries.get("registry_holder"), {"name": entry.name})
    since = ""
    if holder is not None:
        since = (
            f" (version {holder['version']}, started {holder['started_at']:{_AT}}, "
            f"last seen {holder['last_seen']:{_AT}})"
        )
    raise ReplicaNameTaken(
        f"replica name {entry.name!r} is held by another live replica{since}: give each "
        "replica its own name (--replica or PGCROND_REPLICA), or, if that replica is gone, "
        f"start again once it has not been seen for {GONE_AFTER.seconds // 60} minutes"
    )


@dataclass(frozen=True)
class Touched:
    """What a touch read back: how many config hashes live replicas run, and their names."""

    hashes: int
    live: tuple[str, ...]


async def touch(store: LeaseStore, entry: Entry) -> Touched:
    """Say ``entry`` is alive (joining again if its row is gone); the live replicas."""
    row = await store.db.fetchone(
        store.queries.get("registry_touch"),
        {"name": entry.name, "instance": entry.instance, "gone_after_ms": to_ms(GONE_AFTER)},
    )
    assert row is not None  # an aggregate always answers
    if not row["touched"]:
        await join(store, entry)
    return Touched(int(row["hashes"]), tuple(row["names"]))


async def leave(store: LeaseStore, entry: Entry) -> None:
    """Mark ``entry``'s row stopped, keeping its config (a newer holder of the name keeps
    its own row)."""
    await store.db.execute(
        store.queries.get("registry_leave"), {"name": entry.name, "instance": entry.instance}
    )


async def live(store: LeaseStore, *, definitions: bool = False) -> list[LiveReplica]:
    """The live replicas by name; with their job definitions if ``definitions``."""
    rows = await store.db.fetchall(
        store.queries.get("registry_live"),
        {"definitions": definitions, "gone_after_ms": to_ms(GONE_AFTER)},
    )
    return [_replica(row) for row in rows]


async def last_seen(store: LeaseStore) -> tuple[LiveReplica, datetime | None] | None:
    """The replica seen last, stopped or gone, with its definitions, and when it stopped
    (None: it died without saying so); None when the registry is empty."""
    row = await store.db.fetchone(store.queries.get("registry_last_seen"))
    return None if row is None else (_replica(row), row["stopped_at"])


def _replica(row: Mapping[str, Any]) -> LiveReplica:
    return LiveReplica(
        row["name"],
        row["version"],
        row["config_hash"],
        row["config_at"],
        dict(row["job_hashes"]),
        row["started_at"],
        row["last_seen"],
        None if row["definitions"] is None else dict(row["definitions"]),
    )


# A job one replica's config does not have, where drift names job hashes.
ABSENT = "absent"


@dataclass(frozen=True)
class Drift:
    """Live replicas that run different configs: since when, who runs which, what differs."""

    # When a second config hash went live, as far as the live rows tell: the
    # start of the second-oldest config among them (its first replica's
    # config_at); a replica that restarts onto an old config moves it later.
    since: datetime
    # config hash -> the replicas running it, oldest config first.
    configs: dict[str, list[str]]
    # code -> (job hash, or ABSENT) -> replicas: only the jobs whose definitions differ.
    jobs: dict[str, dict[str, list[str]]]


def drift(replicas: list[LiveReplica]) -> Drift | None:
    """The drift among ``replicas``, or None when they all run one config."""
    groups: dict[str, list[LiveReplica]] = {}
    for replica in replicas:
        groups.setdefault(replica.config_hash, []).append(replica)
    if len(groups) < 2:
        return None
    started = {key: min(r.config_at for r in group) for key, group in groups.items()}
    order = sorted(groups, key=lambda key: started[key])
    # Oldest config first, then by name: a job's variants read in the same
    # order on every call, whatever order the rows came in.
    ranked = [r for key in order for r in sorted(groups[key], key=lambda r: r.name)]
    jobs: dict[str, dict[str, list[str]]] = {}
    for code in sorted({code for r in replicas for code in r.job_hashes}):
        seen: dict[str, list[str]] = {}
        for replica in ranked:
            seen.setdefault(replica.job_hashes.get(code, ABSENT), []).append(replica.name)
        if len(seen) > 1:
            jobs[code] = seen
    return Drift(
        since=started[order[1]],
        configs={key: [r.name for r in ranked if r.config_hash == key] for key in order},
        jobs=jobs,
    )
