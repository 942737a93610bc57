"""Each attempt of a child-process job in its own box: a cgroup, rlimits, another user.

How the host can box a job is found once (:func:`configure`, at the daemon's
start and by ``pgcrond check --explain``):

* **cgroup v2**, when pgcrond's own cgroup is delegated to it (systemd
  ``Delegate=yes``, which marks it with a ``trusted.delegate`` xattr, or a
  container's own cgroup namespace, where it is ``/``) and offers the
  ``memory`` and ``pids`` controllers. pgcrond moves itself into a leaf
  ``pgcrond.daemon`` (a v2 cgroup with processes cannot enable controllers
  for its children) and makes one cgroup per attempt under
  ``pgcrond.jobs/<its pid>``.
* **cgroup v1**, when the ``freezer`` hierarchy is writable (it is what
  stops every process of a cgroup at once), with ``memory``, ``pids`` and
  ``cpu`` where mounted: one cgroup per attempt under ``pgcrond/<its pid>``
  in the freezer, and in each of the others whose limit the job sets.
* **rlimits** otherwise (or with ``cgroups: never``): per process, not per job.

An attempt's cgroup is joined before the job's program starts, by a
``/bin/sh`` that writes its own pid into the cgroup and then execs the rest,
so nothing the job forks can be outside it; Python's ``preexec_fn`` would do
it in the child too, but is unsafe in a threaded process. The user switch is
util-linux's ``setpriv``, the rlimits util-linux's ``prlimit``, each also
exec'd in turn. A cgroup is killed whole (v2 ``cgroup.kill``; v1 freeze,
SIGKILL every pid, thaw), which is what reaches a grandchild that left the
job's process group with ``setsid``.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import functools
import os
import re
import secrets
import shutil
import signal
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

import structlog
from structlog.typing import FilteringBoundLogger

from pgcrond.core.box import Box, Cgroups, Limits, format_size
from pgcrond.run.attempt import Ending

Mode = Literal["cgroup v2", "cgroup v1", "rlimits"]

_log: FilteringBoundLogger = structlog.get_logger("pgcrond.run.box")

# Where the kernel says which cgroups this process is in (cgroup) and where
# they are mounted (mountinfo).
PROC_SELF = Path("/proc/self")
V1_CONTROLLERS = ("freezer", "memory", "pids", "cpu")
V2_CONTROLLERS = ("memory", "pids", "cpu")
JOBS_DIR = "pgcrond.jobs"
DAEMON_DIR = "pgcrond.daemon"
# The CFS period cpu limits are written against (the kernel's default).
CPU_PERIOD_US = 100_000
# A killed cgroup empties within milliseconds; one that has not after this is
# left behind (a directory, no process: each attempt has its own name) and
# the log says so (job_cgroup_left), rather than holding up the run's record.
_EMPTY_TIMEOUT_S = 5.0
_POLL_S = 0.005
# Writes its own pid into each cgroup named before "--", then execs the rest:
# the job's program starts inside its cgroup.
_JOIN = 'while [ "$1" != -- ]; do echo 0 >"$1" || exit 125; shift; done; shift; exec "$@"'


@dataclass(frozen=True)
class Host:
    """How this host boxes jobs: the mode, why, and the cgroup directories to use.

    ``parents`` maps a v1 controller (or ``"v2"``) to the directory under which
    each attempt's cgroup is made.
    """

    mode: Mode
    reason: str
    parents: dict[str, Path] = field(default_factory=dict)

    def enforcement(self) -> dict[str, str]:
        """Limit -> how it is enforced here (for the start log and ``check --explain``)."""
        if self.mode == "cgroup v2":
            return {
                "memory": "cgroup memory.max (whole job; swap off)",
                "cpu": "cgroup cpu.max (whole job)",
                "processes": "cgroup pids.max (whole job)",
                "nofile": "rlimit RLIMIT_NOFILE (each process)",
            }
        rlimit = {
            "memory": "rlimit RLIMIT_AS (each process's address space)",
            "cpu": "not enforced (no cgroup)",
            "processes": "rlimit RLIMIT_NPROC (all processes of the job's user; not for root)",
            "nofile": "rlimit RLIMIT_NOFILE (each process)",
        }
        if self.mode == "rlimits":
            return rlimit
        by_cgroup = {
            "memory": "cgroup memory.limit_in_bytes (whole job; swap off)",
            "cpu": "cgroup cpu.cfs_quota_us (whole job)",
            "processes": "cgroup pids.max (whole job)",
        }
        return {
            name: by_cgroup[name] if controller in self.parents else rlimit[name]
            for name, controller in (("memory", "memory"), ("cpu", "cpu"), ("processes", "pids"))
        } | {"nofile": rlimit["nofile"]}


_host: Host | None = None


def configure(setting: Cgroups = "auto", *, prepare: bool = True) -> Host:
    """Find how this host boxes jobs and remember it for every later attempt.

    ``prepare`` (the daemon): make the v2 layout (pgcrond moves itself into its
    leaf). ``check --explain`` only looks.
    """
    global _host  # noqa: PLW0603 - one answer per process, like the host it describes
    _host = detect(setting, prepare=prepare)
    if prepare:
        _sweep(_host.parents.values())
    return _host


def _sweep(parents: Iterable[Path]) -> None:
    """Remove the attempts' cgroups that replicas killed on this host left behind.

    Each replica makes its attempts' cgroups under a directory named by its
    pid: a replica that was SIGKILLed (its jobs die with it, by their death
    signal) could not remove its own, and a starting one removes those of
    pids no longer alive. A cgroup that still holds a process is not removed
    (the kernel refuses), so nothing running is touched.
    """
    for parent in parents:
        with contextlib.suppress(OSError):
            for other in parent.parent.iterdir():
                if other.name.isdigit() and other != parent and not _alive(int(other.name)):
                    for cell in (d for d in other.iterdir() if d.is_dir()):
                        with contextlib.suppress(OSError):
                            cell.rmdir()
                    with contextlib.suppress(OSError):
                        other.rmdir()


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def host() -> Host:
    """The answer of :func:`configure`; the first attempt of a process that never
    configured (a test, ``pgcrond trigger``) finds it with the default setting."""
    return _host if _host is not None else configure()


def detect(setting: Cgroups, *, prepare: bool, proc: Path = PROC_SELF) -> Host:
    """How jobs can be boxed, by what ``proc`` (``/proc/self``) says of this process."""
    if setting == "never":
        return Host("rlimits", "cgroups: never in the config")
    try:
        memberships = _memberships((proc / "cgroup").read_text())
        mounts = _mounts((proc / "mountinfo").read_text())
    except OSError as exc:
        return Host("rlimits", f"cannot read this process's cgroups: {exc.strerror}")
    v2_reason = "no cgroup v2 mount"
    if "" in mounts and "" in memberships:
        own = mounts[""] / memberships[""].lstrip("/")
        v2 = _v2_parent(own, memberships[""], prepare=prepare)
        if isinstance(v2, Path):
            return Host("cgroup v2", f"delegated cgroup {own}", {"v2": v2})
        v2_reason = v2
    parents = {}
    for controller in V1_CONTROLLERS:
        if controller in mounts and controller in memberships:
            own = mounts[controller] / memberships[controller].lstrip("/")
            if _writable(own):
                parents[controller] = own / "pgcrond" / str(os.getpid())
    if "freezer" in parents:
        names = ", ".join(parents)
        return Host("cgroup v1", f"writable v1 hierarchies: {names} ({v2_reason})", parents)
    return Host(
        "rlimits", f"no cgroup to make: {v2_reason}; no writable cgroup v1 freezer hierarchy"
    )


def _memberships(text: str) -> dict[str, str]:
    """Controller -> this process's cgroup path; ``""`` is the v2 one (``0::/path``)."""
    found: dict[str, str] = {}
    for line in text.splitlines():
        _, controllers, path = line.split(":", 2)
        for controller in controllers.split(",") if controllers else [""]:
            found[controller] = path
    return found


