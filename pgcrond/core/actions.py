"""What a run executes: a command, a shell script or a Python entrypoint.

These types live apart from ``config`` so that the runner, which executes them,
does not depend on the YAML loader that builds them.
"""

from __future__ import annotations

from dataclasses import dataclass

from pgcrond.errors import ValidationError


@dataclass(frozen=True)
class CommandAction:
    """An argv executed without a shell: no word splitting, no expansion."""

    argv: tuple[str, ...]

    def __post_init__(self) -> None:
        if not self.argv:
            raise ValidationError("command", "must name a program")


@dataclass(frozen=True)
class ShellAction:
    """A script run by ``/bin/sh -c``."""

    script: str


@dataclass(frozen=True)
class EntrypointAction:
    """A Python callable (``pkg.module:function`` or a ``pgcrond.jobs`` entry point name).

    ``isolate`` runs it in a child interpreter, which can be killed like a command.
    """

    target: str
    isolate: bool = False


Action = CommandAction | ShellAction | EntrypointAction
