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
statement: a script is split into statements, each sent on its own with the
extended protocol, which takes one statement per message (so a text this
scanner splits differently from PostgreSQL is refused by the server, never run
as several statements).

Only the names in :data:`PARAMETERS` exist; any other ``:name`` is an error (an
array slice ``a[lo:hi]`` is written ``a[lo : hi]``). Transaction control and
session-scoped statements are refused: the script runs inside pgcrond's
transaction, which also records the run's SUCCESS, behind PgBouncer too. That
refusal is a lint that reads the text, best effort; what holds whatever the
text does is the runtime's (``pgcrond.storage.sqljob``).
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Literal

# Each run's values, and the type each is sent as.
PARAMETERS: dict[str, str] = {
    "idempotency_key": "text",
    "run_key": "text",
    "fire_time": "timestamptz",
    "attempt": "integer",
    "fencing_token": "bigint",
}

# PostgreSQL's lexer (scan.l): every character outside ASCII may start or
# continue an identifier or a dollar-quote tag, and `$` continues an identifier.
# "Outside ASCII" is written [^\x00-\x7f]: the same set as \x80-\U0010ffff in
# a class, which took re 25 ms to compile at every start of every process.
_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_IDENTIFIER = re.compile(r"(?:[A-Za-z_]|[^\x00-\x7f])(?:[A-Za-z0-9_$]|[^\x00-\x7f])*")
_DOLLAR_TAG = re.compile(r"\$((?:[A-Za-z_]|[^\x00-\x7f])(?:[A-Za-z0-9_]|[^\x00-\x7f])*)?\$")

_TRANSACTION_CONTROL = frozenset(
    ("begin", "start", "commit", "end", "abort", "rollback", "savepoint", "release")
)
# Statements that would outlive pgcrond's transaction, or cannot run in one.
_REFUSED = {
    "prepare": "a prepared statement (session-scoped; breaks behind PgBouncer)",
    "execute": "a prepared statement (session-scoped; breaks behind PgBouncer)",
    "deallocate": "a prepared statement (session-scoped; breaks behind PgBouncer)",
    "discard": "session state",
    "reset": "session state",
    "listen": "session state",
    "unlisten": "session state",
    "vacuum": "a statement that cannot run inside a transaction",
    "do": "a DO block (code this check cannot read: create a function and call it)",
}
# Settings that pgcrond sets for the job's transaction and checks after every
# statement: who the statements run as, and the server-side bounds that end a
# vanished replica's transaction (and its row lock) inside its lease.
_ROLE_SETTINGS = frozenset(("role", "session_authorization"))
_BOUNDS = frozenset(
    (
        "statement_timeout",
        "idle_in_transaction_session_timeout",
        "client_connection_check_interval",
        "transaction_timeout",
    )
)

TokenKind = Literal["word", "string", "identifier", "other"]


@dataclass(frozen=True)
class _Token:
    kind: TokenKind
    # word: lower-cased; string: its value; identifier: its name; other: the text.
    value: str


@dataclass
class _Statement:
    line: int = 0  # of its first token, in the text
    out: list[str] = field(default_factory=list)
    tokens: list[_Token] = field(default_factory=list)


@dataclass(frozen=True)
class SqlScript:
    """The statements of one ``sql:`` text, ready for psycopg, and the names they use."""

    statements: tuple[str, ...]
    parameters: frozenset[str]


