"""Any byte sequence under ``/status`` answers 4xx (or the page).

The route parser is total: ``GET /status/page/²`` must not raise out of the
handler (``'²'.isdigit()`` is true, ``int('²')`` is not), which would answer
nothing and log an unhandled exception per request. A fuzz test drives it, and
the status page behind it, with arbitrary bytes, and a real daemon is sent raw
byte paths over real sockets.
"""

from __future__ import annotations

import asyncio
import random
import socket
from pathlib import Path

import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from pgcrond.config.loader import load_config
from pgcrond.daemon.page.routes import STYLESHEET, Route, route
from pgcrond.daemon.status_page import StatusPage
from tests.helpers.daemon_harness import cluster, config

# Starts replicas or servers: the system tier.
pytestmark = pytest.mark.usefixtures("system_processes")

JOBS = frozenset({"nightly", "a/b", "x.json", "x", "ünï"})


def as_served(raw: bytes) -> str:
    """The path as the HTTP layer hands it over: the request target's bytes read as latin-1."""
    return raw.decode("latin-1").split("?", 1)[0]


@settings(max_examples=3000, deadline=None)
@given(st.binary(max_size=300), st.sampled_from([b"", b"/status", b"/status/", b"/status/page/"]))
def test_the_route_parser_reads_any_bytes_without_raising(tail: bytes, head: bytes) -> None:
    found = route(as_served(head + tail), JOBS)
    assert found is None or isinstance(found, Route)
    if found is not None and found.view == "job":
        assert found.code in JOBS
    if found is not None:
        assert 0 <= found.page < 10**9


@settings(max_examples=1000, deadline=None)
@given(st.text(max_size=200))
def test_the_route_parser_reads_any_text_without_raising(tail: str) -> None:
    found = route("/status/" + tail, JOBS)
    assert found is None or isinstance(found, Route)


@pytest.mark.parametrize(
    ("path", "expected"),
    [
        ("/status", Route("overview")),
        ("/", Route("overview")),
        ("/status.json", Route("overview", as_json=True)),
        ("/status/page/2", Route("overview", page=2)),
        ("/status/page/3.json", Route("overview", as_json=True, page=3)),
        ("/status/running", Route("running")),
        ("/status/replicas.json", Route("replicas", as_json=True)),
        ("/status/jobs/nightly", Route("job", code="nightly")),
        ("/status/jobs/a%2Fb.json", Route("job", as_json=True, code="a/b")),
        # A code that itself ends in ".json": the longest match wins.
        ("/status/jobs/x.json", Route("job", code="x.json")),
        ("/status/jobs/x.json.json", Route("job", as_json=True, code="x.json")),
        ("/status/jobs/%C3%BCn%C3%AF", Route("job", code="ünï")),
        (STYLESHEET, Route("stylesheet")),
        ("/status/page/\xb2", None),  # superscript two: isdigit(), but not int()
        ("/status/page/\u0663", None),  # ARABIC-INDIC DIGIT THREE: int() takes it; a URL must not
        ("/status/page/" + "9" * 5000, None),  # past int()'s 4300-digit limit
        ("/status/page/", None),
        ("/status/page/-1", None),
        ("/status/jobs/nope", None),
        ("/status/jobs/%ff%fe", None),
        ("/status/nothing", None),
    ],
)
def test_routes_name_their_views(path: str, expected: Route | None) -> None:
    assert expected == route(path, JOBS)


@pytest.fixture(scope="module")
def page(tmp_path_factory: pytest.TempPathFactory) -> StatusPage:
    path = tmp_path_factory.mktemp("routes") / "jobs.yaml"
    nightly = {"cron": "0 3 * * *", "command": ["true"]}
    path.write_text(
        yaml.safe_dump(
            {"database": {"url": "postgresql://u@127.0.0.1/x"}, "jobs": {"nightly": nightly}}
        )
    )
    loaded = load_config([path])
    # No store: every view that would read the database answers 503.
    return StatusPage(config=lambda: loaded, store=lambda: None, replica="t:1")


