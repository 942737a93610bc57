"""A PostgreSQL server that pgcrond starts in a directory of its own.

Used for ``database: {embedded: true}`` (trying pgcrond out, single-node use)
and by the test suite for throwaway servers. It uses the system's PostgreSQL
binaries, or those of the ``pgserver`` wheel when installed. PostgreSQL
refuses to run as root, so under root the server runs as ``nobody`` and owns
only its data directory; a state directory that ``nobody`` cannot enter (a
clone in root's 0700 home, a ``mktemp -d``) is kept under /var/tmp instead
(:func:`state_home`).

The server trusts whoever reaches it (no password to keep), so who can reach
it is the guard: the embedded server listens on no TCP port at all, only on a
Unix socket in its data directory, which PostgreSQL keeps private to the
server's user (0700). Throwaway servers for tests (``tcp=True``) listen on
127.0.0.1 as well: proxies, PgBouncer and standbys reach them by address.
"""

from __future__ import annotations

import contextlib
import glob
import hashlib
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
from types import TracebackType
from urllib.parse import quote

from pgcrond.errors import EmbeddedServerError

READY_TIMEOUT_S = 60.0
# sun_path holds 108 bytes with its NUL: a deeper data directory cannot hold
# the socket, which then goes to a private directory of its own in /tmp.
MAX_SOCKET_PATH = 107
# Under root, where the server of a state directory that 'nobody' cannot enter
# lives: /var/tmp is world-searchable, survives a reboot (unlike /tmp on many
# hosts) and is meant for exactly this kind of state.
SHARED_STATE = Path("/var/tmp")  # noqa: S108 - its directory is checked: _private_parent


def find_bindir() -> Path:
    """Where ``initdb`` and ``postgres`` live; PGCROND_PG_BINDIR wins."""
    candidates: list[str] = []
    if override := os.environ.get("PGCROND_PG_BINDIR"):
        candidates.append(override)
    if pg_config := shutil.which("pg_config"):
        with contextlib.suppress(OSError, subprocess.CalledProcessError):
            candidates.append(
                subprocess.run(
                    [pg_config, "--bindir"], capture_output=True, text=True, check=True
                ).stdout.strip()
            )
    candidates += sorted(
        glob.glob("/usr/lib/postgresql/*/bin"),
        key=lambda path: int(path.split("/")[-2]) if path.split("/")[-2].isdigit() else 0,
        reverse=True,
    )
    with contextlib.suppress(ImportError):
        import pgserver

        candidates.append(str(Path(pgserver.__file__).parent / "pginstall" / "bin"))
    for candidate in candidates:
        if (Path(candidate) / "initdb").is_file() and (Path(candidate) / "postgres").is_file():
            return Path(candidate)
    raise EmbeddedServerError(
        "no PostgreSQL server binaries found: install PostgreSQL "
        "(e.g. apt-get install postgresql) or `pip install pgserver`, "
        "or set PGCROND_PG_BINDIR to the directory holding initdb and postgres"
    )


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


