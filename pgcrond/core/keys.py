"""Identities and the keys derived from them.

* The **idempotency key** (``v2:`` + base64url SHA-256 of a compact JSON
  object) is byte-for-byte the key of the NestJS JobSchedulerService design, so
  a team migrating from it, or running both against one database, gets the same
  lease rows. It is also the lease table's unique ``lock_key``: the one-winner
  guarantee rests on that constraint.
* The **advisory lock id** of a string key is the first 8 bytes of
  SHA-256(``pgcrond:`` + key) as a signed big-endian integer; the
  ``nestjs-pg-cron-lock`` hash is reproduced for teams moving jobs over.
"""

from __future__ import annotations

import base64
import hashlib
import re
from dataclasses import dataclass
from typing import Literal

import orjson

from pgcrond.core.schedule import tick_of
from pgcrond.errors import ValidationError

IdentityType = Literal["SCHEDULE", "INITIAL"]
KeyHash = Literal["pgcrond", "nestjs-pg-cron-lock"]

MAX_CODE_LENGTH = 200
MAX_RUN_KEY_LENGTH = 200
BIGINT_MIN = -(2**63)
BIGINT_MAX = 2**63 - 1

# JavaScript's String.prototype.trim removes WhiteSpace and LineTerminator code
# points; Python's str.strip differs (it strips U+001C..U+001F, keeps U+FEFF),
# and a different trim would give a different key than the reference.
_JS_TRIM = (
    "\u0009\u000a\u000b\u000c\u000d\u0020\u00a0\u1680\u2000\u2001\u2002\u2003"
    "\u2004\u2005\u2006\u2007\u2008\u2009\u200a\u2028\u2029\u202f\u205f\u3000\ufeff"
)


# Unicode's control (Cc) and surrogate (Cs) code points, exactly: one search
# per field, not a category lookup per character (a fire makes an identity).
_CONTROL = re.compile("[\x00-\x1f\x7f-\x9f\ud800-\udfff]")


def js_trim(value: str) -> str:
    return value.strip(_JS_TRIM)


def _clean(field: str, value: object, limit: int) -> str:
    if not isinstance(value, str):
        raise ValidationError(field, f"must be a string, got {type(value).__name__}")
    trimmed = js_trim(value)
    if not trimmed:
        raise ValidationError(field, "must not be blank")
    if len(trimmed) > limit:
        raise ValidationError(field, f"must be at most {limit} characters, got {len(trimmed)}")
    found = _CONTROL.search(trimmed)
    if found is not None:
        raise ValidationError(
            field, f"must not contain control characters (found U+{ord(found.group()):04X})"
        )
    return trimmed


