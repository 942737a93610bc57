"""A real PgBouncer (Debian's ``pgbouncer``) in front of a throwaway server.

``PgBouncer(server, mode)`` writes a config into a directory of its own,
starts the binary in the foreground (under root as ``nobody``, like the
throwaway servers, since PgBouncer refuses to run as root) and waits until it
answers. Tests that need it skip when the binary is missing; CI installs it.
"""

from __future__ import annotations

import contextlib
import os
import pwd
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Literal

import psycopg
from psycopg.conninfo import conninfo_to_dict

from pgcrond.testing import LocalServer

PoolMode = Literal["session", "transaction"]
READY_TIMEOUT_S = 15.0


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def binary() -> str | None:
    return shutil.which("pgbouncer") or (
        "/usr/sbin/pgbouncer" if Path("/usr/sbin/pgbouncer").is_file() else None
    )


def version() -> str:
    """``PgBouncer 1.18.0``: the first line of ``pgbouncer --version``."""
    found = binary()
    if found is None:
        return "none"
    out = subprocess.run([found, "--version"], capture_output=True, text=True, check=False)
    return out.stdout.splitlines()[0].strip() if out.stdout else "unknown"


class PgBouncer:
    """One PgBouncer process pooling every database of ``server`` in ``mode``."""

    def __init__(
        self,
        server_port: int,
        mode: PoolMode,
        *,
        pool_size: int = 20,
        extra: str = "",
    ) -> None:
        self.server_port = server_port
        self.mode = mode
        self.port = free_port()
        self.workdir = Path(tempfile.mkdtemp(prefix=f"pgbouncer-{mode}-"))
        self.workdir.chmod(0o755)
        self.pool_size = pool_size
        self.extra = extra
        self._process: subprocess.Popen[bytes] | None = None
        self._run_as = pwd.getpwnam("nobody") if os.geteuid() == 0 else None

    @property
    def dsn(self) -> str:
        return f"postgresql://postgres@127.0.0.1:{self.port}/postgres"

    @property
    def log_file(self) -> Path:
        return self.workdir / "pgbouncer.log"

    def _write_config(self) -> Path:
        users = self.workdir / "users.txt"
        users.write_text('"postgres" ""\n')
        ini = self.workdir / "pgbouncer.ini"
        ini.write_text(
            "[databases]\n"
            f"* = host=127.0.0.1 port={self.server_port}\n"
            "[pgbouncer]\n"
            "listen_addr = 127.0.0.1\n"
            f"listen_port = {self.port}\n"
            "unix_socket_dir =\n"
            "auth_type = trust\n"
            f"auth_file = {users}\n"
            f"pool_mode = {self.mode}\n"
            f"default_pool_size = {self.pool_size}\n"
            "max_client_conn = 500\n"
            f"logfile = {self.log_file}\n"
            "server_login_retry = 1\n"
            "ignore_startup_parameters = extra_float_digits\n"
            f"{self.extra}"
        )
        for path in (users, ini):
            path.chmod(0o644)
        if self._run_as is not None:
            os.chown(self.workdir, self._run_as.pw_uid, self._run_as.pw_gid)
        return ini

    def start(self) -> PgBouncer:
        found = binary()
        if found is None:
            raise RuntimeError("pgbouncer is not installed (apt-get install pgbouncer)")
        ini = self._write_config()
        self._process = subprocess.Popen(
            [found, str(ini)],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=(self.workdir / "stderr.log").open("ab"),
            start_new_session=True,
            user=None if self._run_as is None else self._run_as.pw_uid,
            group=None if self._run_as is None else self._run_as.pw_gid,
            extra_groups=None if self._run_as is None else [],
        )
        self._wait_ready()
        return self

    def _wait_ready(self) -> None:
        deadline = time.monotonic() + READY_TIMEOUT_S
        while True:
            assert self._process is not None
            if self._process.poll() is not None:
                raise RuntimeError(f"pgbouncer exited {self._process.returncode}:\n{self.logs()}")
            try:
                with psycopg.connect(self.dsn, connect_timeout=2, autocommit=True) as conn:
                    conn.execute("SELECT 1")
                return
            except psycopg.OperationalError:
                if time.monotonic() > deadline:
                    raise
            time.sleep(0.05)

    def logs(self) -> str:
        parts = []
        for name in ("pgbouncer.log", "stderr.log"):
            with contextlib.suppress(OSError):
                parts.append((self.workdir / name).read_text(errors="replace")[-3000:])
        return "\n".join(parts)

    def stop(self) -> None:
        if self._process is None:
            return
        if self._process.poll() is None:
            # SIGINT: safe shutdown, SIGTERM: immediate; either way it is ours.
            self._process.send_signal(signal.SIGTERM)
            try:
                self._process.wait(10)
            except subprocess.TimeoutExpired:
                self._process.kill()
                self._process.wait(10)
        self._process = None

    def remove(self) -> None:
        died = self._process is not None and self._process.poll() is not None
        logs = self.logs() if died else ""
        code = None if self._process is None else self._process.returncode
        self.stop()
        shutil.rmtree(self.workdir, ignore_errors=True)
        if died:
            # Only the test stops it: an exit before that is the failure to explain.
            raise RuntimeError(f"pgbouncer exited {code} before the test ended:\n{logs}")


@contextlib.contextmanager
def pgbouncer(
    server: LocalServer | int, mode: PoolMode, *, pool_size: int = 20, extra: str = ""
) -> Iterator[PgBouncer]:
    port = server if isinstance(server, int) else server.port
    bouncer = PgBouncer(port, mode, pool_size=pool_size, extra=extra)
    try:
        yield bouncer.start()
    finally:
        bouncer.remove()


def server_port(dsn: str) -> int:
    params = conninfo_to_dict(dsn)
    assert params.get("host") in ("127.0.0.1", "localhost"), "PgBouncer runs on this machine"
    return int(str(params.get("port", 5432)))