class LocalServer:
    """One PostgreSQL server: ``start()``, ``stop()``, ``kill()``, ``dsn``.

    ``durable=False`` turns fsync off: a killed server loses nothing, a crashed
    host could; right for tests, wrong for real data.
    """

    def __init__(
        self,
        data_dir: Path,
        *,
        port: int | None = None,
        durable: bool = True,
        max_connections: int = 100,
        tcp: bool = True,
    ) -> None:
        self.data_dir = data_dir.resolve()
        self.port = port or free_port()
        self.durable = durable
        self.max_connections = max_connections
        self.tcp = tcp
        self.socket_dir = self.data_dir
        self._bindir = find_bindir()
        self._process: subprocess.Popen[bytes] | None = None
        self._run_as = pwd.getpwnam("nobody") if os.geteuid() == 0 else None

    @property
    def dsn(self) -> str:
        return _dsn(self.port, None if self.tcp else self.socket_dir)

    @property
    def log_file(self) -> Path:
        return self.data_dir.parent / f"{self.data_dir.name}.log"

    @property
    def _uid(self) -> int | None:
        return None if self._run_as is None else self._run_as.pw_uid

    @property
    def _gid(self) -> int | None:
        return None if self._run_as is None else self._run_as.pw_gid

    @property
    def _extra_groups(self) -> list[int] | None:
        return None if self._run_as is None else []

    def _prepare(self) -> None:
        if (self.data_dir / "PG_VERSION").is_file():
            return
        self.data_dir.mkdir(parents=True, exist_ok=True)
        self.data_dir.chmod(0o700)
        if self._run_as is not None:
            os.chown(self.data_dir, self._run_as.pw_uid, self._run_as.pw_gid)
            for parent in self.data_dir.parents:
                if not parent.stat().st_mode & 0o001:
                    raise EmbeddedServerError(
                        f"running as root, PostgreSQL runs as 'nobody', which cannot enter "
                        f"{parent}: choose a state directory under a world-searchable path "
                        f"(or chmod o+x {parent})"
                    )
        result = subprocess.run(
            [
                str(self._bindir / "initdb"),
                "-D", str(self.data_dir),
                "-U", "postgres",
                "-A", "trust",
                "-E", "UTF8",
                "--locale=C",
                "--no-sync",
            ],
            capture_output=True,
            text=True,
            check=False,
            user=self._uid,
            group=self._gid,
            extra_groups=self._extra_groups,
        )  # fmt: skip
        if result.returncode != 0:
            raise EmbeddedServerError(f"initdb failed in {self.data_dir}:\n{result.stderr}")

    def start(self) -> None:
        """Start and wait until it accepts connections; raises with the server log."""
        self._prepare()
        self.socket_dir = self._private_socket_dir()
        settings = [
            f"listen_addresses={'127.0.0.1' if self.tcp else ''}",
            f"unix_socket_directories={self.socket_dir}",
            "unix_socket_permissions=0700",
            f"max_connections={self.max_connections}",
        ]
        if not self.durable:
            # Still crash-safe for a killed server (WAL reaches the OS cache on
            # commit); only a host crash could lose data.
            settings += ["fsync=off", "full_page_writes=off"]
        args = [str(self._bindir / "postgres"), "-D", str(self.data_dir), "-p", str(self.port)]
        for setting in settings:
            args += ["-c", setting]
        log = self.log_file.open("ab")
        if self._run_as is not None:
            os.chown(self.log_file, self._run_as.pw_uid, self._run_as.pw_gid)
        # Its own session, so kill() can take the postmaster and every backend at once.
        self._process = subprocess.Popen(
            args,
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            user=self._uid,
            group=self._gid,
            extra_groups=self._extra_groups,
        )
        log.close()
        self._wait_ready()

    def _private_socket_dir(self) -> Path:
        if len(f"{self.data_dir}/.s.PGSQL.{self.port}".encode()) <= MAX_SOCKET_PATH:
            return self.data_dir  # 0700, the server's user's: PostgreSQL insists
        directory = Path(tempfile.mkdtemp(prefix="pgcrond-pg-"))  # 0700
        if self._run_as is not None:
            os.chown(directory, self._run_as.pw_uid, self._run_as.pw_gid)
        return directory

    def _wait_ready(self) -> None:
        deadline = time.monotonic() + READY_TIMEOUT_S
        while time.monotonic() < deadline:
            assert self._process is not None
            if self._process.poll() is not None:
                raise EmbeddedServerError(
                    f"PostgreSQL exited with status {self._process.returncode}:\n"
                    + self._log_tail()
                )
            host = "127.0.0.1" if self.tcp else str(self.socket_dir)
            probe = subprocess.run(
                [str(self._bindir / "pg_isready"), "-q", "-h", host, "-p", str(self.port)],
                check=False,
            )
            if probe.returncode == 0:
                return
            time.sleep(0.05)
        raise EmbeddedServerError(
            f"PostgreSQL not ready after {READY_TIMEOUT_S:g}s:\n" + self._log_tail()
        )

    def _log_tail(self) -> str:
        try:
            return "\n".join(self.log_file.read_text(errors="replace").splitlines()[-20:])
        except OSError:
            return "(no server log)"

    @property
    def running(self) -> bool:
        return self._process is not None and self._process.poll() is None

    def stop(self, timeout: float = 30.0) -> None:
        """Fast shutdown: running transactions are rolled back, clients cut."""
        if self._process is None:
            return
        if self._process.poll() is None:
            self._process.send_signal(signal.SIGINT)
            try:
                self._process.wait(timeout)
            except subprocess.TimeoutExpired:
                self.kill()
        self._process = None

    def kill(self) -> None:
        """SIGKILL the postmaster and all its backends, like a host crash."""
        if self._process is None:
            return
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self._process.pid, signal.SIGKILL)
        self._process.wait()
        self._process = None
        # Backends are in the same process group; wait until none is left so a
        # restart does not find the old shared memory still attached.
        deadline = time.monotonic() + 10
        while _group_alive(self.data_dir) and time.monotonic() < deadline:
            time.sleep(0.05)

    def remove(self) -> None:
        self.stop()
        shutil.rmtree(self.data_dir, ignore_errors=True)
        shutil.rmtree(self.socket_dir, ignore_errors=True)
        with contextlib.suppress(FileNotFoundError):
            self.log_file.unlink()

    def __enter__(self) -> LocalServer:
        self.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()


