"""Converters: YAML node -> value, each raising ``ValueError`` with a message that says
what is allowed (the loader adds the file, line, job and field).

Each converter also carries the JSON Schema of what it accepts, so that the
published schema (:mod:`pgcrond.config.schema`) is derived from the same
objects that do the checking and cannot drift from them.
"""

from __future__ import annotations

import difflib
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import date, datetime, timedelta
from ipaddress import IPv4Network, IPv6Network, ip_network
from pathlib import Path
from types import MappingProxyType
from typing import Any, Generic, TypeVar, get_args
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError, available_timezones

import yaml

from pgcrond.config.listen import parse_listen
from pgcrond.config.yamlnodes import construct, kind
from pgcrond.core import params
from pgcrond.core.access import ROLES, PageUser, Role, TlsFiles
from pgcrond.core.actions import HttpAction
from pgcrond.core.box import Limits
from pgcrond.core.durations import parse_duration
from pgcrond.core.hooks import Hook, Ping
from pgcrond.core.keys import BIGINT_MAX, BIGINT_MIN
from pgcrond.core.passwords import USER_NAME, parse_hash
from pgcrond.core.schedule.cron import Dst, Repeated, Skipped
from pgcrond.core.sqlscript import compile_script
from pgcrond.errors import ValidationError

T = TypeVar("T")
Schema = dict[str, Any]

_IDENTIFIER = re.compile(r"^[a-z_][a-z0-9_]{0,62}$")
# Longer than any IANA name (the longest is 32 characters), short of any file name limit.
MAX_ZONE_NAME = 64
DURATION_PATTERN = r"^\s*(0+|(\d+(\.\d+)?\s*(ms|s|m|h|d)\s*)+)$"
DURATION_SCHEMA: Schema = {
    "description": "a duration with a unit: 500ms, 90s, 15m, 2h, 1d, 1h30m (0 needs none)",
    "anyOf": [{"type": "string", "pattern": DURATION_PATTERN}, {"const": 0}],
}


class Problems(ValueError):
    """Several problems in one value, each at its own node (every bad ``env:`` entry)."""

    def __init__(self, problems: list[tuple[yaml.Node, str]]) -> None:
        self.problems = problems
        super().__init__("; ".join(message for _, message in problems))


@dataclass(frozen=True)
class Converter(Generic[T]):
    """A named check of one YAML node, and the JSON Schema of what it accepts."""

    convert: Callable[[yaml.Node], T]
    schema: Schema = field(default_factory=dict)

    def __call__(self, node: yaml.Node) -> T:
        return self.convert(node)


def scalar(node: yaml.Node) -> object:
    if not isinstance(node, yaml.ScalarNode):
        raise ValueError(f"expected a single value, got {kind(node)}")
    return construct(node)


def _string(node: yaml.Node) -> str:
    value = scalar(node)
    if not isinstance(value, str):
        raise ValueError(f"must be text, got {kind(node)}; quote it")
    return value


def _nonempty_string(node: yaml.Node) -> str:
    value = _string(node)
    if not value.strip():
        raise ValueError("must not be empty")
    return value


def _bool(node: yaml.Node) -> bool:
    value = scalar(node)
    if not isinstance(value, bool):
        raise ValueError(f"must be true or false, got {kind(node)}")
    return value


def _count(node: yaml.Node) -> int:
    value = scalar(node)
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ValueError(f"must be a whole number 0 or more, got {kind(node)}")
    return value


def _positive_count(node: yaml.Node) -> int:
    value = scalar(node)
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"must be a whole number 1 or more, got {kind(node)}")
    return value


def _duration(node: yaml.Node) -> timedelta:
    return parse_duration(scalar(node))


def _positive_duration(node: yaml.Node) -> timedelta:
    value = _duration(node)
    if value <= timedelta(0):
        raise ValueError("must be longer than 0")
    return value


def _timeout(node: yaml.Node) -> timedelta | None:
    if scalar(node) is None:
        return None
    value = _duration(node)
    if value <= timedelta(0):
        raise ValueError("must be longer than 0; leave it out (or null) for no timeout")
    return value