def compile_script(text: str) -> SqlScript:
    """Translate and split ``text``; ``ValueError`` says what is wrong and where."""
    statements: list[_Statement] = []
    used: set[str] = set()
    current = _Statement()
    i, n = 0, len(text)

    def finish() -> None:
        nonlocal current
        if current.tokens:
            statements.append(current)
        current = _Statement()

    def token(kind: TokenKind, value: str, source: str) -> None:
        if not current.tokens:
            current.line = text.count("\n", 0, i) + 1
        current.tokens.append(_Token(kind, value))
        current.out.append(source)

    while i < n:
        ch = text[i]
        if ch == "-" and text.startswith("--", i):
            end = text.find("\n", i)
            end = n if end == -1 else end
            current.out.append(_percent(text[i:end]))
            i = end
        elif ch == "/" and text.startswith("/*", i):
            end = _block_comment_end(text, i)
            current.out.append(_percent(text[i:end]))
            i = end
        elif ch in " \t\n\r\f\v":
            current.out.append(ch)
            i += 1
        elif ch == "'":
            end = _quoted_end(text, i, "'", backslashes=False)
            token("string", text[i + 1 : end - 1].replace("''", "'"), _percent(text[i:end]))
            i = end
        elif ch == '"':
            end = _quoted_end(text, i, '"', backslashes=False)
            token("identifier", text[i + 1 : end - 1].replace('""', '"'), _percent(text[i:end]))
            i = end
        elif word := _IDENTIFIER.match(text, i):
            end = word.end()
            if word.group(0) in ("e", "E") and text.startswith("'", end):
                # E'…': backslash escapes, so \' does not end it.
                close = _quoted_end(text, end, "'", backslashes=True)
                token("string", text[end + 1 : close - 1], _percent(text[i:close]))
                i = close
            else:
                token("word", word.group(0).lower(), _percent(word.group(0)))
                i = end
        elif ch == "$" and (tag := _DOLLAR_TAG.match(text, i)):
            close = text.find(tag.group(0), tag.end())
            if close == -1:
                raise ValueError(f"unterminated dollar-quoted string {tag.group(0)}…")
            end = close + len(tag.group(0))
            token("string", text[tag.end() : close], _percent(text[i:end]))
            i = end
        elif ch == ":" and text.startswith("::", i):
            token("other", "::", "::")
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
            token("other", f":{key}", f"(%({key})s::{PARAMETERS[key]})")
            i = name.end()
        elif ch == ";":
            finish()
            i += 1
        else:
            token("other", ch, _percent(ch))
            i += 1
    finish()
    if not statements:
        raise ValueError("has no statement")
    for number, statement in enumerate(statements, 1):
        problem = _refused(statement.tokens)
        if problem is not None:
            where = f"statement {number}" if len(statements) > 1 else "the statement"
            line = f" (line {statement.line} of the sql text)" if "\n" in text.strip() else ""
            raise ValueError(
                f"{where} is {problem}{line}: pgcrond runs the script in its own transaction, "
                "which also records the run's SUCCESS"
            )
    return SqlScript(
        tuple("".join(s.out).strip() for s in statements),
        frozenset(used),
    )


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
    raise ValueError(f"unterminated {what} starting {text[start : start + 20]!r}")


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


def _refused(tokens: Sequence[_Token]) -> str | None:
    words = [t.value if t.kind == "word" else "" for t in tokens[:2]]
    first, second = words[0], (words[1:] or [""])[0]
    if first in _TRANSACTION_CONTROL or (first == "prepare" and second == "transaction"):
        return f"transaction control ({first.upper()})"
    if first == "set":
        return _set(tokens[1:])
    if first in _REFUSED:
        return _REFUSED[first]
    return _set_config_calls(tokens)


def _set(tokens: Sequence[_Token]) -> str | None:
    """``SET …``: only ``SET LOCAL`` of a setting pgcrond does not own, or ``SET CONSTRAINTS``."""
    if not tokens or tokens[0].kind != "word":
        return None
    scope = tokens[0].value
    if scope in ("constraints", "transaction"):
        return None
    if scope != "local":
        return "a session-wide SET (use SET LOCAL, which ends with the transaction)"
    if len(tokens) < 2:
        return None
    name = tokens[1].value.lower() if tokens[1].kind in ("word", "identifier") else ""
    if name == "session" and len(tokens) > 2 and tokens[2].value == "authorization":
        name = "session_authorization"
    return _guarded(name)


def _guarded(name: str) -> str | None:
    if name in _ROLE_SETTINGS:
        return "a role change (use the job's role: field)"
    if name in _BOUNDS:
        return f"a change of {name}, which pgcrond sets to bound the job (use its timeout:)"
    return None


def _set_config_calls(tokens: Sequence[_Token]) -> str | None:
    """``set_config(name, value, is_local)`` anywhere: a literal name, and ``true``."""
    for index, tok in enumerate(tokens):
        if tok.kind not in ("word", "identifier") or tok.value != "set_config":
            continue
        if index + 1 >= len(tokens) or tokens[index + 1].value != "(":
            continue  # a column or a name, not a call
        arguments = _arguments(tokens[index + 2 :])
        name = arguments[0] if arguments else []
        if not name or name[0].kind != "string" or (len(name) > 1 and name[1].value != "::"):
            return "set_config of a setting this check cannot read (write its name as a literal)"
        problem = _guarded(name[0].value.lower())
        if problem is not None:
            return problem
        local = arguments[2] if len(arguments) > 2 else []
        if [(t.kind, t.value) for t in local] != [("word", "true")]:
            return (
                "a session-wide set_config (its third argument must be true, so that the "
                "setting ends with the transaction)"
            )
    return None


def _arguments(tokens: Sequence[_Token]) -> list[list[_Token]]:
    """The comma-separated arguments up to the call's closing parenthesis."""
    arguments: list[list[_Token]] = [[]]
    depth = 0
    for tok in tokens:
        if tok.kind == "other" and tok.value in ("(", "["):
            depth += 1
        elif tok.kind == "other" and tok.value in (")", "]"):
            if depth == 0:
                break
            depth -= 1
        elif tok.kind == "other" and tok.value == "," and depth == 0:
            arguments.append([])
            continue
        arguments[-1].append(tok)
    return arguments