def _mounts(text: str) -> dict[str, Path]:
    """Controller -> its hierarchy's mount point; ``""`` for the v2 hierarchy."""
    found: dict[str, Path] = {}
    for line in text.splitlines():
        fields, _, tail = line.partition(" - ")
        parts, extra = fields.split(), tail.split()
        if len(parts) < 5 or len(extra) < 3 or parts[3] != "/":
            continue  # a bind mount of a sub-cgroup does not show the hierarchy's root
        if extra[0] == "cgroup2":
            found.setdefault("", Path(parts[4]))
        elif extra[0] == "cgroup":
            for option in extra[2].split(","):
                found.setdefault(option, Path(parts[4]))
    return found


def _writable(directory: Path) -> bool:
    return os.access(directory, os.W_OK) and os.access(directory / "cgroup.procs", os.W_OK)


def _v2_parent(own: Path, path: str, *, prepare: bool) -> Path | str:
    """The directory for attempts' cgroups under a delegated v2 cgroup, or why there is none."""
    try:
        controllers = (own / "cgroup.controllers").read_text().split()
    except OSError:
        return "cgroup v2 not readable"
    if not {"memory", "pids"} <= set(controllers):
        return "cgroup v2 offers no memory and pids controllers (they are on v1)"
    if not _writable(own):
        return f"cgroup v2 {own} is not writable by this user"
    if path != "/" and not _delegated(own):
        return f"cgroup v2 {own} is not delegated (systemd Delegate=yes)"
    jobs = own / JOBS_DIR
    mine = jobs / str(os.getpid())
    if not prepare:
        return mine
    wanted = " ".join(f"+{c}" for c in V2_CONTROLLERS if c in controllers)
    try:
        leaf = own / DAEMON_DIR
        leaf.mkdir(exist_ok=True)
        (leaf / "cgroup.procs").write_text(str(os.getpid()))
        (own / "cgroup.subtree_control").write_text(wanted)
        for inner in (jobs, mine):
            inner.mkdir(exist_ok=True)
            (inner / "cgroup.subtree_control").write_text(wanted)
    except OSError as exc:
        # EBUSY: processes other than pgcrond share its cgroup.
        return f"cannot set up cgroup v2 {own}: {exc.strerror}"
    return mine