def choice(kind_: object) -> Converter[str]:
    """One of the values of a ``Literal`` type."""
    options: tuple[str, ...] = get_args(kind_)

    def convert(node: yaml.Node) -> str:
        value = scalar(node)
        if value not in options:
            shown = repr(value) if isinstance(value, str) else kind(node)
            raise ValueError(f"{shown} is not one of: {', '.join(options)}")
        return str(value)

    return Converter(convert, {"enum": list(options)})


def zone_problem(name: str) -> str | None:
    """Why ``name`` is not a time zone ZoneInfo can load, or None."""
    if len(name) > MAX_ZONE_NAME:
        return f"unknown time zone {name[:40]!r}...: too long for an IANA name"
    try:
        ZoneInfo(name)
    except (ZoneInfoNotFoundError, ValueError, OSError):
        # OSError: a directory ("Europe") or a name the file system refuses.
        close = difflib.get_close_matches(name, available_timezones(), n=1)
        hint = f"did you mean {close[0]!r}?" if close else "e.g. 'Europe/Berlin' or 'UTC'"
        return f"unknown time zone {name!r}; use an IANA name, {hint}"
    return None


def _zone(node: yaml.Node) -> ZoneInfo:
    name = _string(node)
    problem = zone_problem(name)
    if problem is not None:
        raise ValueError(problem)
    return ZoneInfo(name)


def _path(node: yaml.Node) -> Path:
    value = _nonempty_string(node)
    if "\0" in value:
        raise ValueError("must not contain a NUL character")
    return Path(value)


def _identifier(node: yaml.Node) -> str:
    value = _string(node)
    if not _IDENTIFIER.match(value):
        raise ValueError(
            f"{value!r} is not a plain SQL identifier: lower-case letters, digits and _, "
            "not starting with a digit, at most 63 characters"
        )
    return value


def _listen(node: yaml.Node) -> str:
    value = _string(node)
    try:
        parse_listen(value)
    except ValidationError as exc:
        raise ValueError(str(exc).removeprefix(f"{exc.field}: ")) from None
    return value


def _env(node: yaml.Node) -> dict[str, str]:
    if not isinstance(node, yaml.MappingNode):
        raise ValueError(f"must be a mapping of NAME: value, got {kind(node)}")
    env: dict[str, str] = {}
    problems: list[tuple[yaml.Node, str]] = []
    for key_node, value_node in node.value:
        name = str(key_node.value)
        if not name or "=" in name or "\0" in name:
            problems.append((key_node, f"{name!r} is not a valid variable name"))
            continue
        try:
            value = scalar(value_node)
        except ValueError as exc:
            problems.append((value_node, f"{name}: {exc}"))
            continue
        if not isinstance(value, str):
            problems.append((value_node, f"{name}: must be text, got {kind(value_node)}; quote it"))
        elif "\0" in value:
            problems.append((value_node, f"{name}: must not contain a NUL character"))
        else:
            env[name] = value
    if problems:
        raise Problems(problems)
    return env


def _argv(node: yaml.Node) -> tuple[str, ...]:
    if not isinstance(node, yaml.SequenceNode):
        raise ValueError(
            f"must be a list of arguments like ['/bin/echo', 'hi'], got {kind(node)}; "
            "use shell: for a command line"
        )
    argv = []
    for index, item in enumerate(node.value):
        value = scalar(item)
        if not isinstance(value, str):
            raise ValueError(f"argument {index} must be text, got {kind(item)}; quote it")
        argv.append(value)
    if not argv or not argv[0]:
        raise ValueError("must name a program: ['/bin/echo', 'hi']")
    return tuple(argv)


def _codes(node: yaml.Node) -> tuple[str, ...]:
    if not isinstance(node, yaml.SequenceNode):
        raise ValueError(f"must be a list of job codes like [old-code], got {kind(node)}")
    codes = []
    for index, item in enumerate(node.value):
        value = scalar(item)
        if not isinstance(value, str) or not value:
            raise ValueError(f"entry {index} must be a job code (text), got {kind(item)}")
        codes.append(value)
    if not codes:
        raise ValueError("must name at least one old job code")
    return tuple(codes)


def _lock_key(node: yaml.Node) -> str | int:
    value = scalar(node)
    if isinstance(value, bool) or not isinstance(value, str | int):
        raise ValueError(f"must be text or a whole number, got {kind(node)}")
    if isinstance(value, int) and not BIGINT_MIN <= value <= BIGINT_MAX:
        raise ValueError("must fit a signed 64-bit integer")
    if isinstance(value, str) and not value:
        raise ValueError("must not be empty")
    return value


