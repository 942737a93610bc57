"""Running an ``http:`` action: one request per attempt, deduplicable downstream.

Every attempt of a tick (a retry, a takeover, on any replica) sends the same
``Idempotency-Key`` (the run's idempotency key; the header name is
configurable) and the claim's fencing token (``X-Fencing-Token``), so the
receiving service can do the work once and refuse a stale holder. pgcrond adds
nothing else: no environment, no DSN. ``${VAR}`` in a header value reads the
run's environment, the one a command would get (pgcrond's own secrets are not
in it).

An attempt fails *transiently* on a connect error, a timeout, a 5xx, a 408 or
a 429 (the job's retry policy then claims the tick again, under the same key,
not before the ``Retry-After`` the server asked for), and *permanently* on any
other status outside ``expect``. The log shows method, URL (credentials and
query values removed), status and duration, and the request's headers with
every secret-looking value (by name) and every ``${VAR}``-filled one redacted.

Header secrets never leave through an error's text either: the values of
secret-looking headers and every ``${VAR}`` value are scrubbed from the error
an attempt ends with (logged, stored in the lease row, shown by ``status`` and
the status page, sent to ``on_failure``), as written and as a message would
quote them (``b'Bearer …\\n'``). A ``${VAR}`` value loses one trailing
newline (``\\n`` or ``\\r\\n``: a Secret written with ``echo``); a value that
still holds a character a header cannot carry fails the run, once, with an
error that names the header and the variable and never the value.
"""

from __future__ import annotations

import asyncio
import re
import time
from collections.abc import Collection, Mapping
from datetime import UTC, datetime, timedelta
from email.utils import parsedate_to_datetime
from typing import TYPE_CHECKING

from pgcrond.core.actions import HttpAction
from pgcrond.core.redaction import MIN_FRAGMENT, looks_secret, scrub
from pgcrond.run.attempt import Attempt, Ending, RunRequest
from pgcrond.run.output import HttpBody, http_response

if TYPE_CHECKING:
    import httpx


REDACTED = "***"
# Redacted by name, whatever the value.
SECRET_HEADERS = frozenset({"authorization", "proxy-authorization", "cookie", "set-cookie"})
TRANSIENT_STATUSES = frozenset({408, 429})
# A Retry-After further away than this is not waited for (the tick's retries
# would outlive any sensible schedule); the job's own delay applies then.
MAX_RETRY_AFTER = timedelta(hours=1)
_VARIABLE = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)\}")
# `echo "$TOKEN" > secret` ends a value with one newline; more is not an accident.
_TRAILING_NEWLINE = re.compile(r"\r?\n\Z")
# What a header value may not hold (RFC 9110 field-value, as h11 enforces it,
# ASCII only as httpx encodes it): C0 controls but tab, DEL, and non-ASCII.
_UNCARRIABLE = re.compile(r"[\x00-\x08\x0a-\x1f\x7f]|[^\x00-\x7f]")


class _Unset(ValueError):
    """A ``${VAR}`` in a header is not set in the run's environment."""


class HeaderValueRefused(ValueError):
    """A header value holds what no header can carry; the message never quotes it."""


def is_secret_header(name: str) -> bool:
    return name.lower() in SECRET_HEADERS or looks_secret(name)


def redact_headers(
    headers: Mapping[str, str], keep: tuple[str, ...] = (), also: Collection[str] = ()
) -> dict[str, str]:
    """``headers`` fit for a log: secret-looking values (by name) replaced by ``***``.

    ``keep`` names headers shown as they are (the idempotency key and fencing
    token, which are logged with every run anyway); ``also`` names more to
    hide (those filled from ``${VAR}``s).
    """
    kept = {name.lower() for name in keep}
    hidden = {name.lower() for name in also}
    shown = {}
    for name, value in headers.items():
        lower = name.lower()
        secret = is_secret_header(name) or lower in hidden
        shown[name] = REDACTED if secret and lower not in kept else value
    return shown


def header_secrets(action: HttpAction, environ: Mapping[str, str]) -> list[str]:
    """What an error's text must never show: every ``${VAR}`` value, secret-looking headers'."""
    secrets: list[str] = []
    for name, template in action.headers.items():
        secret = is_secret_header(name)
        values = [environ[var] for var in _VARIABLE.findall(template) if var in environ]
        # A value this short in an ordinary header is a count or a flag, and
        # masking it would mask the status code ("5**").
        secrets += [value for value in values if secret or len(value.strip()) >= MIN_FRAGMENT]
        if secret:
            secrets.append(_VARIABLE.sub(lambda m: environ.get(m.group(1), ""), template))
    return secrets


def retry_after(response: httpx.Response, now: datetime | None = None) -> timedelta | None:
    """A response's ``Retry-After`` (seconds or an HTTP date), capped; None if absent or bad."""
    value = response.headers.get("retry-after")
    if value is None:
        return None
    value = value.strip()
    delay: timedelta
    if value.isdigit():
        delay = timedelta(seconds=int(value))
    else:
        try:
            moment = parsedate_to_datetime(value)
        except (TypeError, ValueError):
            return None
        if moment.tzinfo is None:
            moment = moment.replace(tzinfo=UTC)
        delay = max(moment - (now or datetime.now(UTC)), timedelta(0))
    return min(delay, MAX_RETRY_AFTER)


