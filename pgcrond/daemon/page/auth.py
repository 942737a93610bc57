"""Who is asking and what they may do: the page's users, trusted proxies, CSRF tokens, origins.

With neither users nor trusted proxies configured the page is read-only
(:attr:`PageAccess.authenticated` is false) and nothing here is asked.
Otherwise every request names a user, or is refused:

* a trusted proxy (the peer address is in ``http.trusted_proxies``) names the
  user in ``http.proxy_header``; the header from any other peer is ignored, so
  a client cannot name itself. The user's role is their ``http.users`` entry's,
  else ``http.proxy_role``;
* else ``Authorization: Basic`` is checked against ``http.users`` (scrypt, on a
  worker thread: a check takes some 100 ms of CPU that the loop must not wait for).

A form carries a token the server issued: ``TIME.MAC``, the MAC an HMAC-SHA256
of the user's name and the time under ``http.csrf_secret`` (or a random key of
this replica). A POST is acted on only with a token issued to the same user
within :data:`TOKEN_TTL_S`, and only from this page's own origin: a
``Sec-Fetch-Site`` other than ``same-origin`` (or a user's own ``none``), or an
``Origin`` whose host is not the request's ``Host``, is refused before the
token is looked at.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import hashlib
import hmac
import secrets
import time
from dataclasses import dataclass
from functools import lru_cache
from ipaddress import ip_address
from urllib.parse import urlsplit

import structlog

from pgcrond.config.models import PageAccess
from pgcrond.core.access import PageUser
from pgcrond.core.passwords import USER_NAME, PasswordHash, hash_password, parse_hash
from pgcrond.daemon.exchange import Request

# The name its log lines have always carried: filters and alerts match on it.
log = structlog.get_logger("pgcrond.daemon.page_auth")

CSRF_FIELD = "csrf"
REALM = "pgcrond status"
# Password checks at once (each ~32 MiB and 0.1 s of CPU): a flood of guesses
# queues instead of filling the default thread pool, which /metrics renders on too.
CONCURRENT_CHECKS = 2
# A form's token is good for this long: a page left open over a working day
# still acts; a token copied from a log or a screen expires.
TOKEN_TTL_S = 12 * 3600
# Replicas' clocks differ a little: a token issued up to this far "ahead" is good.
TOKEN_SKEW_S = 60
# This replica's key when http.csrf_secret is unset: its forms post back to it alone.
_REPLICA_KEY = secrets.token_bytes(32)


@dataclass(frozen=True)
class Denied(Exception):
    """A request that names no user: 401 (a Basic challenge) or 403, and why."""

    status: int
    message: str
    challenge: bool = False


@dataclass(frozen=True)
class Who:
    """A signed-in user: their name and what they may do."""

    name: str
    user: PageUser


async def signed_in(access: PageAccess, request: Request, checks: asyncio.Semaphore) -> Who:
    """The signed-in user, or :class:`Denied`. Never logs a credential.

    ``checks`` bounds the password checks running at once (see :data:`CONCURRENT_CHECKS`).
    """
    if access.trusted_proxies and _from_proxy(access, request.peer):
        values = request.headers.get(access.proxy_header.lower(), ())
        if len(values) == 1 and USER_NAME.fullmatch(values[0]):
            name = values[0]
            listed = access.users.get(name)
            return Who(name, listed or PageUser(role=access.proxy_role))
        if values:
            log.warning("status_page_denied", peer=request.peer, why="proxy header unusable")
            raise Denied(403, f"the proxy's {access.proxy_header} header names no usable user")
    if not any(user.password for user in access.users.values()):
        raise Denied(403, "sign in through the reverse proxy that serves this page")
    credential = _basic(request.header("authorization"))
    if credential is None:
        raise Denied(401, "sign in: this page needs a user name and password", challenge=True)
    name, password = credential
    user = access.users.get(name)
    encoded = None if user is None else user.password
    # An unknown name costs a check too, so the answer's timing does not tell names apart.
    stored = _decoy() if encoded is None else parse_hash(encoded)
    async with checks:
        matches = await asyncio.to_thread(stored.matches, password)
    if user is None or encoded is None or not matches:
        log.warning("status_page_denied", peer=request.peer, user=name[:64], why="bad credential")
        raise Denied(401, "wrong user name or password", challenge=True)
    return Who(name, user)


def issue_token(access: PageAccess, user: str, now: float | None = None) -> str:
    """A form token for ``user``, issued now: ``TIME.MAC``."""
    issued = int(time.time() if now is None else now)
    return f"{issued}.{_mac(access, user, issued)}"


def token_ok(access: PageAccess, user: str, token: str | None, now: float | None = None) -> bool:
    """Whether ``token`` was issued by a replica with this key, to ``user``, and is fresh."""
    if token is None or len(token) > 100:
        return False
    issued_text, dot, mac = token.partition(".")
    if not dot or not issued_text.isascii() or not issued_text.isdigit():
        return False
    issued = int(issued_text)
    age = (time.time() if now is None else now) - issued
    if not -TOKEN_SKEW_S <= age <= TOKEN_TTL_S:
        return False
    return hmac.compare_digest(mac.encode(), _mac(access, user, issued).encode())


def same_origin(request: Request) -> str | None:
    """Why a POST comes from elsewhere (another site, another origin), or None: it is this page's.

    ``Sec-Fetch-Site``, which every current browser sends and no page can
    forge, decides when present: only ``same-origin`` or ``none`` (typed by
    the user) pass. Without it, ``Origin``, when there is one, must name the
    request's own ``Host``. A client that sends neither is no browser that
    another site could drive.
    """
    fetch_site = request.header("sec-fetch-site").strip().lower()
    if fetch_site in ("same-origin", "none"):
        return None
    if fetch_site:
        return f"Sec-Fetch-Site: {fetch_site[:40]}"
    origin = request.header("origin").strip()
    if origin:
        host = request.header("host").strip().lower()
        if origin == "null" or urlsplit(origin).netloc.lower() != host:
            return f"Origin: {origin[:100]}"
    return None


def challenge_header() -> dict[str, str]:
    return {"WWW-Authenticate": f'Basic realm="{REALM}", charset="UTF-8"'}


def _mac(access: PageAccess, user: str, issued: int) -> str:
    key = _key(access.csrf_secret)
    digest = hmac.new(key, f"csrf\0{user}\0{issued}".encode(), hashlib.sha256).digest()
    return base64.urlsafe_b64encode(digest).decode().rstrip("=")


@lru_cache(maxsize=4)
def _key(secret: str | None) -> bytes:
    if secret is None:
        return _REPLICA_KEY
    # Derived, so that the configured secret itself signs nothing directly.
    return hashlib.sha256(b"pgcrond csrf\0" + secret.encode()).digest()


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
