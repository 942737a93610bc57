"""Passwords out of anything that may be logged or shown.

Kept apart from :mod:`pgcrond.storage.db` so that the config loader (``pgcrond
check``) can use it without importing the database driver.

A connection URL is read here exactly as libpq reads it (``fe-connect.c``,
``conninfo_uri_parse_options``): the user:password part ends at the *first*
``@`` before the first ``/``, so in ``postgresql://u:pa@ss@db/x`` libpq's
password is ``pa`` and its host ``ss@db``. A message that never quotes the
URL can then still carry part of the password (``failed to resolve host
'ss@db'``). Two defences, both here:

* :func:`redact` masks a URL's password up to the *last* ``@`` (more than
  libpq's, never less), and every host name quoted with an ``@`` in it;
* :func:`remember` records every fragment of a configured URL's password, as
  the user meant it and as libpq splits it, and :func:`redact` scrubs those
  fragments wherever they appear.

The config loader refuses such URLs anyway (:func:`url_problems`); the
scrubbing is for the URLs that reach a library before or around it.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Literal
from urllib.parse import unquote

MASK = "***"
URI_PREFIXES = ("postgresql://", "postgres://")

# userinfo runs to the *last* "@" of the token: an unescaped "@", ":", "/" or
# "#" in a password must not let part of it through. Masking too much beats
# showing a secret.
_URL_PASSWORD = re.compile(r"([a-z][a-z0-9+.-]*://[^:/?#@\s]*:)\S*@", re.IGNORECASE)
_QUERY_PASSWORD = re.compile(r"([?&]password=)[^&\s]*", re.IGNORECASE)
_KV_PASSWORD = re.compile(r"(password\s*=\s*)('(?:[^'\\]|\\.)*'|\S+)", re.IGNORECASE)
# A host name never holds an "@": one that does is the tail of a password
# libpq cut at its first "@" (the pool's warning: failed to resolve host 't-PW@db').
_HOST_WITH_AT = re.compile(r"""(host\s*(?:name)?\s*[=:]?\s*["']?)[^"'\s,]*@""", re.IGNORECASE)
# Where libpq, or a person, may cut a password into pieces.
_DELIMITERS = re.compile(r"[@/:?#,\[\]\s]+")
_PERCENT = re.compile(r"%(?![0-9A-Fa-f]{2})")
# A fragment this short would mask ordinary words everywhere; the whole
# password is always scrubbed, whatever its length.
MIN_FRAGMENT = 3

# Whole values a job's environment must not carry (see holds_connection_secret):
# the URLs and their whole passwords, and the variables a URL was read from.
# A password shorter than this is matched only as a variable's whole value:
# as a substring it would strip ordinary variables (PATH) too.
MIN_CONTAINED = 8
_connection_values: set[str] = set()
_connection_variables: set[str] = set()

# Words that make a name (an HTTP header, a variable of an env_file) look like
# it holds a secret: its value is then hidden, if it could be one
# (:func:`could_be_secret`).
SECRET_WORDS = ("token", "key", "secret", "password", "auth", "session", "credential")
# A value that only its name says is a secret is taken for one if it could be:
# this long at least, not a number, not a word settings commonly take. Scrubbed
# from every log line, AUTH_MODE=none or SESSION_TIMEOUT=3600 would mask "none"
# and "3600" wherever they appear and hide nothing.
MIN_SECRET = 8
_NUMBER = re.compile(r"[+-]?(\d+(\.\d*)?|\.\d+)([eE][+-]?\d+)?")
COMMON_VALUES = frozenset(
    {"true", "false", "yes", "no", "on", "off", "none", "null", "nil", "enabled", "disabled",
     "required", "optional", "default", "localhost", "unlimited", "undefined"}
)  # fmt: skip
# A line of this length at least that is a piece of a remembered secret is
# masked whole: a PEM or JSON key printed wrapped otherwise, or cut.
MIN_PIECE = 16

_secrets: set[str] = set()
# Bumped whenever the registry changes: what was decided against it is stale.
_generation = 0
# The same, longest first (so that a fragment inside a longer one cannot leave
# a tail): redact() runs on every value of every log line, so it is kept sorted.
_by_length: tuple[str, ...] = ()
# The remembered secrets long enough that a piece of one is masked (MIN_PIECE).
_long: tuple[str, ...] = ()


@dataclass(frozen=True)
class UriParts:
    """A ``postgresql://`` URL split as libpq splits it (values still percent-encoded)."""

    user: str | None
    password: str | None
    hosts: tuple[str, ...]
    ports: tuple[str, ...]
    dbname: str | None
    query: str | None


def is_uri(text: str) -> bool:
    return text.startswith(URI_PREFIXES)


def split_uri(url: str) -> UriParts:
    """Split like libpq; raise ``ValueError`` where libpq would refuse the URL's shape.

    The messages never quote the URL: any part of it may be a password.
    """
    prefix = next(p for p in URI_PREFIXES if url.startswith(p))
    rest = url[len(prefix) :]
    user = password = None
    # libpq looks ahead for "@" only up to the first "/", not "?".
    end = min((i for i in (rest.find("@"), rest.find("/")) if i >= 0), default=-1)
    if end >= 0 and rest[end] == "@":
        userinfo, rest = rest[:end], rest[end + 1 :]
        user, colon, secret = userinfo.partition(":")
        password = secret if colon else None
    hosts: list[str] = []
    ports: list[str] = []
    position = 0
    while True:
        if rest[position : position + 1] == "[":
            close = rest.find("]", position)
            if close < 0:
                raise ValueError("an IPv6 host address opened with '[' has no closing ']'")
            if close == position + 1:
                raise ValueError("an IPv6 host address in [] must not be empty")
            hosts.append(rest[position + 1 : close])
            position = close + 1
            if rest[position : position + 1] not in ("", ":", "/", "?", ","):
                raise ValueError("unexpected character after an IPv6 host address in []")
        else:
            stop = _first(rest, position, ":/?,")
            hosts.append(rest[position:stop])
            position = stop
        if rest[position : position + 1] == ":":
            stop = _first(rest, position + 1, "/?,")
            ports.append(rest[position + 1 : stop])
            position = stop
        else:
            ports.append("")
        if rest[position : position + 1] != ",":
            break
        position += 1
    dbname = query = None
    if rest[position : position + 1] == "/":
        stop = _first(rest, position + 1, "?")
        dbname = rest[position + 1 : stop]
        position = stop
    if rest[position : position + 1] == "?":
        query = rest[position + 1 :]
    return UriParts(user, password, tuple(hosts), tuple(ports), dbname, query)


def _first(text: str, start: int, characters: str) -> int:
    found = [i for i in (text.find(c, start) for c in characters) if i >= 0]
    return min(found, default=len(text))


def url_problems(url: str) -> list[str]:
    """What libpq would get wrong or refuse in a URL; never quotes any part of it.

    Key=value DSNs (``host=db user=app``) are left to libpq.
    """
    if not is_uri(url):
        scheme = url.split("://", 1)[0] if "://" in url else None
        if scheme is not None and " " not in scheme and "=" not in scheme:
            return ["is not a PostgreSQL URL: it must start with postgresql:// or postgres://"]
        return []
    try:
        parts = split_uri(url)
    except ValueError as exc:
        return [str(exc)]
    problems: list[str] = []
    if any("@" in host for host in parts.hosts):
        # Only an unescaped "@" in the user:password part leaves one in the host.
        problems.append(
            "the user name or password contains an unescaped '@': libpq ends user:password "
            "at the first '@', so part of the password would be taken for the host name and "
            "shown in its errors; percent-encode each '@' in it as %40"
        )
    elif parts.user is None and parts.dbname is not None and "@" in parts.dbname:
        problems.append(
            "the password (or user name) contains an unescaped '/': libpq reads no "
            "user:password before it; percent-encode each '/' in it as %2F"
        )
    for name, value in (("user name", parts.user), ("password", parts.password)):
        if value is not None and not _decodes(value):
            problems.append(
                f"the {name} has a '%' that is not followed by two hex digits; "
                "percent-encode a literal '%' as %25"
            )
    if not problems:
        for label, value in (("host", ",".join(parts.hosts)), ("database name", parts.dbname)):
            if value is not None and not _decodes(value):
                problems.append(f"the {label} has a '%' not followed by two hex digits")
        if any(port and not port.isdigit() for port in parts.ports):
            problems.append("a port is not a number")
        # Parameter names are left to libpq (they differ between its versions).
        if parts.query is not None and any(
            param.count("=") != 1 for param in parts.query.split("&") if param
        ):
            problems.append(
                "a query parameter after '?' is not name=value (encode '=' in a value as %3D)"
            )
        elif parts.query is not None and not _decodes(parts.query):
            problems.append("a query parameter has a '%' not followed by two hex digits")
    return problems


def _decodes(value: str) -> bool:
    # libpq refuses a malformed %-escape and an encoded NUL (%00).
    return _PERCENT.search(value) is None and "%00" not in value


def password_fragments(url: str) -> set[str]:
    """Every piece of the password a message may quote: whole, as libpq cut it, and split."""
    whole, cut = _passwords(url)
    pieces: set[str] = set()
    for secret in whole | cut:
        for form in (secret, unquote(secret)):
            if form and (secret in whole or len(form) >= MIN_FRAGMENT):
                pieces.add(form)
            pieces.update(p for p in _DELIMITERS.split(form) if len(p) >= MIN_FRAGMENT)
    return pieces


def _passwords(url: str) -> tuple[set[str], set[str]]:
    """The password(s) of a URL or DSN: as the user meant them, and as libpq cuts them."""
    whole: set[str] = set()
    for match in _KV_PASSWORD.finditer(url):
        whole.add(match.group(2).strip("'"))
    for match in _QUERY_PASSWORD.finditer(url):
        whole.add(url[match.end(1) : match.end()])
    cut: set[str] = set()
    if is_uri(url):
        rest = url.split("://", 1)[1]
        # As the user meant it: to the last "@" before the query.
        head = rest.split("?", 1)[0]
        if "@" in head:
            userinfo = head.rsplit("@", 1)[0]
            if ":" in userinfo:
                whole.add(userinfo.split(":", 1)[1])
        try:
            parts = split_uri(url)
        except ValueError:
            parts = None
        if parts is not None and parts.password is not None:
            cut.add(parts.password)
    return whole, cut


def remember(url: str | None, variables: Iterable[str] = ()) -> None:
    """Scrub this URL's password (and every fragment of it) from all later :func:`redact` output.

    The URL, its whole password and the environment ``variables`` it was read
    from are kept out of every job's environment too (:func:`holds_connection_secret`).
    """
    global _by_length, _generation  # noqa: PLW0603 - the one process-wide registry
    _generation += 1
    _connection_variables.update(variables)
    if url:
        _secrets.update(password_fragments(url))
        _by_length = tuple(sorted(_secrets, key=len, reverse=True))
        whole, _ = _passwords(url)
        _connection_values.update({url, *whole, *(unquote(p) for p in whole)} - {""})


def looks_secret(name: str) -> bool:
    """Whether a name (a header, a variable) says its value is a secret."""
    lower = name.lower()
    return any(word in lower for word in SECRET_WORDS)


def could_be_secret(value: str) -> bool:
    """Whether a value its name calls secret could be one: :data:`MIN_SECRET` characters
    at least, not a number, not one of :data:`COMMON_VALUES`."""
    text = value.strip()
    return (
        len(text) >= MIN_SECRET
        and _NUMBER.fullmatch(text) is None
        and text.lower() not in COMMON_VALUES
    )


def remember_secrets(values: Iterable[str]) -> None:
    """Scrub each of these whole values (secrets a job's environment was given from
    files) from all later :func:`redact` output.

    A value shorter than :data:`MIN_FRAGMENT` is not scrubbed: masking every
    ``1`` or ``on`` would make every log line unreadable and hide nothing. A
    multi-line value (a PEM key, a JSON key file) is printed, and logged, a
    line at a time: each of its lines of :data:`MIN_SECRET` characters or more
    is scrubbed too, and a text that is a piece of it (:func:`redact`).
    """
    global _by_length, _long  # noqa: PLW0603 - the one process-wide registry
    forms: set[str] = set()
    for value in values:
        forms.update((value, value.strip()))
        if "\n" in value or "\r" in value:
            lines = (line.strip() for line in value.splitlines())
            forms.update(line for line in lines if len(line) >= MIN_SECRET)
    added = {form for form in forms if len(form) >= MIN_FRAGMENT}
    if not added <= _secrets:
        _secrets.update(added)
        _by_length = tuple(sorted(_secrets, key=len, reverse=True))
        _long = tuple(sorted({*_long, *(f for f in added if len(f) >= MIN_PIECE)}, key=len))


def holds_connection_secret(name: str, value: str) -> bool:
    """Whether an environment variable carries the database's secret: a remembered URL's.

    True for a variable a URL was read from (``url: ${MY_DSN}``), and for
    one whose value holds a remembered URL or a whole password.
    """
    if name in _connection_variables:
        return True
    return any(
        secret in value if len(secret) >= MIN_CONTAINED else secret == value
        for secret in _connection_values
    )


def generation() -> int:
    """A number that changes whenever a secret is remembered or forgotten."""
    return _generation


def forget_all() -> None:
    """Drop every remembered secret (tests)."""
    global _by_length, _long, _generation  # noqa: PLW0603 - the one process-wide registry
    _generation += 1
    _secrets.clear()
    _connection_values.clear()
    _connection_variables.clear()
    _by_length = _long = ()


def scrub(text: str, secrets: Iterable[str]) -> str:
    """``text`` with each of ``secrets`` replaced by ``***``, however a message quotes it.

    As written, without its surrounding whitespace, and as ``repr()`` shows
    it in a ``str`` or ``bytes`` (h11: ``Illegal header value b'Bearer …\\n'``).
    Any length: these are whole values, never fragments.
    """
    forms: set[str] = set()
    for secret in secrets:
        forms.update(
            (
                secret,
                secret.strip(),
                repr(secret)[1:-1],
                repr(secret.encode("utf-8", "backslashreplace"))[2:-1],
            )
        )
    for form in sorted(forms - {""}, key=len, reverse=True):
        text = text.replace(form, MASK)
    return text


def redact(text: str) -> str:
    """``text`` with every password of a connection URL or key=value DSN replaced by ``***``.

    Also masks any remembered password fragment, and the part before ``@`` of
    a quoted host name, wherever they appear.
    """
    # Every pattern needs an "@" or the word password: most log values have
    # neither, and skip the regular expressions.
    if "@" in text or "assword" in text or "ASSWORD" in text:
        text = _URL_PASSWORD.sub(rf"\1{MASK}@", text)
        text = _QUERY_PASSWORD.sub(rf"\1{MASK}", text)
        text = _KV_PASSWORD.sub(rf"\1{MASK}", text)
        text = _HOST_WITH_AT.sub(rf"\1{MASK}@", text)
    for secret in _by_length:
        if secret in text:
            text = text.replace(secret, MASK)
    if _long and len(text) >= MIN_PIECE:
        piece = text.strip()
        if len(piece) >= MIN_PIECE and any(piece in secret for secret in _long):
            return MASK
    return text


def cut(
    data: bytes, limit: int, *, keep: Literal["head", "tail"] = "head", also: Iterable[str] = ()
) -> bytes:
    """A piece of a longer text, redacted already: ``data`` (the text up to where it was
    cut off, ``keep="head"``; from there on, ``"tail"``) to at most ``limit`` bytes, with
    what a cut left of a secret masked: a remembered one's (or one of ``also``'s) head
    at the end of a head, its tail at the start of a tail.

    A secret whole in the text was masked before the cut; one a cut splits
    would otherwise show its first (or last) part.
    """
    kept = data[:limit] if keep == "head" else data[max(len(data) - limit, 0) :]
    mask = MASK.encode()
    for secret in {*_by_length, *also}:
        encoded = secret.encode("utf-8", "surrogateescape")
        for size in range(min(len(encoded) - 1, len(kept)), MIN_FRAGMENT - 1, -1):
            if keep == "head" and kept.endswith(encoded[:size]):
                kept = kept[:-size] + mask
                break
            if keep == "tail" and kept.startswith(encoded[-size:]):
                kept = mask + kept[size:]
                break
    return kept
