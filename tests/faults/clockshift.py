"""Build and use the wall-clock shim (clockshift.c) at test time.

``build(directory)`` compiles it with ``cc -shared -fPIC`` (the build is cached
per directory); ``shifted(env, shim, ms)`` is the environment of a process
whose ``time.time()`` runs ``ms`` milliseconds ahead (or behind, if negative)
while ``time.monotonic()`` is untouched. Children inherit it.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Mapping
from pathlib import Path

SOURCE = Path(__file__).with_name("clockshift.c")
SHIFT_VAR = "PGCROND_CLOCK_SHIFT_MS"


class ShimUnavailable(RuntimeError):
    """No C compiler, or the build failed."""


def compiler() -> str | None:
    return os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc")


def build(directory: Path) -> Path:
    """The compiled shim in ``directory``; raises ShimUnavailable with the compiler's words."""
    target = directory / "libclockshift.so"
    if target.is_file():
        return target
    cc = compiler()
    if cc is None:
        raise ShimUnavailable("no C compiler (cc/gcc) found: install gcc and libc6-dev")
    directory.mkdir(parents=True, exist_ok=True)
    flags = ["-shared", "-fPIC", "-O2", "-Wall", "-Wno-nonnull-compare"]
    result = subprocess.run(
        [cc, *flags, "-o", str(target), str(SOURCE), "-ldl"],
        capture_output=True,
        text=True,
        check=False,
    )
    if result.returncode != 0:
        raise ShimUnavailable(f"{cc} failed on {SOURCE}:\n{result.stderr}")
    return target


def shifted(env: Mapping[str, str], shim: Path, milliseconds: int) -> dict[str, str]:
    """``env`` plus the shim preloaded with a shift of ``milliseconds``."""
    result = dict(env)
    preload = result.get("LD_PRELOAD", "")
    result["LD_PRELOAD"] = f"{shim}:{preload}" if preload else str(shim)
    result[SHIFT_VAR] = str(milliseconds)
    return result