def _group_alive(data_dir: Path) -> bool:
    """Whether any process still has ``data_dir`` on its command line."""
    marker = str(data_dir).encode()
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        with contextlib.suppress(OSError):
            if marker in (proc / "cmdline").read_bytes():
                return True
    return False


def _dsn(port: int, socket_dir: Path | None) -> str:
    if socket_dir is None:
        return f"postgresql://postgres@127.0.0.1:{port}/postgres"
    return f"postgresql://postgres@/postgres?host={quote(str(socket_dir), safe='')}&port={port}"


def running_dsn(data_dir: Path) -> str | None:
    """The DSN of a server already running on ``data_dir``, from its postmaster.pid.

    By its socket when it listens on no TCP address (the embedded server since
    it stopped listening on 127.0.0.1; one started before still does).
    """
    try:
        lines = (data_dir / "postmaster.pid").read_text().splitlines()
        pid, port = int(lines[0]), int(lines[3])
        socket_dir, listening = lines[4], lines[5]
    except (OSError, IndexError, ValueError):
        return None
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return None
    except PermissionError:
        pass  # alive, owned by 'nobody'
    return _dsn(port, None if listening.strip() else Path(socket_dir))


def state_home(state_dir: Path, *, shared: Path = SHARED_STATE) -> tuple[Path, Path | None]:
    """Where the embedded server of ``state_dir`` keeps its files, and why not there.

    ``state_dir`` itself (and None), unless this process is root and 'nobody',
    the server's user then, cannot enter one of its directories: then a
    directory of its own under ``shared``, named for ``state_dir``'s
    absolute path so that every command run with the same config finds the same
    server, and the directory 'nobody' could not enter.
    """
    wanted = state_dir.resolve()
    if os.geteuid() != 0:
        return wanted, None
    blocked = next(
        (
            directory
            for directory in reversed([wanted, *wanted.parents])
            if directory.is_dir() and not directory.stat().st_mode & 0o001
        ),
        None,
    )
    if blocked is None:
        return wanted, None
    digest = hashlib.sha256(str(wanted).encode()).hexdigest()[:12]
    parent = shared / f"pgcrond-{os.geteuid()}"
    _private_parent(parent)
    home = parent / f"{wanted.name.lstrip('.') or 'state'}-{digest}"
    with contextlib.suppress(FileExistsError):
        home.mkdir(mode=0o711)
    return home, blocked


def _private_parent(directory: Path) -> None:
    """Make ``directory`` (0711: 'nobody' passes through, lists nothing), or check that the
    one there is this user's and nobody else may write in it: another user's directory there
    could hand our server's state to them."""
    with contextlib.suppress(FileExistsError):
        directory.mkdir(mode=0o711)
    found = directory.lstat()
    if found.st_uid != os.geteuid() or found.st_mode & 0o022 or directory.is_symlink():
        raise EmbeddedServerError(
            f"{directory} is not this user's own directory (owner uid {found.st_uid}, mode "
            f"{found.st_mode & 0o777:o}): remove it, or set database.state_dir to a directory "
            "'nobody' can enter"
        )


def attach(state_dir: Path) -> tuple[str, LocalServer | None]:
    """Use the embedded server of ``state_dir``, starting it if it is not running.

    Returns the DSN and the server when this process started it (and so
    stops it); replicas on the same host share one server.
    """
    data_dir = state_dir / "data"
    if dsn := running_dsn(data_dir):
        return dsn, None
    server = LocalServer(data_dir, tcp=False)
    server.start()
    return server.dsn, server


@contextlib.contextmanager
def throwaway(*, max_connections: int = 100, prefix: str = "pgcrond-") -> Iterator[LocalServer]:
    """A started, non-durable server in a fresh temporary directory, removed afterwards.

    For tests and benchmarks. The directory is world-searchable because under
    root the server runs as 'nobody'.
    """
    scratch = Path(tempfile.mkdtemp(prefix=prefix))
    scratch.chmod(0o755)
    server = LocalServer(scratch / "data", durable=False, max_connections=max_connections)
    try:
        server.start()
        yield server
    finally:
        server.remove()
        shutil.rmtree(scratch, ignore_errors=True)
