"""Who is asking: the status page's HTTP Basic users and trusted proxies, and its CSRF check.

With neither configured the page is open and read-only (:attr:`PageAccess.authenticated`
is false) and nothing here is asked. Otherwise every request names an operator,
or is refused:

* a trusted proxy (the peer address is in ``http.trusted_proxies``) names the
  user in ``http.proxy_header``; the header from any other peer is ignored, so
  a client cannot name itself;
* else ``Authorization: Basic`` is checked against ``http.users`` (scrypt, on a
  worker thread: a check takes some 100 ms of CPU that the loop must not wait for).

Forms carry a double-submit token: a random value in an ``HttpOnly``,
``SameSite=Strict`` cookie that the page also writes into each form; a POST
whose field and cookie differ (constant-time compare) is refused. Unlike an
HMAC with a per-process key, it holds when the form came from one replica and
the POST goes to another behind the same load balancer.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import hmac
import secrets
from dataclasses import dataclass
from functools import lru_cache
from http.cookies import CookieError, SimpleCookie
from ipaddress import ip_address

import structlog

from pgcrond.config.models import PageAccess
from pgcrond.core.passwords import USER_NAME, PasswordHash, hash_password, parse_hash
from pgcrond.daemon.exchange import Request

# The name its log lines have always carried: filters and alerts match on it.
log = structlog.get_logger("pgcrond.daemon.page_auth")

CSRF_COOKIE = "pgcrond_csrf"
CSRF_FIELD = "csrf"
REALM = "pgcrond status"
# Password checks at once (each ~32 MiB and 0.1 s of CPU): a flood of guesses
# queues instead of filling the default thread pool, which /metrics renders on too.
CONCURRENT_CHECKS = 2


@dataclass(frozen=True)
class Denied(Exception):
    """A request that names no operator: 401 (a Basic challenge) or 403, and why."""

    status: int
    message: str
    challenge: bool = False


async def operator(access: PageAccess, request: Request, checks: asyncio.Semaphore) -> str:
    """The signed-in operator's name, or :class:`Denied`. Never logs a credential.

    ``checks`` bounds the password checks running at once (see :data:`CONCURRENT_CHECKS`).
    """
    if access.trusted_proxies and _from_proxy(access, request.peer):
        values = request.headers.get(access.proxy_header.lower(), ())
        if len(values) == 1 and USER_NAME.fullmatch(values[0]):
            return values[0]
        if values:
            log.warning("status_page_denied", peer=request.peer, why="proxy header unusable")
            raise Denied(403, f"the proxy's {access.proxy_header} header names no usable user")
    if not access.users:
        raise Denied(403, "sign in through the reverse proxy that serves this page")
    credential = _basic(request.header("authorization"))
    if credential is None:
        raise Denied(401, "sign in: this page needs a user name and password", challenge=True)
    name, password = credential
    encoded = access.users.get(name)
    # An unknown name costs a check too, so the answer's timing does not tell names apart.
    stored = _decoy() if encoded is None else parse_hash(encoded)
    async with checks:
        matches = await asyncio.to_thread(stored.matches, password)
    if encoded is None or not matches:
        log.warning("status_page_denied", peer=request.peer, user=name[:64], why="bad credential")
        raise Denied(401, "wrong user name or password", challenge=True)
    return name


def csrf_cookie(request: Request) -> str | None:
    """The request's CSRF token cookie, if it has a well-formed one."""
    try:
        cookies = SimpleCookie(request.header("cookie"))
    except CookieError:
        return None
    morsel = cookies.get(CSRF_COOKIE)
    if morsel is None or len(morsel.value) != 43:
        return None
    return morsel.value


def new_csrf_token() -> str:
    return secrets.token_urlsafe(32)


def set_csrf_cookie(token: str) -> str:
    """The ``Set-Cookie`` value: scripts cannot read it, other sites' forms do not send it."""
    return f"{CSRF_COOKIE}={token}; Path=/status; HttpOnly; SameSite=Strict"


def csrf_ok(request: Request, submitted: str | None) -> bool:
    """Whether the form's token is the cookie's, compared in constant time."""
    cookie = csrf_cookie(request)
    if cookie is None or submitted is None:
        return False
    return hmac.compare_digest(cookie.encode(), submitted.encode())


def challenge_header() -> dict[str, str]:
    return {"WWW-Authenticate": f'Basic realm="{REALM}", charset="UTF-8"'}


def _from_proxy(access: PageAccess, peer: str | None) -> bool:
    if peer is None:
        return False
    try:
        address = ip_address(peer.split("%", 1)[0])
    except ValueError:
        return False
    if address.version == 6 and address.ipv4_mapped is not None:
        address = address.ipv4_mapped
    return any(address in network for network in access.trusted_proxies)


def _basic(header: str) -> tuple[str, str] | None:
    scheme, _, value = header.strip().partition(" ")
    if scheme.lower() != "basic" or not value:
        return None
    try:
        decoded = base64.b64decode(value.strip(), validate=True).decode("utf-8")
    except (binascii.Error, UnicodeDecodeError):
        return None
    name, colon, password = decoded.partition(":")
    return (name, password) if colon and name else None


@lru_cache(maxsize=1)
def _decoy() -> PasswordHash:
    return parse_hash(hash_password(secrets.token_urlsafe(16)))
