"""An ``sql:`` job's text -> statements with bound parameters (pure, no driver).

A job writes its run's values as ``:name`` placeholders::

    INSERT INTO invoices_runs (key, tick) VALUES (:idempotency_key, :fire_time);

Each becomes a psycopg placeholder with its type, ``(%(name)s::type)``, so the
value is always sent bound, never spliced into the text, and PostgreSQL never
has to guess a parameter's type. The text is scanned the way PostgreSQL's
lexer reads it, so nothing inside a string literal (``'…'``, ``E'…'``,
``$tag$…$tag$``), a quoted identifier (``"…"``) or a comment is touched, and a
cast (``::date``) is never read as a placeholder. ``%`` is doubled everywhere,
as psycopg requires once parameters are bound. A ``;`` outside those ends a
statement: a script is split into statements, each executed on its own (with
the extended protocol, which takes one statement per message).

Only the names in :data:`PARAMETERS` exist; any other ``:name`` is an error (an
array slice ``a[lo:hi]`` is written ``a[lo : hi]``). Transaction control and
session-scoped statements are refused: the script runs inside pgcrond's
transaction, which also records the run's SUCCESS, behind PgBouncer too.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

# Each run's values, and the type each is sent as.
PARAMETERS: dict[str, str] = {
    "idempotency_key": "text",
    "run_key": "text",
    "fire_time": "timestamptz",
    "attempt": "integer",
    "fencing_token": "bigint",
}

_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_DOLLAR_TAG = re.compile(r"\$([A-Za-z_][A-Za-z0-9_]*)?\$")
_FIRST_WORDS = re.compile(r"\s*([A-Za-z]+)(?:\s+([A-Za-z]+))?")
# Statements that would end, split or outlive pgcrond's transaction.
_REFUSED = {
    "begin": "transaction control",
    "start": "transaction control",
    "commit": "transaction control",
    "end": "transaction control",
    "abort": "transaction control",
    "prepare": "a prepared statement (session-scoped; breaks behind PgBouncer)",
    "execute": "a prepared statement (session-scoped; breaks behind PgBouncer)",
    "deallocate": "a prepared statement (session-scoped; breaks behind PgBouncer)",
    "discard": "session state",
    "reset": "session state",
    "listen": "session state",
    "unlisten": "session state",
    "vacuum": "a statement that cannot run inside a transaction",
}


@dataclass(frozen=True)
class SqlScript:
    """The statements of one ``sql:`` text, ready for psycopg, and the names they use."""

    statements: tuple[str, ...]
    parameters: frozenset[str]


def compile_script(text: str) -> SqlScript:
    """Translate and split ``text``; ``ValueError`` says what is wrong and where."""
    statements: list[str] = []
    used: set[str] = set()
    out: list[str] = []
    meaningful = False  # the current statement has more than blanks and comments
    i, n = 0, len(text)

    def finish() -> None:
        nonlocal out, meaningful
        if meaningful:
            statements.append("".join(out).strip())
        out, meaningful = [], False

    while i < n:
        ch = text[i]
        if ch == "-" and text.startswith("--", i):
            end = text.find("\n", i)
            end = n if end == -1 else end
            out.append(_percent(text[i:end]))
            i = end
            continue
        if ch == "/" and text.startswith("/*", i):
            end = _block_comment_end(text, i)
            out.append(_percent(text[i:end]))
            i = end
            continue
        meaningful = meaningful or not (ch.isspace() or ch == ";")
        if ch == "'":
            escaped = i > 0 and text[i - 1] in "eE" and not _in_word(text, i - 2)
            end = _quoted_end(text, i, "'", backslashes=escaped)
            out.append(_percent(text[i:end]))
            i = end
        elif ch == '"':
            end = _quoted_end(text, i, '"', backslashes=False)
            out.append(_percent(text[i:end]))
            i = end
        elif ch == "$" and (tag := _DOLLAR_TAG.match(text, i)) and not _in_word(text, i - 1):
            close = text.find(tag.group(0), tag.end())
            if close == -1:
                raise ValueError(f"unterminated dollar-quoted string {tag.group(0)}…")
            end = close + len(tag.group(0))
            out.append(_percent(text[i:end]))
            i = end
        elif ch == ":" and text.startswith("::", i):
            out.append("::")
            i += 2
        elif ch == ":" and (name := _NAME.match(text, i + 1)):
            key = name.group(0)
            if key not in PARAMETERS:
                raise ValueError(
                    f"unknown parameter :{key}; the parameters are "
                    + ", ".join(f":{p}" for p in PARAMETERS)
                    + " (write an array slice as a[lo : hi])"
                )
            used.add(key)
            out.append(f"(%({key})s::{PARAMETERS[key]})")
            i = name.end()
        elif ch == ";":
            finish()
            i += 1
        elif ch == "%":
            out.append("%%")
            i += 1
        else:
            out.append(ch)
            i += 1
    finish()
    if not statements:
        raise ValueError("has no statement")
    for number, statement in enumerate(statements, 1):
        problem = _refused(statement)
        if problem is not None:
            where = f"statement {number}" if len(statements) > 1 else "the statement"
            raise ValueError(
                f"{where} is {problem}: pgcrond runs the script in its own transaction"
            )
    return SqlScript(tuple(statements), frozenset(used))


def _in_word(text: str, index: int) -> bool:
    """Whether ``text[index]`` continues an identifier (so a quote there is not a new token)."""
    return 0 <= index < len(text) and (text[index].isalnum() or text[index] in "_$")


def _percent(chunk: str) -> str:
    return chunk.replace("%", "%%")


def _quoted_end(text: str, start: int, quote: str, *, backslashes: bool) -> int:
    i = start + 1
    while i < len(text):
        ch = text[i]
        if backslashes and ch == "\\":
            i += 2
            continue
        if ch == quote:
            if text.startswith(quote * 2, i):
                i += 2  # a doubled quote is one quote character
                continue
            return i + 1
        i += 1
    what = "string literal" if quote == "'" else "quoted identifier"
    raise ValueError(f"unterminated {what} starting {text[start:start + 20]!r}")


def _block_comment_end(text: str, start: int) -> int:
    depth, i = 0, start
    while i < len(text):
        if text.startswith("/*", i):
            depth += 1
            i += 2
        elif text.startswith("*/", i):
            depth -= 1
            i += 2
            if depth == 0:
                return i
        else:
            i += 1
    raise ValueError("unterminated /* comment")


def _refused(statement: str) -> str | None:
    words = _FIRST_WORDS.match(_strip_comments(statement))
    if words is None:
        return None
    first, second = words.group(1).lower(), (words.group(2) or "").lower()
    if first == "rollback" and second != "to":
        return "transaction control"
    if first == "set" and second not in ("local", "constraints", "transaction"):
        return "a session-wide SET (use SET LOCAL, which ends with the transaction)"
    if first == "set" and second == "local" and "role" in statement.lower().split()[2:3]:
        return "a role change (use the job's role: field)"
    return _REFUSED.get(first)


def _strip_comments(statement: str) -> str:
    # Only leading comments matter for the first words; literals never come first.
    while True:
        stripped = statement.lstrip()
        if stripped.startswith("--"):
            end = stripped.find("\n")
            statement = "" if end == -1 else stripped[end:]
        elif stripped.startswith("/*"):
            statement = stripped[_block_comment_end(stripped, 0) :]
        else:
            return stripped