def _datetime(node: yaml.Node) -> datetime:
    if not isinstance(node, yaml.ScalarNode):
        raise ValueError(f"expected an ISO datetime, got {kind(node)}")
    # The raw text, not PyYAML's own timestamp reading, so that offsets and 'Z' behave.
    text = str(node.value).strip()
    try:
        return datetime.fromisoformat(text)
    except ValueError:
        raise ValueError(
            f"{text[:60]!r} is not an ISO datetime like 2026-05-01T12:00:00Z, "
            "2026-05-01T12:00:00+02:00, or 2026-05-01T12:00:00 (the job's time zone)"
        ) from None


string = Converter(_string, {"type": "string"})
codes = Converter(
    _codes, {"type": "array", "items": {"type": "string", "minLength": 1}, "minItems": 1}
)
nonempty_string = Converter(_nonempty_string, {"type": "string", "minLength": 1})
boolean = Converter(_bool, {"type": "boolean"})
count = Converter(_count, {"type": "integer", "minimum": 0})
positive_count = Converter(_positive_count, {"type": "integer", "minimum": 1})
duration = Converter(_duration, {"$ref": "#/$defs/duration"})
positive_duration = Converter(_positive_duration, {"$ref": "#/$defs/duration"})
timeout = Converter(_timeout, {"anyOf": [{"$ref": "#/$defs/duration"}, {"type": "null"}]})
zone = Converter(_zone, {"type": "string", "minLength": 1, "maxLength": MAX_ZONE_NAME})
path = Converter(_path, {"type": "string", "minLength": 1})
identifier = Converter(_identifier, {"type": "string", "pattern": _IDENTIFIER.pattern})
listen = Converter(_listen, {"type": "string"})
env = Converter(
    _env,
    {
        "type": "object",
        "additionalProperties": {"type": "string"},
        "propertyNames": {"pattern": "^[^=]+$"},
    },
)
argv = Converter(_argv, {"type": "array", "items": {"type": "string"}, "minItems": 1})
lock_key = Converter(
    _lock_key,
    {
        "anyOf": [
            {"type": "string", "minLength": 1},
            {"type": "integer", "minimum": BIGINT_MIN, "maximum": BIGINT_MAX},
        ]
    },
)
# YAML may read an unquoted ISO instant as a timestamp; both spellings are accepted.
iso_datetime = Converter(_datetime, {"type": "string", "format": "date-time"})
once = Converter(_bool, {"const": True})


def _sql(node: yaml.Node) -> str:
    text = _nonempty_string(node)
    compile_script(text)  # its ValueError names what is wrong
    return text


sql = Converter(_sql, {"type": "string", "minLength": 1})

HTTP_METHODS = ("GET", "POST", "PUT", "PATCH", "DELETE", "HEAD", "OPTIONS")
_HEADER_NAME = re.compile(r"^[!#$%&'*+.^_`|~0-9A-Za-z-]+$")


def _header_name(node: yaml.Node) -> str:
    value = _nonempty_string(node)
    if not _HEADER_NAME.match(value):
        raise ValueError(f"{value!r} is not an HTTP header name")
    return value


def _options(
    node: yaml.Node,
    example: str,
    readers: dict[str, Callable[[yaml.Node], Any]],
    required: tuple[str, ...] = (),
) -> tuple[dict[str, Any], list[tuple[yaml.Node, str]]]:
    """A small mapping of known keys, each read by its converter; every problem at its node."""
    if not isinstance(node, yaml.MappingNode):
        raise ValueError(f"must be a mapping like {example}, got {kind(node)}")
    values: dict[str, yaml.Node] = {}
    problems: list[tuple[yaml.Node, str]] = []
    keys = tuple(readers)
    for key_node, value_node in node.value:
        name = str(key_node.value)
        if name not in readers:
            close = difflib.get_close_matches(name, keys, n=1)
            hint = f"did you mean {close[0]!r}?" if close else f"allowed: {', '.join(keys)}"
            problems.append((key_node, f"unknown key {name!r}; {hint}"))
        elif name in values:
            problems.append((key_node, f"duplicate key {name!r}"))
        else:
            values[name] = value_node
    problems += [(node, f"{name}: is required") for name in required if name not in values]
    options: dict[str, Any] = {}
    for name, value in values.items():
        try:
            options[name] = readers[name](value)
        except ValueError as exc:
            problems.append((value, f"{name}: {exc}"))
    return options, problems


