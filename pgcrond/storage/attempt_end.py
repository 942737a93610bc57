"""What a finished attempt writes into its record: the closing columns of a finalize.

The lease store's finalize statement closes the attempt's record in the same
statement that records the tick's outcome (:mod:`pgcrond.storage.attempts`
reads the records back); this module turns a run's ending into those columns.
Its own module so that the lease store and the readers of the records each
import it, never each other.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from pgcrond.core.outcome import RunResult
from pgcrond.core.output import OutputTail


@dataclass(frozen=True)
class AttemptEnd:
    """What a finished attempt tells its record besides the outcome."""

    exit_code: int | None = None
    duration_s: float | None = None
    output: OutputTail = field(default_factory=OutputTail)

    @classmethod
    def of(cls, result: RunResult | None) -> AttemptEnd | None:
        if result is None:
            return None
        return cls(result.exit_code, result.duration_s, result.output)


def columns(end: AttemptEnd | None) -> dict[str, Any]:
    """One record's closing columns (``attempt_close``)."""
    output = OutputTail() if end is None else end.output
    return {
        "exit_code": None if end is None else end.exit_code,
        "duration_ms": None if end is None or end.duration_s is None else end.duration_s * 1000,
        "stdout_head": output.stdout.head,
        "stdout_tail": output.stdout.tail,
        "stdout_dropped": output.stdout.dropped,
        "stderr_head": output.stderr.head,
        "stderr_tail": output.stderr.tail,
        "stderr_dropped": output.stderr.dropped,
    }


def finalize_columns(ends: Sequence[AttemptEnd | None]) -> dict[str, list[Any]]:
    """The same columns as the finalize's arrays, one entry per outcome of its batch."""
    rows = [columns(end) for end in ends]
    arrays = {
        "exit_codes": "exit_code",
        "durations_ms": "duration_ms",
        "stdout_heads": "stdout_head",
        "stdout_tails": "stdout_tail",
        "stdout_dropped": "stdout_dropped",
        "stderr_heads": "stderr_head",
        "stderr_tails": "stderr_tail",
        "stderr_dropped": "stderr_dropped",
    }
    return {array: [row[name] for row in rows] for array, name in arrays.items()}
