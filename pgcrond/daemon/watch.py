"""Reload when the config changes on disk, as SIGHUP does.

A Kubernetes ConfigMap volume updates by an atomic symlink swap: each key is
a symlink ``jobs.yaml -> ..data/jobs.yaml`` and ``..data`` is re-pointed at a
new timestamped directory, so the file's own mtime may never change while its
content does. Stat-polling follows the links: a file counts as changed when
the inode, device, size or mtime of what its path resolves to changes, or
when a directory gains or loses a ``*.yaml``/``*.yml`` file. Polling once a
second costs a few ``stat()`` calls and no database query; inotify would miss
nothing here but needs a watch per link level and a dependency.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Awaitable, Callable, Sequence
from pathlib import Path

import structlog

log = structlog.get_logger("pgcrond.daemon.watch")

POLL_INTERVAL_S = 1.0
CONFIG_SUFFIXES = (".yaml", ".yml")
# What one file contributes: its resolved path, and what stat() says of the target.
Stamp = tuple[str, int, int, int, int] | tuple[str, str]
Fingerprint = tuple[Stamp, ...]


def fingerprint(paths: Sequence[str]) -> Fingerprint:
    """What the config files look like now; equal fingerprints mean nothing to reload."""
    stamps: list[Stamp] = []
    for given in paths:
        if given == "-":
            continue  # stdin: read once, nothing to watch
        path = Path(given)
        files = (
            sorted(p for p in path.iterdir() if p.suffix in CONFIG_SUFFIXES)
            if path.is_dir()
            else [path]
        )
        for file in files:
            try:
                st = os.stat(file)  # follows symlinks: the ConfigMap's ..data swap shows
            except OSError as exc:
                # A missing file is a state too: its return must count as a change.
                stamps.append((str(file), type(exc).__name__))
                continue
            stamps.append(
                (os.path.realpath(file), st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns)
            )
    return tuple(stamps)


class ConfigWatcher:
    """Takes the files' fingerprint when created; :meth:`run` reloads on every change.

    Create it right after the config was loaded, so an edit made while the
    daemon is still starting (waiting for the database, migrating) is seen.
    """

    def __init__(self, paths: Sequence[str], *, interval: float = POLL_INTERVAL_S) -> None:
        self.paths = list(paths)
        self.interval = interval
        self._seen = _safe_fingerprint(self.paths)

    async def run(self, reload: Callable[[], Awaitable[object]]) -> None:
        """Await ``reload()`` whenever the fingerprint changes; runs until cancelled.

        A rejected config is not retried every second: the next reload waits
        for the next change, as it would for the next SIGHUP.
        """
        while True:
            await asyncio.sleep(self.interval)
            now = await asyncio.to_thread(_safe_fingerprint, self.paths)
            if now == self._seen:
                continue
            self._seen = now
            log.info("config_changed", paths=self.paths)
            await reload()


def _safe_fingerprint(paths: Sequence[str]) -> Fingerprint:
    # A directory that vanished for a moment (a swap in progress) is a change,
    # not a crash of the watcher.
    try:
        return fingerprint(paths)
    except OSError as exc:
        return (("<unreadable>", type(exc).__name__),)