def request_headers(
    action: HttpAction, request: RunRequest, environ: Mapping[str, str]
) -> dict[str, str]:
    """The configured headers (``${VAR}``s read), the key, the fencing token, the trace."""

    headers = {name: _header_value(name, value, environ) for name, value in action.headers.items()}
    # Ours win: a configured header of the same name would describe another run.
    ours = {action.idempotency_header.lower(), action.fencing_header.lower()}
    headers = {name: value for name, value in headers.items() if name.lower() not in ours}
    headers[action.idempotency_header] = request.idempotency_key
    if request.fencing_token is not None:
        headers[action.fencing_header] = str(request.fencing_token)
    parent = environ.get("TRACEPARENT")
    if parent and not any(name.lower() == "traceparent" for name in headers):
        headers["traceparent"] = parent  # the run's trace goes on in the service called
    return headers


def _header_value(header: str, template: str, environ: Mapping[str, str]) -> str:
    """``template`` with its ``${VAR}``s read; raises without quoting any value."""

    def substitute(match: re.Match[str]) -> str:
        name = match.group(1)
        if name not in environ:
            raise _Unset(f"${{{name}}} is not set in the run's environment")
        value = _TRAILING_NEWLINE.sub("", environ[name], count=1)
        if found := _UNCARRIABLE.search(value):
            raise HeaderValueRefused(
                f"header {header}: the value from ${{{name}}} holds "
                f"{_character_kind(found.group())} (only one trailing newline is dropped); "
                "the value is not shown"
            )
        return value

    value = _VARIABLE.sub(substitute, template)
    if found := _UNCARRIABLE.search(value):
        raise HeaderValueRefused(
            f"header {header}: the value holds {_character_kind(found.group())}; "
            "the value is not shown"
        )
    if value != value.strip(" \t"):
        raise HeaderValueRefused(
            f"header {header}: the value begins or ends with a space or tab; the value is not shown"
        )
    return value


def _character_kind(character: str) -> str:
    return "a character outside ASCII" if ord(character) > 0x7F else "a control character"


async def run(action: HttpAction, attempt: Attempt) -> Ending:
    """The executor of ``http:``: one request, its status checked against ``expect``."""
    request, environ, watch, log = attempt.request, attempt.environ, attempt.watch, attempt.log

    try:
        headers = request_headers(action, request, environ)
    except (_Unset, HeaderValueRefused) as exc:
        # The environment the value came from will not change before a retry.
        return Ending("fail", f"http: {exc}", permanent=True)
    secrets = header_secrets(action, environ)
    attempt.output.hide(secrets)
    shown_url = action.shown_url
    log.debug(
        "http_request",
        method=action.method,
        url=shown_url,
        headers=redact_headers(
            headers,
            (action.idempotency_header, action.fencing_header),
            also=[name for name, value in action.headers.items() if _VARIABLE.search(value)],
        ),
    )
    started = time.monotonic()
    body = HttpBody(action.max_response)
    task = asyncio.ensure_future(_send(action, headers, body))
    attempt.started()
    stop = await watch.until_stop(task)
    if stop is not None:
        task.cancel()
        task.add_done_callback(lambda t: t.cancelled() or t.exception())
        return stop
    duration_ms = round((time.monotonic() - started) * 1000, 1)
    import httpx  # here, not at start: about 10 MiB a replica without http: jobs never needs

    try:
        response = task.result()
    except httpx.HTTPError as exc:
        # Connect errors, timeouts, a broken connection: the request may or may
        # not have arrived; the retry carries the same key. The text may quote
        # what was sent (h11 quotes a header value it refuses).
        error = scrub(f"http: {type(exc).__name__}: {exc}".strip().rstrip(":"), secrets)
        log.warning(
            "http_failed",
            method=action.method,
            url=shown_url,
            error=error,
            duration_ms=duration_ms,
        )
        return Ending("fail", error)
    status = response.status_code
    success = status in action.expect
    attempt.output.feed(
        "stdout",
        http_response(
            response.http_version,
            status,
            response.reason_phrase,
            redact_headers(response.headers).items(),
            body,
            secrets=secrets,
        ),
    )
    level = log.info if success else log.warning
    level(
        "http_response",
        method=action.method,
        url=shown_url,
        status=status,
        duration_ms=duration_ms,
        body_bytes=body.read,
        body_capped=body.capped,
    )
    if success:
        return Ending("success")
    # A server may quote what it refused in its reason phrase.
    error = scrub(f"http: {status} {response.reason_phrase}".rstrip(), secrets)
    if status >= 500 or status in TRANSIENT_STATUSES:
        return Ending("fail", error, retry_after=retry_after(response))
    return Ending("fail", f"{error} (not retried: not a transient status)", permanent=True)


async def _send(action: HttpAction, headers: dict[str, str], body: HttpBody) -> httpx.Response:
    """The request; its body streamed into ``body``, never held whole: a response of
    gigabytes from a broken or hostile endpoint costs the replica a chunk at a time,
    and no more than ``max_response`` of it is read."""
    import httpx  # see run

    timeout = action.timeout.total_seconds()
    # No redirects followed (a 3xx outside expect is a failure), no proxies or
    # credentials from the environment (trust_env=False).
    async with (
        httpx.AsyncClient(timeout=timeout, trust_env=False) as client,
        client.stream(
            action.method,
            action.url,
            headers=headers,
            content=None if action.body is None else action.body.encode("utf-8"),
        ) as response,
    ):
        async for chunk in response.aiter_bytes():
            if not body.feed(chunk):
                break  # the rest is not read: the connection is closed with the response
        return response