# A size with its unit: http's max_response, a job's memory limit.
_SIZE = re.compile(r"^\s*(\d+)\s*(KiB|MiB|GiB|TiB|kB|KB|MB|GB|TB)\s*$")
_SIZE_FACTORS = {
    "KiB": 1 << 10,
    "MiB": 1 << 20,
    "GiB": 1 << 30,
    "TiB": 1 << 40,
    "kB": 1000,
    "KB": 1000,
    "MB": 1000**2,
    "GB": 1000**3,
    "TB": 1000**4,
}


def _http(node: yaml.Node) -> HttpAction:
    """``http: {url, method, headers, body, timeout, expect, …}``; each problem at its node."""
    readers: dict[str, Callable[[yaml.Node], Any]] = {
        "url": _http_url,
        "method": _http_method,
        "headers": _headers,
        "body": _string,
        "timeout": _positive_duration,
        "expect": _expect,
        "idempotency_header": _header_name,
        "fencing_header": _header_name,
        "max_response": _bytes,
    }
    options, problems = _options(node, "{url: https://…}", readers, ("url",))
    if problems:
        raise Problems(problems)
    return HttpAction(**options)


def _http_url(node: yaml.Node) -> str:
    value = _nonempty_string(node)
    if not value.startswith(("http://", "https://")):
        raise ValueError(f"must start with http:// or https://, got {value[:40]!r}")
    return value


def _http_method(node: yaml.Node) -> str:
    value = _string(node).upper()
    if value not in HTTP_METHODS:
        raise ValueError(f"{value!r} is not one of: {', '.join(HTTP_METHODS)}")
    return value


def _headers(node: yaml.Node) -> MappingProxyType[str, str]:
    if not isinstance(node, yaml.MappingNode):
        raise ValueError(f"must be a mapping of Name: value, got {kind(node)}")
    headers: dict[str, str] = {}
    for key_node, value_node in node.value:
        name = _header_name(key_node)
        value = scalar(value_node)
        if not isinstance(value, str | int) or isinstance(value, bool):
            raise ValueError(f"{name}: must be text, got {kind(value_node)}; quote it")
        if any(ch in str(value) for ch in "\r\n\0"):
            raise ValueError(f"{name}: must not contain a line break or NUL")
        headers[name] = str(value)
    return MappingProxyType(headers)


def _expect(node: yaml.Node) -> frozenset[int]:
    items = node.value if isinstance(node, yaml.SequenceNode) else [node]
    codes: set[int] = set()
    for item in items:
        value = scalar(item)
        if isinstance(value, bool) or not isinstance(value, int) or not 100 <= value <= 599:
            raise ValueError(f"must be HTTP status codes (100-599), got {kind(item)}")
        codes.add(value)
    if not codes:
        raise ValueError("must name at least one status code")
    return frozenset(codes)


http = Converter(
    _http,
    {
        "type": "object",
        "required": ["url"],
        "additionalProperties": False,
        "properties": {
            "url": {"type": "string", "pattern": "^https?://"},
            "method": {"enum": list(HTTP_METHODS), "default": "POST"},
            "headers": {
                "type": "object",
                "additionalProperties": {"type": ["string", "integer"]},
                "description": "values may use ${VAR} from the run's environment",
            },
            "body": {"type": "string"},
            "timeout": {"$ref": "#/$defs/duration", "default": "30s"},
            "expect": {
                "description": "status codes that mean success; default any 2xx",
                "anyOf": [
                    {"type": "integer", "minimum": 100, "maximum": 599},
                    {
                        "type": "array",
                        "minItems": 1,
                        "items": {"type": "integer", "minimum": 100, "maximum": 599},
                    },
                ],
            },
            "idempotency_header": {"type": "string", "default": "Idempotency-Key"},
            "fencing_header": {"type": "string", "default": "X-Fencing-Token"},
            "max_response": {
                "type": "string",
                "pattern": _SIZE.pattern,
                "default": "16MiB",
                "description": "the most of a response body that is read (streamed: the "
                "record keeps its first KiB); past it the connection is closed, and the "
                "status decides the outcome",
            },
        },
    },
)


