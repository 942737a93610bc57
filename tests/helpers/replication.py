"""Two PostgreSQL servers on this machine: a primary and a streaming standby.

``replicated_pair(synchronous=...)`` starts a throwaway primary, clones it
with ``pg_basebackup -R`` (as the server's own user: under root the servers
run as ``nobody``), starts the clone as a hot standby and waits until it
streams (and, when synchronous, until the primary counts it as its sync
standby). ``dsn`` is the multi-host URL a real deployment uses,
``target_session_attrs=read-write``, so clients follow a promotion.

Failure tools: ``primary.kill()`` (a host crash), ``promote()`` and
``pause_sender()``/``resume()`` (SIGSTOP/SIGCONT of the primary's WAL sender:
the standby falls behind, as a slow link would make it).
"""

from __future__ import annotations

import contextlib
import glob
import os
import pwd
import shutil
import signal
import subprocess
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import psycopg

from pgcrond.testing import LocalServer


def pg_binary(name: str) -> str:
    """A PostgreSQL client binary, newest major version first."""
    for bindir in sorted(
        glob.glob("/usr/lib/postgresql/*/bin"),
        key=lambda path: int(path.split("/")[-2]) if path.split("/")[-2].isdigit() else 0,
        reverse=True,
    ):
        if Path(bindir, name).is_file():
            return str(Path(bindir, name))
    found = shutil.which(name)
    if found is None:
        raise RuntimeError(f"{name} not found (apt-get install postgresql)")
    return found


def _query(dsn: str, sql: str, *params: object) -> list[tuple[object, ...]]:
    with psycopg.connect(dsn, autocommit=True, connect_timeout=5) as conn:
        cursor = conn.execute(sql, params)
        return cursor.fetchall() if cursor.description else []


@dataclass
class ReplicatedPair:
    primary: LocalServer
    standby: LocalServer
    synchronous: bool
    scratch: Path

    @property
    def dsn(self) -> str:
        return (
            f"postgresql://postgres@127.0.0.1:{self.primary.port},127.0.0.1:{self.standby.port}"
            "/postgres?target_session_attrs=read-write"
        )

    def wait_streaming(self, timeout: float = 30) -> None:
        want = "sync" if self.synchronous else "async"
        deadline = time.monotonic() + timeout
        while True:
            rows = _query(
                self.primary.dsn,
                "SELECT state, sync_state FROM pg_stat_replication",
            )
            if ("streaming", want) in rows:
                return
            if time.monotonic() > deadline:
                raise AssertionError(f"standby not streaming ({want}) after {timeout}s: {rows}")
            time.sleep(0.05)

    def wait_replayed(self, timeout: float = 10) -> None:
        """Until the standby has replayed everything the primary wrote so far."""
        ((target,),) = _query(self.primary.dsn, "SELECT pg_current_wal_lsn()::text")
        deadline = time.monotonic() + timeout
        while True:
            ((caught_up,),) = _query(
                self.standby.dsn, "SELECT pg_last_wal_replay_lsn() >= %s::pg_lsn", target
            )
            if caught_up:
                return
            if time.monotonic() > deadline:
                raise AssertionError(f"standby behind {target} after {timeout}s")
            time.sleep(0.05)

    def sender_pid(self) -> int:
        rows = _query(self.primary.dsn, "SELECT pid FROM pg_stat_replication")
        assert rows, "no WAL sender on the primary"
        return int(str(rows[0][0]))

    def pause_sender(self) -> int:
        """Stop the primary's WAL sender: commits go on, the standby falls behind.

        (Stopping the standby's receiver would not do: the kernel's socket
        buffer would keep what the sender sent, and a woken receiver reads it.)
        """
        pid = self.sender_pid()
        os.kill(pid, signal.SIGSTOP)
        return pid

    def resume(self, pid: int) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGCONT)

    def promote(self) -> None:
        ((done,),) = _query(self.standby.dsn, "SELECT pg_promote(true, 30)")
        assert done, "the standby was not promoted within 30 s"
        ((in_recovery,),) = _query(self.standby.dsn, "SELECT pg_is_in_recovery()")
        assert not in_recovery

    def remove(self) -> None:
        for server in (self.standby, self.primary):
            server.remove()
        shutil.rmtree(self.scratch, ignore_errors=True)


def _basebackup(primary: LocalServer, target: Path) -> None:
    run_as = pwd.getpwnam("nobody") if os.geteuid() == 0 else None
    target.mkdir(mode=0o700)
    if run_as is not None:
        os.chown(target, run_as.pw_uid, run_as.pw_gid)
    result = subprocess.run(
        [
            pg_binary("pg_basebackup"),
            "-d", f"host=127.0.0.1 port={primary.port} user=postgres application_name=standby",
            "-D", str(target),
            "-R",  # standby.signal + primary_conninfo
            "-X", "stream",
            "-c", "fast",
            "--no-sync",
        ],
        capture_output=True,
        text=True,
        check=False,
        timeout=60,
        user=None if run_as is None else run_as.pw_uid,
        group=None if run_as is None else run_as.pw_gid,
        extra_groups=None if run_as is None else [],
    )  # fmt: skip
    if result.returncode != 0:
        raise RuntimeError(f"pg_basebackup failed:\n{result.stderr}")


@contextlib.contextmanager
def replicated_pair(*, synchronous: bool) -> Iterator[ReplicatedPair]:
    scratch = Path(tempfile.mkdtemp(prefix="pgcrond-replica-"))
    scratch.chmod(0o755)
    primary = LocalServer(scratch / "primary", durable=False)
    standby = LocalServer(scratch / "standby", durable=False)
    pair = ReplicatedPair(primary, standby, synchronous, scratch)
    try:
        primary.start()
        _basebackup(primary, standby.data_dir)
        standby.start()
        if synchronous:
            # Only on the primary (set after the clone): a promoted standby
            # must not wait for a standby of its own that does not exist.
            _query(primary.dsn, "ALTER SYSTEM SET synchronous_standby_names = '*'")
            _query(primary.dsn, "SELECT pg_reload_conf()")
        pair.wait_streaming()
        yield pair
    finally:
        pair.remove()
