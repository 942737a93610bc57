"""A job's environment from files: ``env_file:`` (dotenv) and ``${file:PATH}`` secrets.

Both are read when the config is loaded, so a missing or malformed file is a
config error naming where it is used, found by ``pgcrond check`` rather than
at the first tick. Every ``${file:PATH}`` value, and every value of an
``env_file`` whose name looks secret (``TOKEN``, ``KEY``, ``PASSWORD``, …, as
:func:`~pgcrond.core.redaction.looks_secret` says) and that could be one
(:func:`~pgcrond.core.redaction.could_be_secret`: not short, a number or a
common word), is registered with :mod:`pgcrond.core.redaction`: no log line,
error text or output tail shows it.

dotenv files are parsed by python-dotenv (the format of Docker's
``--env-file`` and Compose, with quotes and ``export``), without its
``${VAR}`` expansion: a value is taken as written, never filled from
pgcrond's own environment.
"""

from __future__ import annotations

import io
import re
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

from pgcrond.core.redaction import could_be_secret, looks_secret, remember_secrets

# ${file:/run/secrets/token}: the file's text, less one trailing newline.
FILE_REFERENCE = re.compile(r"\$\{file:([^}]*)\}")
# Larger than any secret or dotenv file; a path to something else (a log) is refused.
MAX_FILE_BYTES = 1 << 20


@dataclass
class Read:
    """What was read, and what went wrong, each problem a message naming the file."""

    values: dict[str, str] = field(default_factory=dict)
    problems: list[str] = field(default_factory=list)
    # A file that does not exist (here): only a warning while linting.
    missing: list[str] = field(default_factory=list)


def read_env_files(paths: Iterable[Path]) -> Read:
    """The variables of dotenv files, later files winning; every problem with file:line."""
    read = Read()
    for path in paths:
        text = _text(path, read)
        if text is None:
            continue
        # Imported here: most configs name no env file, and python-dotenv's
        # package import is a few ms of every start.
        from dotenv.parser import parse_stream

        for binding in parse_stream(io.StringIO(text)):
            line = binding.original.line
            if binding.error:
                read.problems.append(f"{path}:{line}: not a NAME=value line")
            elif binding.key is not None and binding.value is None:
                read.problems.append(f"{path}:{line}: {binding.key} has no '=value'")
            elif binding.key is not None and binding.value is not None:
                if "\0" in binding.value:
                    read.problems.append(f"{path}:{line}: {binding.key} holds a NUL character")
                else:
                    read.values[binding.key] = binding.value
    remember_secrets(
        value
        for name, value in read.values.items()
        if looks_secret(name) and could_be_secret(value)
    )
    return read


def fill_file_references(value: str, read: Read) -> str:
    """``value`` with each ``${file:PATH}`` replaced by that file's text (one final newline off)."""

    def substitute(match: re.Match[str]) -> str:
        path = Path(match.group(1))
        if not match.group(1) or not path.is_absolute():
            read.problems.append(f"${{file:{match.group(1)}}}: the path must be absolute")
            return ""
        text = _text(path, read)
        if text is None:
            return ""
        secret = text.removesuffix("\n").removesuffix("\r")
        if "\0" in secret:
            read.problems.append(f"{path}: holds a NUL character")
            return ""
        remember_secrets([secret])
        return secret

    return FILE_REFERENCE.sub(substitute, value)


def _text(path: Path, read: Read) -> str | None:
    try:
        with path.open("rb") as file:
            data = file.read(MAX_FILE_BYTES + 1)
    except FileNotFoundError:
        read.missing.append(f"{path}: no such file")
        return None
    except OSError as exc:
        read.problems.append(f"{path}: cannot read: {exc.strerror}")
        return None
    if len(data) > MAX_FILE_BYTES:
        read.problems.append(f"{path}: larger than 1 MiB; not an environment or secret file")
        return None
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        read.problems.append(f"{path}: not UTF-8 text")
        return None
