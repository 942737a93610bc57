"""An attempt's output as its record keeps it: bounded, redacted, and shown safely.

Unit tier: the capture (pgcrond.run.output) fed as the runner and an
in-process entrypoint's writers feed it, without a process or a database.
"""

from __future__ import annotations

import json

from pgcrond.core import redaction
from pgcrond.core.output import StreamTail, shown
from pgcrond.run.output import (
    HEAD_BYTES,
    HTTP_BODY_BYTES,
    TAIL_BYTES,
    Capture,
    HttpBody,
    http_response,
)


def test_a_stream_that_fits_is_kept_whole_and_an_empty_one_stays_empty() -> None:
    capture = Capture()
    capture.feed("stdout", b"one\n")
    capture.feed("stdout", b"two\n")
    kept = capture.tail()
    assert StreamTail(b"one\ntwo\n") == kept.stdout
    assert StreamTail() == kept.stderr
    assert kept.stderr.empty


def test_a_hundred_megabytes_keep_the_first_2_kib_and_the_last_16_kib_and_count_the_rest() -> None:
    capture = Capture()
    chunk = bytes(range(256)) * 256  # 64 KiB, as the runner reads
    total = 0
    for _ in range(100 * 1024 * 1024 // len(chunk)):
        capture.feed("stderr", chunk)
        total += len(chunk)
    capture.feed("stderr", b"THE END\n")
    total += 8
    kept = capture.tail().stderr
    assert HEAD_BYTES == len(kept.head)
    assert TAIL_BYTES == len(kept.tail)
    assert chunk[:HEAD_BYTES] == kept.head
    assert kept.tail.endswith(b"THE END\n")
    assert total - HEAD_BYTES - TAIL_BYTES == kept.dropped
    assert f"[… {kept.dropped} bytes not kept …]" in kept.text()


def test_a_stream_just_over_the_bounds_is_cut_once_with_nothing_repeated() -> None:
    lines = [f"{n:07d}\n".encode() for n in range(3000)]
    capture = Capture()
    for line in lines:
        capture.feed("stdout", line)
    whole = b"".join(lines)
    kept = capture.tail().stdout
    assert whole[:HEAD_BYTES] == kept.head
    assert whole[-TAIL_BYTES:] == kept.tail
    assert len(whole) - HEAD_BYTES - TAIL_BYTES == kept.dropped


def test_database_passwords_and_the_jobs_secret_values_are_redacted_in_what_is_kept() -> None:
    redaction.remember("postgresql://app:s3cret-Pa55@db/jobs")
    capture = Capture(["tok-123456"])
    capture.feed("stdout", b"connecting to postgresql://app:s3cret-Pa55@db/jobs\n")
    capture.feed("stderr", b"Authorization: Bearer tok-123456\n")
    capture.hide(["late-secret"])
    capture.feed("stderr", b"then late-secret\n")
    kept = capture.tail()
    assert b"s3cret-Pa55" not in kept.stdout.head
    assert b"postgresql://app:***@db/jobs" in kept.stdout.head
    assert b"Bearer ***\nthen ***\n" == kept.stderr.head.split(b"Authorization: ")[1]


def test_a_secret_straddling_the_cut_to_the_tail_is_still_redacted() -> None:
    capture = Capture(["straddling-secret-value"])
    capture.feed("stdout", b"x" * (HEAD_BYTES + 100_000))
    # The last TAIL_BYTES begin inside the secret: its last 5 bytes ("value") are in them.
    capture.feed("stdout", b"straddling-secret-value" + b"y" * (TAIL_BYTES - 5))
    kept = capture.tail().stdout
    assert b"value" not in kept.tail
    assert b"x***y" in kept.tail


def test_a_secret_cut_at_the_end_of_the_kept_head_leaves_no_head_after_masking_shrank_it() -> None:
    """The head buffer is cut from the stream (2 KiB and slack); masking the secrets
    before shortens the text, so that cut falls inside the first 2 KiB kept."""
    long_secret, cut_secret = "first-secret-" + "a" * 87, "second-secret-value-0123456789"
    capture = Capture([long_secret, cut_secret])
    text = long_secret * 20 + "x" * 1060 + cut_secret + "y" * 100_000
    capture.feed("stdout", text.encode())
    head = capture.tail().stdout.head
    assert b"second-sec" not in head
    assert head.endswith(b"x***")


def test_invalid_utf8_nuls_and_terminal_escapes_are_shown_as_visible_escapes() -> None:
    written = b"ok\ttab\r\nred: \x1b[31mRED\x1b[0m nul:\x00 bad:\xff\xfe csi:\xc2\x9b bell:\x07\n"
    text = shown(written)
    expected = "ok\ttab\nred: \\x1b[31mRED\\x1b[0m nul:\\x00 bad:\\xff\\xfe csi:\\x9b bell:\\x07\n"
    assert expected == text
    assert not any(ord(c) < 32 and c not in "\n\t" for c in text)
    # JSON carries the same text, with nothing a terminal would act on.
    assert "\\u001b" not in json.dumps(text)
    assert "\\u202e" == shown("\u202eevil".encode())[:6]


def test_an_in_process_entrypoints_writers_log_each_line_and_keep_every_byte() -> None:
    told: list[tuple[str, bytes]] = []
    capture = Capture()
    out = capture.writer("stdout", lambda stream, line: told.append((stream, line)))
    err = capture.writer("stderr", lambda stream, line: told.append((stream, line)))
    print("first", file=out)
    out.write("half ")
    err.write("oops\n")
    out.write("line")
    assert [("stdout", b"first"), ("stderr", b"oops")] == told
    kept = capture.tail()
    assert [("stdout", b"first"), ("stderr", b"oops"), ("stdout", b"half line")] == told
    assert b"first\nhalf line" == kept.stdout.head
    assert b"oops\n" == kept.stderr.head


def streamed(data: bytes, limit: int = 1 << 20) -> HttpBody:
    body = HttpBody(limit)
    for start in range(0, len(data), 1000):
        if not body.feed(data[start : start + 1000]):
            break
    return body


def test_an_http_attempts_output_is_its_status_line_headers_and_the_first_kib_of_its_body() -> None:
    body = b"<html>" + b"z" * 5000
    record = http_response(
        "HTTP/1.1",
        503,
        "Service Unavailable",
        [("retry-after", "3"), ("set-cookie", "***")],
        streamed(body),
        secrets=[],
    )
    head, _, rest = record.partition(b"\n\n")
    assert b"HTTP/1.1 503 Service Unavailable\nretry-after: 3\nset-cookie: ***" == head
    assert rest.startswith(body[:HTTP_BODY_BYTES])
    assert rest.endswith(f"[… {len(body) - HTTP_BODY_BYTES} more bytes of body …]".encode())


def test_an_http_body_is_redacted_before_its_cut_and_read_no_further_than_its_limit() -> None:
    """A secret straddling the first KiB leaves no head; past max_response nothing is read."""
    secret = "body-secret-0123456789"
    data = b"a" * (HTTP_BODY_BYTES - 6) + secret.encode() + b"b" * 10_000
    body = streamed(data, limit=4000)
    record = http_response("HTTP/1.1", 200, "OK", [], body, secrets=[secret])
    _, _, rest = record.partition(b"\n\n")
    assert (4000, True) == (body.read, body.capped)
    assert b"body-s" not in rest
    assert rest.startswith(b"a" * (HTTP_BODY_BYTES - 6) + b"***bbb\n")
    assert rest.endswith("[… the rest not read: max_response is 4000 bytes …]".encode())
