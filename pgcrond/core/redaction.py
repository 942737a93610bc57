"""Passwords out of anything that may be logged or shown.

Kept apart from :mod:`pgcrond.storage.db` so that the config loader (``pgcrond
check``) can use it without importing the database driver.
"""

from __future__ import annotations

import re

# userinfo runs to the *last* "@" of the token: an unescaped "@", ":", "/" or
# "#" in a password must not let part of it through. Masking too much beats
# showing a secret.
_URL_PASSWORD = re.compile(r"([a-z][a-z0-9+.-]*://[^:/?#@\s]*:)\S*@", re.IGNORECASE)
_QUERY_PASSWORD = re.compile(r"([?&]password=)[^&\s]*", re.IGNORECASE)
_KV_PASSWORD = re.compile(r"(password\s*=\s*)('(?:[^'\\]|\\.)*'|\S+)", re.IGNORECASE)


def redact(text: str) -> str:
    """``text`` with every password of a connection URL or key=value DSN replaced by ``***``."""
    text = _URL_PASSWORD.sub(r"\1***@", text)
    text = _QUERY_PASSWORD.sub(r"\1***", text)
    return _KV_PASSWORD.sub(r"\1***", text)
