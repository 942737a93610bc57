"""Resolve a job's ``entrypoint:`` to a callable.

Used by the config loader (so that an import error is a config error at start,
not a failure at 3 a.m.) and by the runner.
"""

from __future__ import annotations

import importlib
import importlib.metadata
from collections.abc import Callable
from typing import Any

from pgcrond.errors import EntrypointError

ENTRY_POINT_GROUP = "pgcrond.jobs"


def resolve(target: str) -> Callable[..., Any]:
    """``pkg.module:function`` is imported; a bare name is looked up in ``pgcrond.jobs``."""
    if ":" in target:
        module_name, _, attribute = target.partition(":")
        try:
            obj: Any = importlib.import_module(module_name)
        except Exception as exc:
            raise EntrypointError(
                f"cannot import module {module_name!r}: {type(exc).__name__}: {exc}"
            ) from exc
        for part in attribute.split("."):
            try:
                obj = getattr(obj, part)
            except AttributeError as exc:
                raise EntrypointError(f"module {module_name!r} has no {attribute!r}") from exc
    else:
        found = importlib.metadata.entry_points(group=ENTRY_POINT_GROUP, name=target)
        if not found:
            raise EntrypointError(
                f"no entry point {target!r} in group {ENTRY_POINT_GROUP!r}; "
                "use 'package.module:function' or register one"
            )
        try:
            obj = next(iter(found)).load()
        except Exception as exc:
            raise EntrypointError(
                f"entry point {target!r} failed to load: {type(exc).__name__}: {exc}"
            ) from exc
    if not callable(obj):
        raise EntrypointError(f"{target!r} is not callable")
    return obj  # type: ignore[no-any-return]