def _delegated(directory: Path) -> bool:
    for name in ("trusted.delegate", "user.delegate"):
        with contextlib.suppress(OSError):
            if os.getxattr(directory, name) == b"1":
                return True
    return False


# -- one attempt ------------------------------------------------------------------


class BoxError(OSError):
    """The attempt's box could not be made: the attempt fails as "cannot start"."""


class Cell:
    """One attempt's box: entered by the wrapped argv, killed whole, then removed."""

    def __init__(self, job: str, box: Box, where: Host | None = None) -> None:
        self.box = box
        self.host = where or host()
        # Controller (or "v2") -> this attempt's cgroup directory, once made.
        self.dirs: dict[str, Path] = {}
        self.oom_kills = 0
        # A readable name for people looking at the cgroup tree; the suffix keeps
        # two attempts of one job apart.
        self.name = f"{re.sub(r'[^A-Za-z0-9_.-]', '_', job)[:64]}.{secrets.token_hex(4)}"

    def enter(self, argv: list[str]) -> list[str]:
        """Make the cgroup (when the host has them) and wrap ``argv`` to run inside the box."""
        prefix: list[str] = []
        if self.host.mode != "rlimits":
            procs = [str(d / "cgroup.procs") for d in self._make()]
            prefix += ["/bin/sh", "-c", _JOIN, "pgcrond-join", *procs, "--"]
        if rlimits := self._rlimits():
            prefix += [_tool("prlimit"), *rlimits, "--"]
        if self.box.switches:
            prefix += [_tool("setpriv"), *self._switch(), "--"]
        return prefix + argv

    async def kill(self) -> None:
        """SIGKILL every process of the cgroup, grandchildren that called setsid included."""
        if not any(_pids(d) for d in self.dirs.values()):
            return  # the usual end: the job left nothing behind
        if "v2" in self.dirs:
            kill_file = self.dirs["v2"] / "cgroup.kill"
            if kill_file.exists():
                kill_file.write_text("1")
            else:  # before Linux 5.14
                await _freeze_kill(self.dirs["v2"], "cgroup.freeze", "1", "0")
        elif "freezer" in self.dirs:
            await _freeze_kill(self.dirs["freezer"], "freezer.state", "FROZEN", "THAWED")

    async def close(self) -> None:
        """Kill what is left, wait for the cgroup to empty, read whether the kernel
        killed for memory, and remove it."""
        if not self.dirs:
            return
        await self.kill()
        await _until(lambda: not any(_pids(d) for d in self.dirs.values()))
        self.oom_kills = sum(_oom_kills(d) for d in self.dirs.values())
        for directory in self.dirs.values():
            refused: list[OSError] = []
            # A killed process still counts in its cgroup until its parent
            # reaps it, and an orphan's parent is init, in its own time: the
            # cgroup is busy until then.
            await _until(functools.partial(_removed, directory, refused))
            if refused:
                error = refused[-1].strerror
                _log.warning("job_cgroup_left", cgroup=str(directory), error=error)
        self.dirs = {}

    def judged(self, ending: Ending) -> Ending:
        """``ending``, saying so when the kernel killed the job over its memory limit."""
        memory = self.box.limits.memory
        if self.oom_kills and memory is not None and ending.outcome == "fail":
            error = f"killed: memory limit {format_size(memory)} exceeded (oom)"
            return Ending("fail", error, ending.exit_code)
        return ending

    def _make(self) -> list[Path]:
        for controller, parent in self.host.parents.items():
            if not _needed(controller, self.box.limits):
                continue
            directory = parent / self.name
            try:
                parent.mkdir(parents=True, exist_ok=True)
                directory.mkdir()
                self.dirs[controller] = directory
                for name, value in _settings(controller, self.box.limits):
                    if (directory / name).exists():
                        (directory / name).write_text(value)
            except OSError as exc:
                raise BoxError(
                    exc.errno, f"cannot make the job's cgroup {directory}: {exc.strerror}"
                ) from None
        return list(self.dirs.values())

    def _rlimits(self) -> list[str]:
        limits, by_cgroup = self.box.limits, set(self.host.parents)
        options = []
        if limits.nofile is not None:
            options.append(f"--nofile={limits.nofile}:{limits.nofile}")
        if limits.memory is not None and not by_cgroup & {"memory", "v2"}:
            options.append(f"--as={limits.memory}:{limits.memory}")
        if limits.processes is not None and not by_cgroup & {"pids", "v2"}:
            options.append(f"--nproc={limits.processes}:{limits.processes}")
        return options

    def _switch(self) -> list[str]:
        box = self.box
        options = []
        if box.user is not None:
            options.append(f"--reuid={box.user.id}")
        if box.group is not None:
            options.append(f"--regid={box.group.id}")
        # Supplementary groups: the user's own, or none (never the daemon's).
        if box.user is not None and box.groups_known:
            options.append("--init-groups")
        else:
            options.append("--clear-groups")
        return options


