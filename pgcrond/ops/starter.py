"""`pgcrond init`: write the commented starter config that ships in the package."""

from __future__ import annotations

import argparse
import sys
from importlib import resources
from pathlib import Path

from pgcrond.errors import ExitCode

TEMPLATE = "share/starter.yaml"


def starter_text() -> str:
    return resources.files("pgcrond").joinpath(TEMPLATE).read_text("utf-8")


def init_command(args: argparse.Namespace) -> int:
    text = starter_text()
    if args.path == "-":
        sys.stdout.write(text)
        return ExitCode.OK
    path = Path(args.path)
    if path.is_dir():
        path = path / "pgcrond.yaml"
    try:
        # "x" refuses an existing file in the same call that creates it: no race with another shell.
        with path.open("w" if args.force else "x", encoding="utf-8") as out:
            out.write(text)
    except FileExistsError:
        print(
            f"pgcrond init: {path} exists; not overwritten (pass --force to replace it, "
            "or give another PATH)",
            file=sys.stderr,
        )
        return ExitCode.ERROR
    except OSError as exc:
        print(f"pgcrond init: cannot write {path}: {exc.strerror}", file=sys.stderr)
        return ExitCode.ERROR
    print(f"wrote {path}: set PGCROND_DATABASE_URL, then `pgcrond check {path}`")
    return ExitCode.OK
