"""Password hashes for the status page's HTTP Basic users: scrypt, from :mod:`hashlib`.

A hash reads ``scrypt$N$r$p$SALT$KEY`` (SALT and KEY in unpadded base64url),
so the cost travels with the hash: raising :data:`COST` later leaves the hashes
already written in configs valid. ``pgcrond hash-password`` prints one; the
config holds only the hash, never the password.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import re
import secrets
from dataclasses import dataclass

SCHEME = "scrypt"
# n=2^15, r=8: 32 MiB and some 50-100 ms per check on a small core, so a
# stolen config's hashes cost a guesser as much per guess.
COST = (1 << 15, 8, 1)
SALT_BYTES = 16
KEY_BYTES = 32
# Ceilings for what a config may ask of a check (memory is 128 * n * r bytes).
MAX_MEMORY = 256 * 1024 * 1024
# A user name, from the config or a proxy's header: a Basic credential is
# "name:password", so no colon, and nothing a header or a log line splits at.
USER_NAME = re.compile(r"^[^\s:\x00-\x1f\x7f]{1,64}$")
EXAMPLE = "scrypt$32768$8$1$<salt>$<key> (from `pgcrond hash-password`)"


@dataclass(frozen=True)
class PasswordHash:
    """One parsed hash: the scrypt cost, the salt and the derived key."""

    n: int
    r: int
    p: int
    salt: bytes
    key: bytes

    def matches(self, password: str) -> bool:
        """Whether ``password`` derives this key; the comparison takes constant time."""
        derived = _derive(password, self.salt, (self.n, self.r, self.p), len(self.key))
        return hmac.compare_digest(derived, self.key)


def hash_password(password: str) -> str:
    """A new hash of ``password`` with a random salt, in the config's spelling."""
    salt = secrets.token_bytes(SALT_BYTES)
    key = _derive(password, salt, COST, KEY_BYTES)
    n, r, p = COST
    return f"{SCHEME}${n}${r}${p}${_b64(salt)}${_b64(key)}"


def parse_hash(text: str) -> PasswordHash:
    """The hash ``text`` spells; ``ValueError`` saying what is wrong (never echoing it)."""
    parts = text.split("$")
    if len(parts) != 6 or parts[0] != SCHEME:
        raise ValueError(f"must be a password hash like {EXAMPLE}, not a password")
    try:
        n, r, p = (int(part) for part in parts[1:4])
        salt, key = _unb64(parts[4]), _unb64(parts[5])
    except ValueError:
        raise ValueError(f"is a malformed hash; expected {EXAMPLE}") from None
    if n < 2 or n & (n - 1) or r < 1 or p < 1 or 128 * n * r * p > MAX_MEMORY:
        raise ValueError("has an unusable scrypt cost; make one with `pgcrond hash-password`")
    if len(salt) < 8 or len(key) < 16:
        raise ValueError("has too short a salt or key; make one with `pgcrond hash-password`")
    return PasswordHash(n, r, p, salt, key)


def _derive(password: str, salt: bytes, cost: tuple[int, int, int], length: int) -> bytes:
    n, r, p = cost
    # maxmem: OpenSSL wants a little room above 128 * n * r * p.
    return hashlib.scrypt(
        password.encode(), salt=salt, n=n, r=r, p=p, dklen=length, maxmem=MAX_MEMORY + (1 << 20)
    )


def _b64(raw: bytes) -> str:
    return base64.urlsafe_b64encode(raw).decode().rstrip("=")


def _unb64(text: str) -> bytes:
    if not text:
        raise ValueError("empty")
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))
