"""An attempt's output as its record keeps it, and how kept text is shown safely.

Per stream the record keeps a head and a tail, already bounded and redacted
(:mod:`pgcrond.run.output` captures them), and how many bytes between them
were not kept. Output is bytes, kept as bytes; what a person or a program is
shown goes through :func:`shown`, which makes invalid UTF-8, NULs, terminal
escape sequences and other control characters visible as escapes, so the same
text is safe in a terminal, in JSON and (escaped as usual) in HTML.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

from pgcrond.core.actions import OutputStream

# Shown as escapes: C0 controls but tab and newline (ESC starts a terminal
# sequence, CR overwrites a line), DEL, C1 controls (a terminal reads 0x9b as
# CSI), and the Unicode format characters that reorder or hide text.
_UNSAFE = re.compile(
    "[\x00-\x08\x0b-\x1f\x7f-\x9f\u061c\u200b-\u200f\u2028-\u202e\u2066-\u2069\ufeff]"
)


@dataclass(frozen=True)
class StreamTail:
    """One stream as kept: its head, its tail, and how many bytes between them were dropped.

    A stream that fit whole is all ``head`` (``tail`` empty, ``dropped`` 0).
    """

    head: bytes = b""
    tail: bytes = b""
    dropped: int = 0

    @property
    def empty(self) -> bool:
        return not (self.head or self.tail)

    def text(self) -> str:
        """The kept bytes as safe text, with a line saying where and how much was dropped."""
        if not self.dropped:
            return shown(self.head + self.tail)
        return f"{shown(self.head)}\n[… {self.dropped} bytes not kept …]\n{shown(self.tail)}"

    def as_json(self) -> dict[str, Any]:
        return {"text": self.text(), "dropped_bytes": self.dropped}


@dataclass(frozen=True)
class OutputTail:
    """What an attempt's output record keeps: both streams, bounded and redacted."""

    stdout: StreamTail = field(default_factory=StreamTail)
    stderr: StreamTail = field(default_factory=StreamTail)

    def streams(self, failing_first: bool = False) -> list[tuple[OutputStream, StreamTail]]:
        """The streams in the order to show them: stderr first for a failed attempt."""
        pairs: list[tuple[OutputStream, StreamTail]] = [
            ("stdout", self.stdout),
            ("stderr", self.stderr),
        ]
        return pairs[::-1] if failing_first else pairs

    def as_json(self) -> dict[str, Any]:
        return {name: stream.as_json() for name, stream in self.streams()}


def shown(data: bytes) -> str:
    """``data`` as text that is safe anywhere: invalid bytes and control characters escaped.

    Tabs and newlines stay (a CR before a newline is dropped); everything else
    that could move a terminal's cursor, recolour it, hide text or reorder it
    is written as ``\\xNN`` / ``\\uNNNN``, and bytes that are not UTF-8 as
    ``\\xNN``, so what is shown is what the job wrote, visibly.
    """
    return safe(data.decode("utf-8", "backslashreplace").replace("\r\n", "\n"))


def safe(text: str) -> str:
    """``text`` with every character :func:`shown` escapes escaped (an error message, a name)."""
    return _UNSAFE.sub(_escape, text)


def _escape(match: re.Match[str]) -> str:
    code = ord(match.group())
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}"
