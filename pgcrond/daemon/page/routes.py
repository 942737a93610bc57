"""The page's paths: which view or action a path under ``/status`` names, and a job's path.

Total: whatever bytes a request carried, a path is a route or None (a 404),
never an exception (one would drop the connection unanswered).
"""

from __future__ import annotations

import re
from collections.abc import Container
from dataclasses import dataclass
from typing import Literal
from urllib.parse import quote, unquote

PREFIX = "/status"
STYLESHEET = f"{PREFIX}/status.css"
# What a job's page can do for a signed-in operator: the last path segment of its POST.
ACTIONS = ("pause", "resume", "run")
# ASCII digits only, and few of them: str.isdigit() also takes '²', which
# int() refuses, and int() refuses more than 4300 digits; no page is that far.
_PAGE_NUMBER = re.compile(r"[0-9]{1,9}")


def job_path(code: str, suffix: str = "") -> str:
    """The path of a job's page; a code may hold any printable character, '/' too."""
    return f"{PREFIX}/jobs/{quote(code, safe='')}{suffix}"


@dataclass(frozen=True)
class Route:
    """What a path under ``/status`` asks for (see :func:`route`)."""

    view: Literal["overview", "running", "replicas", "job", "stylesheet"]
    as_json: bool = False
    page: int = 1
    code: str = ""


def route(path: str, jobs: Container[str]) -> Route | None:
    """The view ``path`` names, or None (a 404); ``jobs`` holds the job codes.

    Total: any text, whatever bytes the request carried, is a route or None,
    never an exception (one would drop the connection unanswered).
    """
    if path == STYLESHEET:
        return Route("stylesheet")
    job_prefix = f"{PREFIX}/jobs/"
    if path.startswith(job_prefix):
        code = unquote(path[len(job_prefix) :])
        # A job's code may itself end in ".json": the longest match wins.
        if code in jobs:
            return Route("job", code=code)
        if code.endswith(".json") and code[: -len(".json")] in jobs:
            return Route("job", as_json=True, code=code[: -len(".json")])
        return None
    as_json = path.endswith(".json")
    view = path[: -len(".json")] if as_json else path
    if view in ("/", PREFIX):
        return Route("overview", as_json)
    if view == f"{PREFIX}/running":
        return Route("running", as_json)
    if view == f"{PREFIX}/replicas":
        return Route("replicas", as_json)
    page_prefix = f"{PREFIX}/page/"
    if view.startswith(page_prefix) and _PAGE_NUMBER.fullmatch(view[len(page_prefix) :]):
        return Route("overview", as_json, page=int(view[len(page_prefix) :]))
    return None


def action_route(path: str, jobs: Container[str]) -> tuple[str, str] | None:
    """(job code, action) a POST's path names, or None (a 404); total, like :func:`route`."""
    job_prefix = f"{PREFIX}/jobs/"
    if not path.startswith(job_prefix):
        return None
    # The code is percent-encoded (job_path), so its own '/' never splits here.
    quoted, _, action = path[len(job_prefix) :].rpartition("/")
    code = unquote(quoted)
    if action not in ACTIONS or code not in jobs:
        return None
    return code, action


def not_found(path: str) -> str:
    job_prefix = f"{PREFIX}/jobs/"
    if path.startswith(job_prefix):
        code = unquote(path[len(job_prefix) :])
        return f"no job {code.removesuffix('.json')!r} in this replica's config"
    return f"nothing at {path}; the status page is at {PREFIX}"
