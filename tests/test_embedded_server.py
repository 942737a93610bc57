"""The embedded database admits no other local user.

The daemon's embedded server (``database: {embedded: true}``) trusts its
local connections, so it listens on a Unix socket only
(``listen_addresses=''``), in its data directory (0700, owned by the server's
user): on TCP 127.0.0.1 any local user could connect as superuser. Throwaway servers for
tests keep TCP: the suite's proxies, PgBouncer and replication reach them by
address.
"""

from __future__ import annotations

import os
import pwd
import shutil
import socket
import stat
import subprocess
import tempfile
from pathlib import Path

import psycopg
import pytest

from pgcrond.storage.embedded import attach, find_bindir, running_dsn

# Starts replicas or servers: the system tier.
pytestmark = pytest.mark.usefixtures("system_processes")


def test_the_embedded_server_refuses_tcp_and_other_users() -> None:
    # Under root the server runs as 'nobody', which must be able to enter the
    # path: pytest's tmp_path is private to root.
    state_dir = Path(tempfile.mkdtemp(prefix="pgcrond-test-"))
    state_dir.chmod(0o755)
    dsn, server = attach(state_dir)
    assert server is not None
    try:
        with psycopg.connect(dsn, autocommit=True) as conn:
            ((listening,),) = conn.execute("SHOW listen_addresses").fetchall()
        assert "" == listening
        with (
            pytest.raises(ConnectionRefusedError),
            socket.create_connection(("127.0.0.1", server.port), timeout=5),
        ):
            pass
        # The socket's directory is private to the server's user.
        socket_dir = server.data_dir
        mode = socket_dir.stat()
        assert 0o700 == stat.S_IMODE(mode.st_mode)
        assert (server.data_dir / f".s.PGSQL.{server.port}").is_socket()
        # Another process of this host finds the same server, by its socket.
        assert dsn == running_dsn(server.data_dir)
        if os.geteuid() == 0:
            # Any other local user is refused at the directory, before PostgreSQL.
            other = pwd.getpwnam("daemon")
            assert other.pw_uid != mode.st_uid
            psql = find_bindir() / "psql"
            probe = subprocess.run(
                [str(psql), "-h", str(server.socket_dir), "-p", str(server.port), "-U", "postgres",
                 "-c", "SELECT 1"],
                capture_output=True,
                text=True,
                user=other.pw_uid,
                group=other.pw_gid,
                extra_groups=[],
                check=False,
                cwd="/",
            )  # fmt: skip
            assert 0 != probe.returncode
            assert "Permission denied" in probe.stderr
    finally:
        server.remove()
        shutil.rmtree(state_dir, ignore_errors=True)
