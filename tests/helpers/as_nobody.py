"""Running pgcrond as 'nobody' from any checkout.

A checkout may live where 'nobody' cannot read it (a clone in root's home, in a
``mktemp -d``), and so may its ``.venv``. :func:`nobody_python` copies pgcrond and
the distributions it requires, once per test session, to a directory every user
can read, and returns the command line of an interpreter that imports them.
"""

from __future__ import annotations

import atexit
import functools
import os
import pwd
import re
import shutil
import sys
import tempfile
from importlib import metadata
from pathlib import Path

import pytest

import pgcrond

NOBODY = pwd.getpwnam("nobody")


def _required(name: str, seen: set[str]) -> None:
    """``name`` and every distribution it requires (extras' requirements left out)."""
    key = re.sub(r"[-_.]+", "-", name).lower()
    if key in seen:
        return
    try:
        distribution = metadata.distribution(key)
    except metadata.PackageNotFoundError:
        return  # a requirement of another platform or Python
    seen.add(key)
    for requirement in distribution.requires or []:
        if "extra ==" in requirement:
            continue
        _required(re.split(r"[ ;<>=!~\[(]", requirement, maxsplit=1)[0], seen)


@functools.cache
def _readable_copy() -> Path:
    target = Path(tempfile.mkdtemp(prefix="pgcrond-nobody-"))
    target.chmod(0o755)
    atexit.register(shutil.rmtree, target, True)
    names: set[str] = set()
    _required("pgcrond", names)
    names.discard("pgcrond")  # installed editable: copied from its source below
    for name in names:
        distribution = metadata.distribution(name)
        for file in distribution.files or []:
            source = Path(str(distribution.locate_file(file)))
            if file.parts[0].endswith((".dist-info", "__pycache__")) or not source.is_file():
                continue
            copy = target / file
            copy.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, copy)
    shutil.copytree(
        Path(pgcrond.__file__).parent,
        target / "pgcrond",
        ignore=shutil.ignore_patterns("__pycache__"),
    )
    for directory, _, files in os.walk(target):
        os.chmod(directory, 0o755)
        for file_name in files:
            os.chmod(os.path.join(directory, file_name), 0o755)
    return target


def nobody_python() -> tuple[list[str], dict[str, str]]:
    """The argv prefix and environment of a Python that 'nobody' can run pgcrond with."""
    path = _readable_copy()
    # The interpreter itself, not the venv's link to it (which may sit in a 0700 tree).
    interpreter = os.path.realpath(sys.executable)
    environ = {**os.environ, "PYTHONPATH": str(path), "PYTHONDONTWRITEBYTECODE": "1"}
    as_nobody = [
        "setpriv", f"--reuid={NOBODY.pw_uid}", f"--regid={NOBODY.pw_gid}", "--clear-groups", "--"
    ]  # fmt: skip
    return [*as_nobody, interpreter], environ


ROOT_ONLY = pytest.mark.skipif(os.geteuid() != 0, reason="switching users needs root")
# Allocates and touches 300 MiB: far over a 64MiB limit.
HOG = "b = bytearray(300 << 20); b[::4096] = b'x' * len(b[::4096]); print('survived')"