@dataclass(frozen=True)
class Identity:
    """``(type, code, run key)``: what one lease row, one logical run, stands for."""

    type: IdentityType
    code: str
    run_key: str | None
    # The code the key is derived from when it is not ``code``: a tick claimed
    # before its job was renamed (``renamed_from``) keeps the key it was
    # claimed with, so its retries and takeovers present the same one.
    key_code: str | None = None

    @classmethod
    def of(cls, type: str, code: object, run_key: object = None) -> Identity:
        """Validate and trim; SCHEDULE needs a run key, INITIAL forbids one."""
        if type not in ("SCHEDULE", "INITIAL"):
            raise ValidationError("type", f"must be SCHEDULE or INITIAL, got {type!r}")
        clean_code = _clean("code", code, MAX_CODE_LENGTH)
        if type == "INITIAL":
            if run_key is not None:
                raise ValidationError("run_key", "must be absent for an INITIAL identity")
            return cls("INITIAL", clean_code, None)
        if run_key is None:
            raise ValidationError("run_key", "is required for a SCHEDULE identity")
        return cls("SCHEDULE", clean_code, _clean("run_key", run_key, MAX_RUN_KEY_LENGTH))

    @classmethod
    def schedule(cls, code: object, run_key: object, key_code: str | None = None) -> Identity:
        """A tick's identity; ``key_code``: the old code its key came from (see above)."""
        identity = cls.of("SCHEDULE", code, run_key)
        if key_code is None or key_code == identity.code:
            return identity
        return cls("SCHEDULE", identity.code, identity.run_key, key_code)

    @classmethod
    def initial(cls, code: object) -> Identity:
        return cls.of("INITIAL", code)

    @property
    def pausable(self) -> bool:
        """Pause stops ticks and run-once jobs; a manual run key is the operator's own ask."""
        return self.type == "INITIAL" or tick_of(self.run_key or "") is not None

    def __hash__(self) -> int:
        # Kept once made: a fire hashes its identity a dozen times (what is in
        # flight, owner tokens, open claims, running attempts). A frozen
        # dataclass rehashes its fields each time.
        cached: int | None = self.__dict__.get("_hash")
        if cached is None:
            cached = self.__dict__["_hash"] = hash(
                (self.type, self.code, self.run_key, self.key_code)
            )
        return cached

    def __getstate__(self) -> dict[str, object]:
        # A copy pickled to another process leaves the cached hash behind: str
        # hashes are salted per process.
        return {name: value for name, value in self.__dict__.items() if name != "_hash"}

    @property
    def _digest(self) -> bytes:
        # Kept once made, in the instance's dict (functools.cached_property
        # takes a lock per first read on Python 3.11). Compact JSON with keys
        # in this order, non-ASCII as UTF-8, is exactly Node's JSON.stringify
        # of {version, type, code, runKey}.
        digest: bytes | None = self.__dict__.get("_digest_bytes")
        if digest is None:
            fields = {
                "version": 2,
                "type": self.type,
                "code": self.code if self.key_code is None else self.key_code,
                "runKey": self.run_key,
            }
            # orjson writes the same bytes as the standard encoder does for
            # every character a key may hold (surrogates and controls are
            # refused on the way in), in a tenth of its time.
            digest = self.__dict__["_digest_bytes"] = hashlib.sha256(orjson.dumps(fields)).digest()
        return digest

    @property
    def idempotency_key(self) -> str:
        """``v2:<base64url SHA-256, unpadded>``; also the lease table's lock_key.

        Kept once made: every claim, finalize, log line and metric of a run asks for it.
        """
        key: str | None = self.__dict__.get("_key")
        if key is None:
            key = self.__dict__["_key"] = "v2:" + base64.urlsafe_b64encode(self._digest).rstrip(
                b"="
            ).decode("ascii")
        return key

    @property
    def idempotency_key_hex(self) -> str:
        """The same digest as 64 hex characters, for systems that reject ':'."""
        return self._digest.hex()

    def __str__(self) -> str:
        return f"{self.type}:{self.code}" + (f"@{self.run_key}" if self.run_key else "")


def lock_id(key: str | int, key_hash: KeyHash = "pgcrond") -> int:
    """The PostgreSQL advisory lock id (signed 64-bit) of a key.

    An int is used as is (bigint range); a string is hashed. With the default
    hash, ``lock_id(k) == int.from_bytes(sha256(("pgcrond:" + k).encode())[:8],
    "big", signed=True)``.
    """
    if isinstance(key, bool):
        raise ValidationError("lock_key", "must be a string or an integer, got bool")
    if isinstance(key, int):
        if not BIGINT_MIN <= key <= BIGINT_MAX:
            raise ValidationError("lock_key", f"integer must fit a bigint, got {key}")
        return key
    if not isinstance(key, str):
        raise ValidationError(
            "lock_key", f"must be a string or an integer, got {type(key).__name__}"
        )
    if key_hash == "nestjs-pg-cron-lock":
        return nestjs_hash_key(key)
    if not key:
        raise ValidationError("lock_key", "must not be empty")
    digest = hashlib.sha256(("pgcrond:" + key).encode("utf-8")).digest()
    return int.from_bytes(digest[:8], "big", signed=True)


def _to_int32(value: float) -> int:
    # ECMAScript ToInt32: truncate toward zero, wrap modulo 2**32, then sign.
    wrapped = int(value) % 2**32
    return wrapped - 2**32 if wrapped >= 2**31 else wrapped


def nestjs_hash_key(key: str) -> int:
    """The ``nestjs-pg-cron-lock`` package's id for a string key, bug for bug.

    It iterates UTF-16 code units and multiplies as JavaScript numbers
    (doubles), so products above 2**53 lose low bits before the ``| 0``
    truncation; Python floats round the same way (IEEE 754 binary64).
    """
    value: int = 0x811C9DC5
    units = key.encode("utf-16-le")
    for index in range(0, len(units), 2):
        unit = units[index] | (units[index + 1] << 8)
        value = _to_int32(value) ^ unit
        value = _to_int32(float(value) * float(0x01000193))
    return value