def _hook(node: yaml.Node) -> Hook:
    """``on_failure: {webhook, command, timeout, retries}`` (any hook); each problem at its node."""
    readers: dict[str, Callable[[yaml.Node], Any]] = {
        "webhook": _http_url,
        "command": lambda n: tuple(_argv(n)),
        "timeout": _positive_duration,
        "retries": _count,
    }
    options, problems = _options(node, "{webhook: https://…}", readers)
    if not problems and "webhook" not in options and "command" not in options:
        problems.append((node, "set webhook:, command:, or both"))
    if problems:
        raise Problems(problems)
    return Hook(**options)


hook = Converter(
    _hook,
    {
        "type": "object",
        "additionalProperties": False,
        "minProperties": 1,
        "properties": {
            "webhook": {"type": "string", "pattern": "^https?://"},
            "command": {"type": "array", "items": {"type": "string"}, "minItems": 1},
            "timeout": {"$ref": "#/$defs/duration", "default": "10s"},
            "retries": {"type": "integer", "minimum": 0, "default": 2},
        },
    },
)


def _ping(node: yaml.Node) -> Ping:
    """``ping: URL`` or ``ping: {url, cronitor, timeout, retries}``; each problem at its node."""
    if isinstance(node, yaml.ScalarNode):
        return Ping(_http_url(node))
    readers: dict[str, Callable[[yaml.Node], Any]] = {
        "url": _http_url,
        "cronitor": _bool,
        "timeout": _positive_duration,
        "retries": _count,
    }
    options, problems = _options(node, "{url: https://hc-ping.com/…}", readers, ("url",))
    if problems:
        raise Problems(problems)
    return Ping(**options)


_PING_URL = {"type": "string", "pattern": "^https?://"}
ping = Converter(
    _ping,
    {
        "anyOf": [
            _PING_URL,
            {
                "type": "object",
                "additionalProperties": False,
                "required": ["url"],
                "properties": {
                    "url": _PING_URL,
                    "cronitor": {"type": "boolean", "default": False},
                    "timeout": {"$ref": "#/$defs/duration", "default": "10s"},
                    "retries": {"type": "integer", "minimum": 0, "default": 2},
                },
            },
        ]
    },
)


# -- the status page's access --------------------------------------------------------------


def _users(node: yaml.Node) -> MappingProxyType[str, PageUser]:
    """``name: scrypt$…`` (an operator) or ``name: {password, role, jobs}`` entries.

    Each problem at its node; a hash is never echoed.
    """
    if not isinstance(node, yaml.MappingNode):
        raise ValueError(f"must be a mapping of name: hash or name: {{role, …}}, got {kind(node)}")
    users: dict[str, PageUser] = {}
    problems: list[tuple[yaml.Node, str]] = []
    for key_node, value_node in node.value:
        name = str(key_node.value)
        if not USER_NAME.fullmatch(name):
            problems.append(
                (key_node, f"{name[:40]!r} is not a user name: 1-64 characters, no ':' or space")
            )
            continue
        try:
            users[name] = _user(value_node)
        except ValueError as exc:
            problems.append((value_node, f"{name}: {exc}"))
    if problems:
        raise Problems(problems)
    return MappingProxyType(users)


def _user(node: yaml.Node) -> PageUser:
    if not isinstance(node, yaml.MappingNode):
        text = _string(node)
        parse_hash(text)
        return PageUser(password=text, role="operator")
    entry = {str(key.value): value for key, value in node.value}
    unknown = sorted(set(entry) - {"password", "role", "jobs"})
    if unknown:
        raise ValueError(f"unknown key {unknown[0]!r}; a user has password, role and jobs")
    password = None
    if "password" in entry:
        password = _string(entry["password"])
        parse_hash(password)
    role = _role(entry["role"]) if "role" in entry else "viewer"
    jobs = _job_globs(entry["jobs"]) if "jobs" in entry else ()
    if jobs and role != "operator":
        raise ValueError("jobs: limits what an operator may act on; a viewer acts on none")
    return PageUser(password=password, role=role, jobs=jobs)


