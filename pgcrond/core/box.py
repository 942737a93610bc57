"""A job's box, as data: whom it runs as, its resource limits, what it inherits.

Built once by the config loader (users and groups already looked up) and
carried to the runner in the :class:`~pgcrond.run.attempt.RunRequest`; the
mechanism that enforces it (cgroups, rlimits, the user switch) is
:mod:`pgcrond.run.box`. Pure: no I/O here.
"""

from __future__ import annotations

import fnmatch
import functools
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Literal

from pgcrond.core.actions import Action, CommandAction, EntrypointAction, ShellAction

# `cgroups:` at the top level: a cgroup per attempt where one can be made, or never.
Cgroups = Literal["auto", "never"]

# What every job inherits from pgcrond's environment, whatever `env_passthrough`
# adds: what programs need to be found (PATH), to find their files (HOME,
# TMPDIR), to know who they are (USER, LOGNAME, SHELL) and to read and print
# text and times as the host does (LANG, LANGUAGE, LC_*, TZ). Nothing here
# carries a credential.
BASE_PASSTHROUGH = (
    "PATH",
    "HOME",
    "USER",
    "LOGNAME",
    "SHELL",
    "TMPDIR",
    "LANG",
    "LANGUAGE",
    "LC_*",
    "TZ",
)

# More names every job inherits, set where pgcrond's environment is (a pod
# spec, a unit file) rather than in a config that may serve several places:
# "AWS_*,PYTHONPATH". Like every PGCROND_* variable, it is not passed on itself.
PASSTHROUGH_ENV = "PGCROND_ENV_PASSTHROUGH"


@dataclass(frozen=True)
class Limits:
    """Resource limits of one attempt; None: not limited."""

    memory: int | None = None  # bytes
    cpu: float | None = None  # CPUs: 0.5 is half of one
    nofile: int | None = None
    processes: int | None = None

    def __bool__(self) -> bool:
        return any(v is not None for v in (self.memory, self.cpu, self.nofile, self.processes))

    def describe(self) -> dict[str, str]:
        """The limits as a person writes them (``memory: 512MiB``, ``cpu: 50%``)."""
        shown: dict[str, str] = {}
        if self.memory is not None:
            shown["memory"] = format_size(self.memory)
        if self.cpu is not None:
            shown["cpu"] = f"{self.cpu * 100:g}%"
        if self.nofile is not None:
            shown["nofile"] = str(self.nofile)
        if self.processes is not None:
            shown["processes"] = str(self.processes)
        return shown


@dataclass(frozen=True)
class Account:
    """A user or group to switch to, looked up when the config was loaded."""

    name: str
    id: int


@dataclass(frozen=True)
class Box:
    """``user``/``group``/``limits``/``env_passthrough`` of one job.

    ``home`` is the user's home directory (its ``HOME``); ``groups_known``
    says whether the job takes the user's supplementary groups: the user has
    a passwd entry (a bare uid has none) and no ``group:`` was given (``group``
    is then the user's own, and the field keeps its name: it is part of the
    job's hash, which replicas of every version must agree on).
    """

    user: Account | None = None
    group: Account | None = None
    home: str | None = None
    groups_known: bool = False
    limits: Limits = Limits()
    env_passthrough: tuple[str, ...] = ()

    @property
    def switches(self) -> bool:
        return self.user is not None or self.group is not None

    def passes(self, name: str, also: tuple[str, ...] = ()) -> bool:
        """Whether pgcrond's own variable ``name`` reaches the job (the secrets are
        stripped afterwards all the same, see :func:`pgcrond.run.environment.job_environ`)."""
        return _matcher((*BASE_PASSTHROUGH, *also, *self.env_passthrough))(name) is not None

    def inherited(self, base: Mapping[str, str]) -> dict[str, str]:
        """The part of ``base`` the job inherits; who it is, when it switches user."""
        also = tuple(base.get(PASSTHROUGH_ENV, "").replace(",", " ").split())
        matches = _matcher((*BASE_PASSTHROUGH, *also, *self.env_passthrough))
        environ = {name: value for name, value in base.items() if matches(name) is not None}
        if self.user is not None:
            # The daemon's own HOME and USER would describe root to a job run as nobody.
            environ.update(USER=self.user.name, LOGNAME=self.user.name)
            if self.home is not None:
                environ["HOME"] = self.home
        return environ


@functools.lru_cache(maxsize=256)
def _matcher(patterns: tuple[str, ...]) -> Callable[[str], re.Match[str] | None]:
    """One regular expression for a set of shell patterns: asked for every
    variable of every attempt, so ten thousand co-firing jobs must not pay
    ``fnmatch`` per pattern (a few distinct sets exist: one per ``env_passthrough``)."""
    return re.compile("|".join(fnmatch.translate(p) for p in patterns)).match


def runs_a_process(action: Action) -> bool:
    """Whether a job's action is a child process, the only kind a box can hold:
    an in-process entrypoint, an ``sql:`` and an ``http:`` job run inside pgcrond."""
    if isinstance(action, EntrypointAction):
        return action.isolate
    return isinstance(action, CommandAction | ShellAction)


_SIZE_UNITS = (("TiB", 1 << 40), ("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10))


def format_size(size: int) -> str:
    """``536870912`` -> ``512MiB``: the largest binary unit that divides it, else bytes."""
    for unit, factor in _SIZE_UNITS:
        if size % factor == 0:
            return f"{size // factor}{unit}"
    return f"{size}B"
