"""Who may do what on the status page: its users, their roles, and its TLS files.

A ``viewer`` reads every page; an ``operator`` also pauses, resumes and runs
jobs, all of them or those whose code matches one of its ``jobs`` globs
(:func:`fnmatch.fnmatchcase`, as ``pgcrond pause 'billing-*'`` reads them).
"""

from __future__ import annotations

from dataclasses import dataclass
from fnmatch import fnmatchcase
from pathlib import Path
from typing import Literal

Role = Literal["viewer", "operator"]
ROLES: tuple[Role, ...] = ("viewer", "operator")


@dataclass(frozen=True)
class PageUser:
    """One ``http.users`` entry: its password hash (None: signs in through a proxy only)."""

    # A hash is no password, but no repr of a config (a log, a traceback) shows it.
    password: str | None = None
    role: Role = "viewer"
    # Globs of the job codes an operator may act on; empty: every job.
    jobs: tuple[str, ...] = ()

    def __repr__(self) -> str:
        return f"PageUser(role={self.role!r}, jobs={self.jobs!r})"

    def may_act(self, code: str) -> bool:
        """Whether this user may pause, resume or run ``code``."""
        if self.role != "operator":
            return False
        return not self.jobs or any(fnmatchcase(code, glob) for glob in self.jobs)


@dataclass(frozen=True)
class TlsFiles:
    """``http.tls``: the PEM certificate chain and its private key, read again on SIGHUP."""

    cert: Path
    key: Path