def _role(node: yaml.Node) -> Role:
    value = scalar(node)
    for role in ROLES:
        if value == role:
            return role
    raise ValueError(f"role {value!r} is not one of: {', '.join(ROLES)}")


def _job_globs(node: yaml.Node) -> tuple[str, ...]:
    items = node.value if isinstance(node, yaml.SequenceNode) else [node]
    globs = tuple(_nonempty_string(item) for item in items)
    if not globs:
        raise ValueError("jobs: name at least one job code or glob (leave it out for every job)")
    return globs


def _page_switch(node: yaml.Node) -> bool | str:
    value = scalar(node)
    if isinstance(value, bool) or value == "public":
        return value
    raise ValueError(f"must be true, false or public, got {kind(node)}")


def _tls(node: yaml.Node) -> TlsFiles:
    if not isinstance(node, yaml.MappingNode):
        raise ValueError(f"must be a mapping {{cert: FILE, key: FILE}}, got {kind(node)}")
    entry = {str(key.value): value for key, value in node.value}
    if set(entry) != {"cert", "key"}:
        raise ValueError("must have exactly cert and key (PEM files)")
    return TlsFiles(cert=_path(entry["cert"]), key=_path(entry["key"]))


def _networks(node: yaml.Node) -> tuple[IPv4Network | IPv6Network, ...]:
    items = node.value if isinstance(node, yaml.SequenceNode) else [node]
    networks = []
    for item in items:
        text = _string(item)
        try:
            networks.append(ip_network(text.strip(), strict=False))
        except ValueError:
            raise ValueError(
                f"{text[:60]!r} is not an IP address or CIDR like 10.0.0.7 or 10.0.0.0/8"
            ) from None
    return tuple(networks)


_HASH_SCHEMA: Schema = {"type": "string", "pattern": r"^scrypt\$"}
users = Converter(
    _users,
    {
        "type": "object",
        "propertyNames": {"pattern": USER_NAME.pattern},
        "additionalProperties": {
            "anyOf": [
                _HASH_SCHEMA,
                {
                    "type": "object",
                    "additionalProperties": False,
                    "properties": {
                        "password": _HASH_SCHEMA,
                        "role": {"enum": list(ROLES), "default": "viewer"},
                        "jobs": {
                            "anyOf": [
                                {"type": "string", "minLength": 1},
                                {"type": "array", "items": {"type": "string", "minLength": 1}},
                            ]
                        },
                    },
                },
            ]
        },
    },
)
role = Converter(_role, {"enum": list(ROLES)})
page_switch = Converter(_page_switch, {"enum": [True, False, "public"]})
tls = Converter(
    _tls,
    {
        "type": "object",
        "additionalProperties": False,
        "required": ["cert", "key"],
        "properties": {
            "cert": {"type": "string", "minLength": 1},
            "key": {"type": "string", "minLength": 1},
        },
    },
)
header_name = Converter(_header_name, {"type": "string", "pattern": _HEADER_NAME.pattern})
networks = Converter(
    _networks,
    {"anyOf": [{"type": "string"}, {"type": "array", "items": {"type": "string"}}]},
)


# -- a job's box: user, group, limits, inherited environment ---------------------------

_PERCENT = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*%\s*$")
# Below this a cgroup's memory limit kills the job before it has started.
MIN_MEMORY = 4 << 20
_VARIABLE_GLOB = re.compile(r"^[A-Za-z_*?\[][A-Za-z0-9_*?\[\]!-]*$")


def _account(node: yaml.Node) -> str | int:
    """A user or group: a name, or a numeric id (looked up by the loader)."""
    value = scalar(node)
    if isinstance(value, bool) or not isinstance(value, str | int):
        raise ValueError(f"must be a name or a numeric id, got {kind(node)}")
    if isinstance(value, int) and not 0 <= value < 2**32 - 1:
        raise ValueError("a numeric id must be between 0 and 4294967294")
    if isinstance(value, str) and (not value or ":" in value or "\0" in value):
        raise ValueError(f"{value[:40]!r} is not a user or group name")
    return value


