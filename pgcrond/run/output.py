"""Capturing an attempt's output: the head and tail of each stream, redacted.

Every byte a job writes still goes to the log stream as ``job_output`` lines
(the runner's caps apply there); this module keeps, beside that, what the
attempt record stores (:class:`~pgcrond.core.output.OutputTail`): per stream
the first :data:`HEAD_BYTES` and the last :data:`TAIL_BYTES`, and how many
bytes between them were not kept. Memory is bounded whatever the job writes (a
few dozen KiB per attempt), and a stream is never read twice.

Redaction reads output as UTF-8 with ``surrogateescape`` (lossless, so invalid
bytes survive it untouched).
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable

from pgcrond.core.actions import OutputStream
from pgcrond.core.output import OutputTail, StreamTail
from pgcrond.core.redaction import cut, redact, scrub

Stream = OutputStream
STREAMS: tuple[Stream, ...] = ("stdout", "stderr")
HEAD_BYTES = 2 * 1024
TAIL_BYTES = 16 * 1024
# Redaction reads this much past each cut, so that a secret straddling the
# cut is still recognised whole before the cut is made (a secret longer than
# this may show in part at the very edge of what is kept).
_SLACK = 1024

# An in-process entrypoint's line that never ends is told in pieces this long,
# so that a writer holds no more than this (the log cuts lines shorter still).
_PENDING_CAP = 64 * 1024

HTTP_BODY_BYTES = 1024

_SILENT = OutputTail()


def http_response(
    version: str,
    status: int,
    reason: str,
    headers: Iterable[tuple[str, str]],
    body: HttpBody,
    *,
    secrets: list[str],
) -> bytes:
    """An ``http:`` attempt's output: the status line, the headers (already redacted), the
    first KiB of the body, redacted before it is cut (and how much more there was)."""
    lines = [f"{version} {status} {reason}".rstrip()]
    lines += [f"{name}: {value}" for name, value in headers]
    kept = _cleaner(secrets)(bytes(body.head))
    if body.read > len(body.head) or len(kept) > HTTP_BODY_BYTES:
        kept = cut(kept, HTTP_BODY_BYTES, also=secrets)
    more = body.read - HTTP_BODY_BYTES
    note = f"\n[… {more} more bytes of body …]" if more > 0 else ""
    if body.capped:
        note += f"\n[… the rest not read: max_response is {body.limit} bytes …]"
    return ("\n".join(lines) + "\n\n").encode() + kept + note.encode()


class HttpBody:
    """A response body as it streams in: its head kept (with slack for redaction), the
    rest counted, and whether reading stopped at ``limit`` (``max_response``)."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.head = bytearray()
        self.read = 0
        self.capped = False

    def feed(self, chunk: bytes) -> bool:
        """Take ``chunk``; False once ``limit`` bytes were read (read no more)."""
        chunk = chunk[: self.limit - self.read]
        self.read += len(chunk)
        room = HTTP_BODY_BYTES + _SLACK - len(self.head)
        if room > 0:
            self.head += chunk[:room]
        if self.read >= self.limit:
            self.capped = True
        return not self.capped


class _Kept:
    """One stream's head and rolling tail, with slack on each cut for redaction."""

    def __init__(self) -> None:
        self.head = bytearray()
        self.tail = bytearray()
        self.total = 0

    def feed(self, data: bytes) -> None:
        self.total += len(data)
        room = HEAD_BYTES + _SLACK - len(self.head)
        if room > 0:
            self.head += data[:room]
            data = data[room:]
        if len(data) >= TAIL_BYTES + _SLACK:
            self.tail[:] = data[-(TAIL_BYTES + _SLACK) :]
            return
        self.tail += data
        extra = len(self.tail) - (TAIL_BYTES + _SLACK)
        if extra > 0:
            del self.tail[:extra]

    def kept(self, clean: Callable[[bytes], bytes], secrets: list[str]) -> StreamTail:
        dropped = max(0, self.total - HEAD_BYTES - TAIL_BYTES)
        # Redacted, then cut (what a cut leaves of a secret is masked too: the
        # buffers themselves are cut from the stream, with the slack).
        if self.total <= len(self.head) + len(self.tail):
            # Head and tail touch: redact them as one text, then cut.
            whole = clean(bytes(self.head + self.tail))
            if not dropped:
                return StreamTail(whole)
            head, tail = whole, whole
        else:
            head, tail = clean(bytes(self.head)), clean(bytes(self.tail))
        return StreamTail(
            cut(head, HEAD_BYTES, also=secrets),
            cut(tail, TAIL_BYTES, keep="tail", also=secrets),
            dropped,
        )


