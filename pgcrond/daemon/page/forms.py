"""What a job's form POST may hold, read back bounded (the forms: templates/actions.html)."""

from __future__ import annotations

from urllib.parse import parse_qsl

from pgcrond.daemon.exchange import Request

MAX_REASON = 500
# The form fields a POST may carry; more is not a form of this page.
MAX_FIELDS = 4


def read_form(request: Request) -> dict[str, str] | None:
    """The fields of a form POST, or None when the body is not a small urlencoded form."""
    content_type = request.header("content-type").split(";", 1)[0].strip().lower()
    if content_type != "application/x-www-form-urlencoded":
        return None
    try:
        pairs = parse_qsl(
            request.body.decode("utf-8"),
            keep_blank_values=True,
            strict_parsing=bool(request.body),
            max_num_fields=MAX_FIELDS,
        )
    except (UnicodeDecodeError, ValueError):
        return None
    return dict(pairs)