def _bytes(node: yaml.Node) -> int:
    """A size with a unit (``512MiB``, ``2GiB``, ``500MB``), more than 0."""
    value = scalar(node)
    match = _SIZE.match(value) if isinstance(value, str) else None
    if match is None:
        raise ValueError(
            f"{str(value)[:40]!r} is not a size with a unit, like 512MiB, 2GiB or 500MB"
        )
    size = int(match.group(1)) * _SIZE_FACTORS[match.group(2)]
    if size <= 0:
        raise ValueError("must be more than 0")
    return size


def _size(node: yaml.Node) -> int:
    size = _bytes(node)
    if size < MIN_MEMORY:
        raise ValueError("must be at least 4MiB")
    return size


def _cpu(node: yaml.Node) -> float:
    """``50%`` of one CPU, ``200%`` for two; or a number of CPUs (``0.5``, ``2``)."""
    value = scalar(node)
    if isinstance(value, str) and (match := _PERCENT.match(value)):
        cpus = float(match.group(1)) / 100
    elif isinstance(value, int | float) and not isinstance(value, bool):
        cpus = float(value)
    else:
        raise ValueError(f"must be a share of one CPU like 50% (or 150%), got {kind(node)}")
    if cpus < 0.01:
        raise ValueError("must be at least 1% of one CPU")
    return cpus


def _limits(node: yaml.Node) -> Limits:
    """``limits: {memory: 512MiB, cpu: 50%, nofile: 1024, processes: 64}``."""
    readers: dict[str, Callable[[yaml.Node], Any]] = {
        "memory": _size,
        "cpu": _cpu,
        "nofile": _positive_count,
        "processes": _positive_count,
    }
    options, problems = _options(node, "{memory: 512MiB, cpu: 50%}", readers)
    if problems:
        raise Problems(problems)
    return Limits(**options)


def _paths(node: yaml.Node) -> tuple[Path, ...]:
    items = node.value if isinstance(node, yaml.SequenceNode) else [node]
    paths = tuple(_path(item) for item in items)
    if not paths:
        raise ValueError("must name at least one file")
    return paths


def _variable_globs(node: yaml.Node) -> tuple[str, ...]:
    if not isinstance(node, yaml.SequenceNode):
        raise ValueError(
            f"must be a list of variable names or globs like [AWS_*], got {kind(node)}"
        )
    names = []
    for index, item in enumerate(node.value):
        value = scalar(item)
        if not isinstance(value, str) or not _VARIABLE_GLOB.match(value):
            raise ValueError(
                f"entry {index} must be a variable name or a glob (AWS_*, *), got {kind(item)}"
            )
        names.append(value)
    return tuple(names)


account = Converter(
    _account,
    {"anyOf": [{"type": "string", "minLength": 1}, {"type": "integer", "minimum": 0}]},
)
limits = Converter(
    _limits,
    {
        "type": "object",
        "additionalProperties": False,
        "properties": {
            "memory": {"type": "string", "pattern": _SIZE.pattern},
            "cpu": {
                "anyOf": [
                    {"type": "string", "pattern": _PERCENT.pattern},
                    {"type": "number", "exclusiveMinimum": 0},
                ]
            },
            "nofile": {"type": "integer", "minimum": 1},
            "processes": {"type": "integer", "minimum": 1},
        },
    },
)
paths = Converter(
    _paths,
    {
        "anyOf": [
            {"type": "string", "minLength": 1},
            {"type": "array", "items": {"type": "string", "minLength": 1}, "minItems": 1},
        ]
    },
)
variable_globs = Converter(
    _variable_globs,
    {"type": "array", "items": {"type": "string", "pattern": _VARIABLE_GLOB.pattern}},
)


def _param_names(node: yaml.Node) -> tuple[str, ...]:
    if not isinstance(node, yaml.SequenceNode):
        raise ValueError(f"must be a list of variable names like [DAY, DRY_RUN], got {kind(node)}")
    names: list[str] = []
    for index, item in enumerate(node.value):
        value = scalar(item)
        if not isinstance(value, str):
            raise ValueError(f"entry {index} must be a variable name, got {kind(item)}")
        problem = params.name_problem(value)
        if problem is not None:
            raise ValueError(f"entry {index}: {problem}")
        if value in names:
            raise ValueError(f"entry {index}: {value!r} is listed twice")
        names.append(value)
    return tuple(names)


param_names = Converter(
    _param_names,
    {
        "type": "array",
        "items": {"type": "string", "pattern": params.NAME.pattern, "not": {"pattern": "^PGCRON_"}},
        "uniqueItems": True,
    },
)