async def _freeze_kill(directory: Path, state: str, frozen: str, thawed: str) -> None:
    # Frozen, no process can fork a new one between the read of the pid list
    # and the kills; the SIGKILLs are delivered at the thaw.
    (directory / state).write_text(frozen)
    await _until(lambda: _frozen(directory, state, frozen))
    for pid in _pids(directory):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    (directory / state).write_text(thawed)


async def _until(done: Callable[[], bool]) -> None:
    """Poll a cgroup file until ``done``, for at most ``_EMPTY_TIMEOUT_S``.

    Polled: v1 offers no wake-up for emptiness or freezing, and an attempt
    waits here once, for milliseconds.
    """
    for _ in range(round(_EMPTY_TIMEOUT_S / _POLL_S)):
        if done():
            return
        await asyncio.sleep(_POLL_S)


def _removed(directory: Path, refused: list[OSError]) -> bool:
    """Remove the cgroup; False while it is busy (``refused`` keeps why), True once
    removed or refused for good."""
    try:
        directory.rmdir()
    except FileNotFoundError:
        pass
    except OSError as exc:
        refused[:] = [exc]
        return exc.errno != errno.EBUSY
    refused.clear()
    return True


def _frozen(directory: Path, state: str, frozen: str) -> bool:
    with contextlib.suppress(OSError):
        if state == "freezer.state":
            return (directory / state).read_text().strip() == frozen
        return "frozen 1" in (directory / "cgroup.events").read_text()
    return False


