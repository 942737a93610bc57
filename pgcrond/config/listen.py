"""The one reading of an HTTP listen address: ``http.listen``, ``run --http`` and the server.

There used to be three, and they disagreed: ``check`` accepted ``::1:9464``,
which the server refused, and refused ``:9464``, which the server accepted.
"""

from __future__ import annotations

from dataclasses import dataclass
from ipaddress import ip_address

from pgcrond.errors import ValidationError

FIELD = "http.listen"
EXAMPLES = "e.g. 127.0.0.1:9464, [::1]:9464 or :9464 for every interface; '' turns HTTP off"


@dataclass(frozen=True)
class Listen:
    """Where the HTTP server binds; ``host`` None means every interface, port 0 any free port."""

    host: str | None
    port: int

    def __str__(self) -> str:
        if self.host is None:
            return f":{self.port}"
        return f"[{self.host}]:{self.port}" if ":" in self.host else f"{self.host}:{self.port}"

    @property
    def display_host(self) -> str:
        """The host as a URL would write it; ``0.0.0.0`` for every interface."""
        if self.host is None:
            return "0.0.0.0"  # noqa: S104 - only shown, never bound
        return f"[{self.host}]" if ":" in self.host else self.host


def parse_listen(text: str) -> Listen | None:
    """``host:port``, ``[v6]:port`` or ``:port`` -> :class:`Listen`; ``""`` -> None (off).

    Raises :class:`ValidationError` (field ``http.listen``) saying what is allowed.
    """
    if text == "":
        return None
    host, sep, port_text = text.rpartition(":")
    if not sep or not port_text.isascii() or not port_text.isdigit() or int(port_text) > 65535:
        raise ValidationError(FIELD, f"{text!r} is not HOST:PORT ({EXAMPLES})")
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
        if not host or "[" in host or "]" in host:
            raise ValidationError(FIELD, f"{text!r}: the brackets hold no IPv6 address")
    elif ":" in host:
        raise ValidationError(FIELD, f"{text!r}: write an IPv6 address in brackets, [::1]:9464")
    elif "[" in host or "]" in host or any(c.isspace() for c in host):
        raise ValidationError(FIELD, f"{text!r} is not HOST:PORT ({EXAMPLES})")
    return Listen(host or None, int(port_text))


def is_loopback(host: str | None) -> bool:
    """Whether ``host`` (None: every interface) is reachable from this machine only."""
    if host is None:
        return False
    if host == "localhost":
        return True
    try:
        return ip_address(host.split("%", 1)[0]).is_loopback
    except ValueError:
        return False  # a name: it may resolve to anything
