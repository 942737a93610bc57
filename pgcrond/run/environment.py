"""The environment a job gets: the daemon's, less its secrets, plus the job's and the run's.

Built for every attempt, so what does not change between attempts is decided
once: whether each of the daemon's variables may reach a job is remembered
per (name, value), until a new secret is remembered
(:func:`pgcrond.core.redaction.generation`).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping

from pgcrond.core import redaction
from pgcrond.run.context import ENV_PREFIX

# Never handed to a job unless its own `env` sets them: pgcrond's settings
# (PGCROND_*), the libpq secrets the daemon itself connects with, and any
# variable holding the database's URL or password (holds_connection_secret).
SECRET_PREFIX = "PGCROND_"  # noqa: S105 - a name prefix, not a password
SECRET_NAMES = frozenset({"PGPASSWORD", "PGPASSFILE", "DATABASE_URL"})

_allowed: dict[tuple[str, str], bool] = {}
_allowed_generation = -1


def _may_pass(name: str, value: str) -> bool:
    return (
        not name.startswith(SECRET_PREFIX)
        and name not in SECRET_NAMES
        and not name.startswith(ENV_PREFIX)
        and not redaction.holds_connection_secret(name, value)
    )


def job_environ(
    job_env: Mapping[str, str], run_env: Mapping[str, str], base: Mapping[str, str]
) -> dict[str, str]:
    """The child environment: ``base`` minus secrets, then the job env, then ``PGCRON_*``.

    Every inherited or configured ``PGCRON_*`` is dropped first: an optional one
    (fencing token, deadline) left over from elsewhere would describe another run.
    """
    global _allowed_generation  # noqa: PLW0603 - one cache per process, like the registry
    if _allowed_generation != redaction.generation():
        _allowed.clear()
        _allowed_generation = redaction.generation()
    environ = {}
    for item in base.items():
        verdict = _allowed.get(item)
        if verdict is None:
            verdict = _allowed[item] = _may_pass(*item)
        if verdict:
            environ[item[0]] = item[1]
    for name, value in job_env.items():
        if not name.startswith(ENV_PREFIX):
            environ[name] = value
    environ.update(run_env)
    return environ


class RunEnviron(Mapping[str, str]):
    """A run's environment, built when first read.

    A command's or an isolated entrypoint's is read at once (it is the child's
    environment); most in-process entrypoints never read ``ctx.env``, and ten
    thousand co-firing ones paid for it on the loop (about 5 % of a tick).
    Built at most once per run; two threads reading it first may both build
    it, alike, and either result stays.
    """

    __slots__ = ("_build", "_built")

    def __init__(self, build: Callable[[], dict[str, str]]) -> None:
        self._build = build
        self._built: dict[str, str] | None = None

    def _environ(self) -> dict[str, str]:
        built = self._built
        if built is None:
            built = self._built = self._build()
        return built

    def __getitem__(self, name: str) -> str:
        return self._environ()[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self._environ())

    def __len__(self) -> int:
        return len(self._environ())