def _oom_kills(directory: Path) -> int:
    for name in ("memory.events", "memory.oom_control"):
        with contextlib.suppress(OSError):
            found = re.search(r"^oom_kill (\d+)$", (directory / name).read_text(), re.MULTILINE)
            if found:
                return int(found.group(1))
    return 0


def _needed(controller: str, limits: Limits) -> bool:
    """Whether an attempt's cgroup in ``controller`` serves it (``v2``: one for all of them).

    A v1 ``memory``, ``pids`` or ``cpu`` cgroup only serves its limit; the
    ``freezer`` one is what kills the whole job. Each is a mkdir, a join and
    an rmdir in the kernel's cgroup locks: 1,000 co-firing commands on 3
    replicas, each in all four, held a replica's loop 100-230 ms at a time
    waiting for them.
    """
    if controller == "memory":
        return limits.memory is not None
    if controller == "pids":
        return limits.processes is not None
    if controller == "cpu":
        return limits.cpu is not None
    return True


def _settings(controller: str, limits: Limits) -> Iterable[tuple[str, str]]:
    """The files to write for ``limits`` in a cgroup of ``controller`` (``v2``: all of them)."""
    if limits.memory is not None and controller in ("memory", "v2"):
        # Swap off, so that the limit is what the job can use and going over it
        # ends in the OOM kill the attempt is recorded with, not in swapping.
        yield from (
            ("memory.limit_in_bytes", str(limits.memory)),
            ("memory.memsw.limit_in_bytes", str(limits.memory)),
            ("memory.max", str(limits.memory)),
            ("memory.swap.max", "0"),
            # v2: the oom kill takes the whole job, not one of its processes,
            # so no half of it runs on to fail later for another reason.
            ("memory.oom.group", "1"),
        )
    if limits.processes is not None and controller in ("pids", "v2"):
        yield ("pids.max", str(limits.processes))
    if limits.cpu is not None and controller in ("cpu", "v2"):
        quota = max(1000, round(limits.cpu * CPU_PERIOD_US))
        yield from (
            ("cpu.cfs_period_us", str(CPU_PERIOD_US)),
            ("cpu.cfs_quota_us", str(quota)),
            ("cpu.max", f"{quota} {CPU_PERIOD_US}"),
        )


def _pids(directory: Path) -> list[int]:
    try:
        return [int(line) for line in (directory / "cgroup.procs").read_text().split()]
    except OSError:
        return []


def _tool(name: str) -> str:
    found = shutil.which(name)
    if found is None:
        raise BoxError(
            errno.ENOENT, f"{name} (util-linux) is not installed; it is what sets a job's box"
        )
    return found
