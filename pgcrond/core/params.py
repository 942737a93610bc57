"""Parameters: extra environment variables one manual run or backfill hands its job.

``pgcrond trigger JOB --env NAME=VALUE`` (and ``pgcrond backfill``) records
them with the request; the replica that runs it adds them to that run's
environment, after the job's own ``env:`` and before the ``PGCRON_*``
variables. They are data: passed as environment variables only, never
through a shell string. A name must be a valid variable name, must not be
reserved (``PGCRON_*`` describe the run itself), and, when the job declares
``params: [NAME, ...]``, must be one of those, so a typo is an error rather
than a variable nobody reads. A value whose name looks secret
(:func:`pgcrond.core.redaction.looks_secret`) is shown as ``***`` wherever
parameters are shown or logged.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping

from pgcrond.core.redaction import MASK, looks_secret

NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
RESERVED_PREFIX = "PGCRON_"
# A parameter's value is one environment variable: bounded, so a request row stays small.
MAX_VALUE = 32 * 1024


def name_problem(name: str) -> str | None:
    """Why ``name`` cannot be a parameter's name, or None."""
    if not NAME.match(name):
        return f"{name!r} is not a variable name (letters, digits and _, not starting with a digit)"
    if name.startswith(RESERVED_PREFIX):
        return f"{name!r} is reserved: {RESERVED_PREFIX}* variables describe the run itself"
    return None


def parse(
    assignments: Iterable[str], *, code: str, declared: tuple[str, ...] | None
) -> dict[str, str]:
    """``NAME=VALUE`` texts (``--env``) as a mapping; ValueError names the first bad one.

    ``declared``: the job's ``params:`` (None: the job declares none, and
    any valid name is accepted).
    """
    params: dict[str, str] = {}
    for text in assignments:
        name, sep, value = text.partition("=")
        if not sep:
            raise ValueError(f"--env {text!r}: expected NAME=VALUE")
        problem = name_problem(name)
        if problem is not None:
            raise ValueError(f"--env {name}: {problem}")
        if declared is not None and name not in declared:
            accepted = ", ".join(declared) or "none"
            raise ValueError(f"--env {name}: job {code!r} does not declare it (params: {accepted})")
        if "\0" in value:
            raise ValueError(f"--env {name}: the value must not contain a NUL character")
        if len(value.encode()) > MAX_VALUE:
            raise ValueError(f"--env {name}: the value is longer than {MAX_VALUE} bytes")
        if name in params:
            raise ValueError(f"--env {name}: given twice")
        params[name] = value
    return params


def shown(params: Mapping[str, str] | None) -> dict[str, str]:
    """``params`` fit to show or log: a value whose name looks secret as ``***``."""
    return {name: MASK if looks_secret(name) else value for name, value in (params or {}).items()}


def text(params: Mapping[str, str] | None) -> str:
    """``NAME=value NAME2=***``: :func:`shown`, on one line."""
    return " ".join(f"{name}={value}" for name, value in shown(params).items())
