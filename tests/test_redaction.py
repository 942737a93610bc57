"""Redaction reads a URL as libpq does, and no password fragment gets out.

libpq's own reading (``psycopg.conninfo.conninfo_to_dict`` calls
``PQconninfoParse``) is the reference the pure-Python splitter is held to.
"""

from __future__ import annotations

from pathlib import Path
from urllib.parse import unquote

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from psycopg import ProgrammingError
from psycopg.conninfo import conninfo_to_dict

from pgcrond.cli import main
from pgcrond.config.loader import load_config
from pgcrond.config.models import DatabaseConfig
from pgcrond.core import redaction
from pgcrond.core.redaction import redact, split_uri, url_problems
from pgcrond.errors import ConfigError, ExitCode

LEAKY = "postgresql://app:t-PW@x@127.0.0.1:5432/db"


def libpq(url: str) -> dict[str, str]:
    return {k: str(v) for k, v in conninfo_to_dict(url).items() if v is not None}


def ours(url: str) -> dict[str, str]:
    parts = split_uri(url)
    found = {
        "user": unquote(parts.user or ""),
        "password": unquote(parts.password or ""),
        "host": unquote(",".join(parts.hosts)),
        "port": ",".join(parts.ports),
        "dbname": unquote(parts.dbname or ""),
    }
    return {k: v for k, v in found.items() if v}


@pytest.mark.parametrize(
    "url",
    [
        LEAKY,
        "postgresql://u:pa/ss@db/x",
        "postgresql://u:p%40ss@db/x",
        "postgresql://a:b:c@h",
        "postgresql://u@h1:1,h2:2/db?sslmode=require",
        "postgresql://[::1]:5432/db",
        "postgres://u:se#cret@db/x",
        "postgresql://u:se?cret@db/x",
        "postgresql:///db",
    ],
)
def test_the_url_is_split_where_libpq_splits_it(url: str) -> None:
    expected = {
        k: v for k, v in libpq(url).items() if k in ("user", "password", "host", "port", "dbname")
    }
    assert expected == ours(url)


URL_TEXT = st.text(alphabet="ab1:@/?#%[],=", max_size=16)


@settings(max_examples=300, deadline=None)
@given(userinfo=URL_TEXT, rest=URL_TEXT)
def test_the_split_matches_libpq_on_random_urls(userinfo: str, rest: str) -> None:
    url = f"postgresql://{userinfo}@{rest}"
    try:
        expected = libpq(url)
    except UnicodeDecodeError:
        return  # libpq took it; psycopg cannot show the decoded bytes as text
    except ProgrammingError as exc:
        # libpq refuses it: pgcrond must refuse it too (parameter names are libpq's to judge).
        assert url_problems(url) or "invalid URI query parameter" in str(exc)
        return
    if not url_problems(url):
        keys = ("user", "password", "host", "dbname")
        assert {k: v for k, v in expected.items() if k in keys} == {
            k: v for k, v in ours(url).items() if k in keys
        }


def test_an_unescaped_at_in_the_password_is_refused_naming_file_line_and_field(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # libpq: password 't-PW', host 'x@127.0.0.1': the tail of the password becomes a host.
    assert "x@127.0.0.1" == libpq(LEAKY)["host"]
    path = tmp_path / "db.yaml"
    path.write_text(f'jobs:\n  a: {{once: true, command: [x]}}\ndatabase:\n  url: "{LEAKY}"\n')
    with pytest.raises(ConfigError) as raised:
        load_config([path], environ={})
    (issue,) = raised.value.issues
    assert (str(path), 4, "database.url") == (issue.file, issue.line, issue.field)
    assert "percent-encode each '@' in it as %40" in issue.message
    assert ExitCode.ERROR == main(["check", str(path)])
    output = capsys.readouterr()
    assert "%40" in output.err
    for fragment in ("t-PW", "x@127"):
        assert fragment not in output.out + output.err


@pytest.mark.parametrize("source", ["env", "flag", "interpolated"])
def test_an_unescaped_at_is_refused_wherever_the_url_comes_from(
    tmp_path: Path, source: str
) -> None:
    path = tmp_path / "db.yaml"
    url_line = '  url: "${DB}"\n' if source == "interpolated" else "  schema: pgcrond\n"
    path.write_text(f"database:\n{url_line}jobs:\n  a: {{once: true, command: [x]}}\n")
    environ = {"PGCROND_DATABASE_URL": LEAKY} if source == "env" else {"DB": LEAKY}
    with pytest.raises(ConfigError) as raised:
        load_config([path], environ=environ, database_url=LEAKY if source == "flag" else None)
    (issue,) = raised.value.issues
    assert "database.url" == issue.field
    assert "%40" in issue.message
    assert "t-PW" not in str(raised.value)
    expected_file = {"env": "PGCROND_DATABASE_URL", "flag": "--database-url"}.get(source, str(path))
    assert expected_file == issue.file


def test_a_correctly_encoded_password_is_accepted(tmp_path: Path) -> None:
    path = tmp_path / "db.yaml"
    path.write_text(
        'database: {url: "postgresql://app:t-PW%40x@127.0.0.1/db"}\n'
        "jobs:\n  a: {once: true, command: [x]}\n"
    )
    assert "t-PW@x" == libpq(load_config([path], environ={}).database.url or "")["password"]


@pytest.mark.parametrize(
    ("url", "problem"),
    [
        ("postgresql://u:pa/ss@db/x", "unescaped '/'"),
        ("postgresql://u:p%zz@db/x", "two hex digits"),
        ("postgresql://[::1/x", "no closing ']'"),
        ("postgresql://db:port/x", "a port is not a number"),
        ("mysql://u:p@db/x", "not a PostgreSQL URL"),
    ],
)
def test_urls_libpq_would_misread_or_refuse_are_refused_without_quoting_them(
    url: str, problem: str
) -> None:
    (message,) = url_problems(url)
    assert problem in message
    assert url not in message


def test_every_fragment_of_a_remembered_password_is_scrubbed_also_inside_a_host_name() -> None:
    DatabaseConfig(url=LEAKY)  # remembered, as the loader does for every config
    # What psycopg-pool logs for this URL: the tail of the password as a host name.
    warning = "error connecting in 'pool-1': failed to resolve host 'x@127.0.0.1': no address"
    assert "failed to resolve host '***@127.0.0.1'" in redact(warning)
    for text in (
        "password t-PW@x",
        "user app, t-PW",
        LEAKY,
        'invalid percent-encoded token: "t-PW"',
    ):
        redacted = redact(text)
        assert "t-PW" not in redacted, redacted


def test_a_host_name_holding_an_at_is_masked_even_for_an_unknown_url() -> None:
    assert "failed to resolve host '***@db'" == redact("failed to resolve host 'secret@db'")


def test_redaction_is_pure_and_core_does_not_import_psycopg() -> None:
    source = Path(redaction.__file__).read_text()
    assert "psycopg" not in source.split('"""', 2)[2]
