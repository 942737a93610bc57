"""Where a replica's memory goes before it does anything: what each package's import adds.

    .venv/bin/python -m bench.import_rss [--module pgcrond.daemon.command]

Imports ``--module`` (what ``pgcrond run`` imports) in a fresh interpreter,
watching every module's execution: the resident set (``/proc/self/statm``)
before and after it, less what the modules it imported themselves added, is
that module's own; the figures are summed by top-level package (``psycopg``,
``pgcrond``, …; the standard library's as one) and printed largest first,
beside the bare interpreter's and the total. Page-granular and approximate (a module that
touches a page another one faulted in is not charged for it), but what a
peer's RSS is made of can be compared line by line: procrastinate imports
the same interpreter, asyncio and psycopg.
"""

from __future__ import annotations

import argparse
import importlib
import importlib.abc
import importlib.machinery
import json
import os
import sys
from collections import defaultdict
from collections.abc import Sequence
from types import ModuleType

PAGE = os.sysconf("SC_PAGE_SIZE")
STDLIB = sys.stdlib_module_names


def resident_mib() -> float:
    with open("/proc/self/statm") as statm:
        return int(statm.read().split()[1]) * PAGE / 2**20


class _Charged(importlib.abc.Loader):
    """A module's loader, wrapped: what its execution adds, less its imports', is its own."""

    def __init__(self, inner: importlib.abc.Loader, name: str, meter: Meter) -> None:
        self.inner, self.name, self.meter = inner, name, meter

    def __getattr__(self, name: str) -> object:
        # What else the loader offers (resource readers: importlib.resources).
        return getattr(self.inner, name)

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType | None:
        return self.inner.create_module(spec)

    def exec_module(self, module: ModuleType) -> None:
        self.meter.enter()
        try:
            self.inner.exec_module(module)
        finally:
            self.meter.leave(self.name)


class Meter(importlib.abc.MetaPathFinder):
    def __init__(self) -> None:
        self.own: defaultdict[str, float] = defaultdict(float)
        self._stack: list[tuple[float, float]] = []  # (resident at start, children's growth)

    def find_spec(
        self, name: str, path: Sequence[str] | None, target: ModuleType | None = None
    ) -> importlib.machinery.ModuleSpec | None:
        for finder in sys.meta_path:
            if finder is self:
                continue
            spec = finder.find_spec(name, path, target)
            if spec is not None:
                break
        else:
            return None
        if isinstance(spec.loader, importlib.abc.Loader) and hasattr(spec.loader, "exec_module"):
            spec.loader = _Charged(spec.loader, name, self)
        return spec

    def enter(self) -> None:
        self._stack.append((resident_mib(), 0.0))

    def leave(self, name: str) -> None:
        start, children = self._stack.pop()
        grown = resident_mib() - start
        top = name.split(".", maxsplit=1)[0]
        self.own["(the standard library)" if top in STDLIB else top] += grown - children
        if self._stack:
            outer_start, outer_children = self._stack[-1]
            self._stack[-1] = (outer_start, outer_children + grown)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--module", default="pgcrond.daemon.command")
    args = parser.parse_args()
    bare = resident_mib()
    meter = Meter()
    sys.meta_path.insert(0, meter)
    importlib.import_module(args.module)
    sys.meta_path.remove(meter)
    total = resident_mib()
    rows = [{"package": "(the interpreter and this bench)", "rss_mib": round(bare, 1)}]
    rows += [
        {"package": package, "rss_mib": round(mib, 1)}
        for package, mib in sorted(meter.own.items(), key=lambda item: -item[1])
        if mib >= 0.05
    ]
    rows.append({"package": f"total after importing {args.module}", "rss_mib": round(total, 1)})
    for row in rows:
        print(json.dumps(row))
    return 0


if __name__ == "__main__":
    sys.exit(main())
