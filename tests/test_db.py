"""Connection-level helpers: passwords never leave through messages."""

from __future__ import annotations

import psycopg
import pytest

from pgcrond.core.redaction import redact
from pgcrond.errors import DatabaseUnavailable
from pgcrond.storage.db import translate


@pytest.mark.parametrize(
    ("dsn", "expected"),
    [
        ("postgresql://app:s3cret@db:5432/x", "postgresql://app:***@db:5432/x"),
        ("postgres://app:p%40ss@db/x?sslmode=require", "postgres://app:***@db/x?sslmode=require"),
        ("host=db user=app password=s3cret dbname=x", "host=db user=app password=*** dbname=x"),
        ("host=db password='s3 cret' dbname=x", "host=db password=*** dbname=x"),
        ("postgresql://db/x?user=app&password=s3cret", "postgresql://db/x?user=app&password=***"),
        ("postgresql://app@db/x", "postgresql://app@db/x"),
    ],
)
def test_redact_hides_every_form_of_password(dsn: str, expected: str) -> None:
    assert expected == redact(dsn)


# A real libpq connection attempt (refused): the integration tier's.
@pytest.mark.usefixtures("pg_dsn")
def test_a_driver_error_quoting_the_dsn_is_redacted() -> None:
    with pytest.raises(psycopg.Error) as info:
        psycopg.connect("host=127.0.0.1 port=1 password=s3cret connect_timeout=1 user=x")
    translated = translate(info.value)
    assert isinstance(translated, DatabaseUnavailable)
    assert "s3cret" not in str(translated)
    bad = psycopg.ProgrammingError("invalid dsn: 'postgresql://app:s3cret@db/x' is wrong")
    assert "s3cret" not in str(translate(bad))


@pytest.mark.parametrize(
    "dsn",
    [
        "postgresql://u:p@ss@db/x",
        "postgresql://u:pa/ss@db/x",
        "postgresql://u:se#cret@db/x",
        "connection to 'postgresql://u:p@ss@db/x' failed",
    ],
)
def test_redact_hides_passwords_with_url_delimiters_in_them(dsn: str) -> None:
    redacted = redact(dsn)
    assert "***@" in redacted
    assert not any(part in redacted for part in ("p@ss", "pa/ss", "se#cret"))
