"""What the daemon's HTTP server hands a route and takes back: one request, one response.

Its own module so that the routes (the status page, its sign-in) and the
server (:mod:`pgcrond.daemon.http`) both import it, and not each other.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field


@dataclass(frozen=True)
class Request:
    """One request as read: ``headers`` by lower-case name, each with every value it came with.

    ``peer`` is the client's address (None for a Unix socket); ``path`` has no
    query and is still percent-encoded; ``secure``: it came over TLS.
    """

    method: str
    path: str
    headers: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    body: bytes = b""
    peer: str | None = None
    secure: bool = False
    # The query's parameters, the first value of each.
    query: Mapping[str, str] = field(default_factory=dict)

    def header(self, name: str) -> str:
        """The value of ``name``, repeats joined as RFC 9110 reads them; "" when absent."""
        return ", ".join(self.headers.get(name.lower(), ()))


@dataclass(frozen=True)
class Response:
    status: int
    content_type: str
    body: bytes
    headers: Mapping[str, str] = field(default_factory=dict)