@settings(max_examples=1000, deadline=None)
@given(st.binary(max_size=200))
def test_the_status_page_answers_any_bytes_with_a_status(page: StatusPage, tail: bytes) -> None:
    status, _, body = asyncio.run(page.answer(as_served(b"/status/" + tail), "*/*"))
    assert status in (200, 404, 503)
    assert body


# -- a real daemon, real sockets ------------------------------------------------------------

NASTY = [
    b"/status/page/\xb2",
    b"/status/page/\xb9.json",
    b"/status/page/" + b"9" * 5000,
    b"/status/page/\xd9\xa3",
    b"/status/\x00",
    b"/status/jobs/\x00nightly",
    b"/status/jobs/%00",
    b"/status/jobs/%ff%fe%",
    b"/status/jobs/%",
    b"/status/jobs/%zz",
    b"/status/jobs/\xff\xfe\xfd",
    b"/status/\x85",  # NEL: whitespace to str.split()
    b"/status/\xa0x",  # NO-BREAK SPACE: the same
    b"/status/\x1c\x1d\x1e\x1f",
    b"/status/\x7f",
    b"/status/jobs/" + b"%2F" * 2000,
    b"/status/../../etc/passwd",
    b"/status?page=\xb2",
    b"/status/" + b"a" * 200_000,  # past the request line limit
    b"/st\r\nGET /status/page/\xb2",  # a request line cut short, more bytes behind it
    b"\xb2",
    b"",
    b"*",
    b"http://x/status/page/\xb2",
]


def ask(port: int, raw_path: bytes) -> bytes:
    """Send ``GET <raw_path> HTTP/1.1`` and read the whole answer (the server closes).

    A reset connection is an answer too, a wrong one: it is returned as such.
    """
    chunks = []
    with socket.create_connection(("127.0.0.1", port), timeout=10) as conn:
        try:
            conn.sendall(
                b"GET " + raw_path + b" HTTP/1.1\r\nHost: t\r\nAccept: */*\r\n"
                b"Connection: close\r\n\r\n"
            )
            while chunk := conn.recv(65536):
                chunks.append(chunk)
        except ConnectionError as exc:
            return f"({type(exc).__name__} after {len(b''.join(chunks))} bytes)".encode()
    return b"".join(chunks)


@pytest.mark.slow
def test_a_real_daemon_answers_every_raw_byte_path_with_a_status_line(
    pg_dsn: str, schema: str, tmp_path: Path
) -> None:
    generator = random.Random(20)
    paths = NASTY + [
        b"/status/" + bytes(generator.randrange(256) for _ in range(generator.randrange(1, 60)))
        for _ in range(200)
    ]
    jobs = "  nightly: {cron: '0 3 * * *', command: ['true']}\n"
    with cluster(pg_dsn, schema, tmp_path) as running:
        (replica,) = running.start(running.write_config(config(schema, jobs)), 1)
        port = int(replica.http_address().rsplit(":", 1)[1])
        answers = {raw: ask(port, raw) for raw in paths}
        healthy = ask(port, b"/status/page/1")
    status_lines = {raw: answer.split(b"\r\n", 1)[0] for raw, answer in answers.items()}
    not_4xx = {
        raw[:80]: line
        for raw, line in status_lines.items()
        # aiohttp answers a request it cannot parse in HTTP/1.0, then closes.
        if not (line.startswith((b"HTTP/1.1 4", b"HTTP/1.0 4")) or line == b"HTTP/1.1 200 OK")
    }
    assert {} == not_4xx
    assert status_lines[b"/status/page/\xb2"].split()[1] in (b"400", b"404")
    assert healthy.startswith(b"HTTP/1.1 200 OK")
    # Nothing escaped the handler: asyncio logs such an exception at ERROR.
    assert [] == [e for e in replica.events() if e.get("level") in ("error", "critical")]