class Capture:
    """Collects one attempt's output as it is written; :meth:`tail` is what is stored.

    Fed from the loop (a child's pipes) or from a job's thread (an in-process
    entrypoint's writers), hence the lock.
    """

    def __init__(self, secrets: Iterable[str] = ()) -> None:
        self._streams = {name: _Kept() for name in STREAMS}
        self._secrets = [secret for secret in secrets if secret]
        self._writers: list[JobWriter] = []
        self._lock = threading.Lock()

    def hide(self, secrets: Iterable[str]) -> None:
        """Also scrub these values (an ``http:`` job's header secrets) from what is stored."""
        with self._lock:
            self._secrets.extend(secret for secret in secrets if secret)

    def feed(self, stream: Stream, data: bytes) -> None:
        with self._lock:
            self._streams[stream].feed(data)

    def writer(self, stream: Stream, line: Callable[[Stream, bytes], None]) -> JobWriter:
        """A text stream for an in-process entrypoint: kept here, and each line told to ``line``."""
        # The writer feeds this capture's stream under its lock, and holds
        # neither the capture nor a bound method of it: a capture that holds
        # its writers, each holding it, was a reference cycle per run.
        writer = JobWriter(self._streams[stream], self._lock, stream, line)
        self._writers.append(writer)
        return writer

    def tail(self) -> OutputTail:
        """The output so far, bounded and redacted (a writer's unfinished line is told first)."""
        for writer in self._writers:
            writer.flush()
        with self._lock:
            if not any(kept.total for kept in self._streams.values()):
                # Most runs print nothing: nothing to redact (a tenth of a
                # silent in-process run's cost at 10,000 co-firing jobs).
                return _SILENT
            secrets = list(self._secrets)
            stdout, stderr = (self._streams[name] for name in STREAMS)
            clean = _cleaner(secrets)
            return OutputTail(stdout.kept(clean, secrets), stderr.kept(clean, secrets))


def _cleaner(secrets: list[str]) -> Callable[[bytes], bytes]:
    def clean(data: bytes) -> bytes:
        text = data.decode("utf-8", "surrogateescape")
        text = scrub(redact(text), secrets) if secrets else redact(text)
        return text.encode("utf-8", "surrogateescape")

    return clean


class JobWriter:
    """``ctx.stdout`` / ``ctx.stderr`` of an in-process entrypoint (``print(file=…)`` works).

    What is written is kept in the attempt's output record and logged line by
    line as ``job_output``, as a command's output is.
    """

    def __init__(
        self,
        kept: _Kept,
        kept_lock: threading.Lock,
        stream: Stream,
        line: Callable[[Stream, bytes], None],
    ) -> None:
        self._kept = kept
        self._kept_lock = kept_lock
        self._stream: Stream = stream
        self._line = line
        self._pending = b""
        self._lock = threading.Lock()

    def write(self, text: str | bytes) -> int:
        data = text if isinstance(text, bytes) else text.encode("utf-8", "surrogateescape")
        with self._kept_lock:
            self._kept.feed(data)
        with self._lock:
            *lines, self._pending = (self._pending + data).split(b"\n")
            if len(self._pending) > _PENDING_CAP:
                lines.append(self._pending)
                self._pending = b""
        for line in lines:
            self._line(self._stream, line)
        return len(text)

    def writelines(self, lines: Iterable[str | bytes]) -> None:
        for text in lines:
            self.write(text)

    def flush(self) -> None:
        with self._lock:
            pending, self._pending = self._pending, b""
        if pending:
            self._line(self._stream, pending)