# --- schedule forms -------------------------------------------------------------------


def _expressions(node: yaml.Node) -> tuple[str, ...]:
    """``cron:`` as text or a list of texts (the job's ticks are their union)."""
    if not isinstance(node, yaml.SequenceNode):
        return (_nonempty_string(node),)
    problems = []
    found = []
    for index, item in enumerate(node.value):
        try:
            found.append(_nonempty_string(item))
        except ValueError as exc:
            problems.append((item, f"entry {index}: {exc}"))
    if problems:
        raise Problems(problems)
    if not found:
        raise ValueError("must hold at least one cron expression")
    return tuple(found)


def _whole_seconds(value: timedelta, what: str) -> timedelta:
    if value % timedelta(seconds=1):
        raise ValueError(
            f"{what} must be whole seconds: ticks, and the run keys that name them, are "
            "whole seconds"
        )
    return value


def _every(node: yaml.Node) -> timedelta:
    value = _whole_seconds(_duration(node), "every")
    if value < timedelta(seconds=1):
        raise ValueError("must be 1s or more")
    return value


def _phase(node: yaml.Node) -> timedelta:
    return _whole_seconds(_duration(node), "phase")


def _instant_or_date(node: yaml.Node) -> datetime | date:
    """An ISO instant (offset optional: the job's zone) or a date (a local day)."""
    if not isinstance(node, yaml.ScalarNode):
        raise ValueError(f"expected an ISO datetime or a date, got {kind(node)}")
    text = str(node.value).strip()
    try:
        return date.fromisoformat(text) if len(text) == 10 else datetime.fromisoformat(text)
    except ValueError:
        raise ValueError(
            f"{text[:60]!r} is not a date like 2026-06-01 or an ISO datetime like "
            "2026-06-01T08:00:00Z (without an offset: the job's time zone)"
        ) from None


def _between(node: yaml.Node) -> tuple[datetime | date | None, datetime | date | None]:
    example = "{start: 2026-06-01, end: 2026-09-01T00:00:00Z}"
    readers: dict[str, Callable[[yaml.Node], Any]] = {
        "start": _instant_or_date,
        "end": _instant_or_date,
    }
    options, problems = _options(node, example, readers)
    if not options and not problems:
        problems.append((node, f"names neither start nor end; write {example}"))
    if problems:
        raise Problems(problems)
    return options.get("start"), options.get("end")


def _names(node: yaml.Node) -> tuple[str, ...]:
    if not isinstance(node, yaml.SequenceNode):
        raise ValueError(f"must be a list of calendar names like [holidays], got {kind(node)}")
    names = tuple(_nonempty_string(item) for item in node.value)
    if len(set(names)) != len(names):
        raise ValueError("names a calendar twice")
    return names


def _dst(node: yaml.Node) -> Dst:
    readers: dict[str, Callable[[yaml.Node], Any]] = {
        "skipped": choice(Skipped),
        "repeated": choice(Repeated),
    }
    options, problems = _options(node, "{skipped: skip, repeated: both}", readers)
    if problems:
        raise Problems(problems)
    return Dst(**options)


_SKIPPED = list(get_args(Skipped))
_REPEATED = list(get_args(Repeated))
expressions = Converter(
    _expressions,
    {
        "anyOf": [
            {"type": "string", "minLength": 1},
            {"type": "array", "items": {"type": "string", "minLength": 1}, "minItems": 1},
        ]
    },
)
every = Converter(_every, {"$ref": "#/$defs/duration"})
phase = Converter(_phase, {"$ref": "#/$defs/duration"})
_BOUND: Schema = {"type": "string", "anyOf": [{"format": "date"}, {"format": "date-time"}]}
between = Converter(
    _between,
    {
        "type": "object",
        "additionalProperties": False,
        "minProperties": 1,
        "properties": {"start": _BOUND, "end": _BOUND},
    },
)
names = Converter(
    _names, {"type": "array", "items": {"type": "string", "minLength": 1}, "uniqueItems": True}
)
dst = Converter(
    _dst,
    {
        "type": "object",
        "additionalProperties": False,
        "properties": {"skipped": {"enum": _SKIPPED}, "repeated": {"enum": _REPEATED}},
    },
)
