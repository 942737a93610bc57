"""The named queries' binding rules, read from the SQL file (no database)."""

from __future__ import annotations

import re

from pgcrond.storage.sql import named_queries

_PLACEHOLDER = re.compile(r"%\((\w+)\)([sb])")
_TEXT_ARRAY = re.compile(r"%\((\w+)\)s::[\w ]+\[\]")


def test_every_array_parameter_is_bound_in_binary() -> None:
    # Text-format arrays cost six times as much on the client (queries.sql's header).
    in_text = {
        name: _TEXT_ARRAY.findall(text)
        for name, text in named_queries().items()
        if _TEXT_ARRAY.search(text)
    }
    assert {} == in_text


def test_a_parameter_has_one_format_per_statement_comments_included() -> None:
    # psycopg refuses a statement whose placeholder for one name differs, even in a comment.
    mixed: dict[str, list[str]] = {}
    for name, text in named_queries().items():
        formats: dict[str, set[str]] = {}
        for parameter, form in _PLACEHOLDER.findall(text):
            formats.setdefault(parameter, set()).add(form)
        if clashing := sorted(p for p, forms in formats.items() if len(forms) > 1):
            mixed[name] = clashing
    assert {} == mixed
