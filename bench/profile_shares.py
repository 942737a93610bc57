"""Where a replica's samples went: a py-spy raw profile as shares of the loop's busy samples.

    .venv/bin/python -m bench.profile_shares FILE [--top 25]

FILE is what ``bench.side_by_side --profile`` or ``bench.scale --profile``
recorded (py-spy's raw format: one folded stack and its count per line). The
event loop's thread is the one whose stacks start at the process's main
module; its samples waiting in the selector are the idle ones. Every other
sample of it is busy, and each function's share is of those: inclusive (the
function or anything it called), counted once per sample however often the
function is on the stack. Other threads' samples are summed in one line.
"""

from __future__ import annotations

import argparse
import re
import sys
from collections import Counter
from pathlib import Path

from bench.side_by_side import emit

# "name (path/to/file.py:123)": a frame, its line number dropped so that the
# calls of one function from several lines count together.
_LINE = re.compile(r":\d+\)$")
IDLE = "select (selectors.py"


def shares(lines: list[str], top: int) -> list[dict[str, str]]:
    busy: Counter[str] = Counter()
    loop_busy = idle = others = 0
    for line in lines:
        stack, _, count_text = line.rstrip().rpartition(" ")
        if not stack:
            continue
        count = int(count_text)
        frames = [_LINE.sub(")", frame) for frame in stack.split(";")]
        if frames[0].startswith("Thread._bootstrap") or frames[0].startswith("_bootstrap"):
            others += count
        elif IDLE in frames[-1]:
            idle += count
        else:
            loop_busy += count
            for frame in set(frames):
                busy[frame] += count
    rows = [
        {"where": "the loop's thread, busy", "samples": f"{loop_busy:,}", "share": "100.0 %"},
        {"where": "the loop's thread, in the selector", "samples": f"{idle:,}", "share": "-"},
        {"where": "other threads", "samples": f"{others:,}", "share": "-"},
    ]
    if not loop_busy:
        return rows
    rows += [
        {"where": frame, "samples": f"{count:,}", "share": f"{100 * count / loop_busy:.1f} %"}
        for frame, count in busy.most_common()
        # The frames every busy sample has (the module, main, the loop's run) say nothing.
        if count < loop_busy
    ][:top]
    return rows


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("profile", type=Path, help="a py-spy raw profile")
    parser.add_argument("--top", type=int, default=25, help="how many functions to list")
    args = parser.parse_args()
    lines = args.profile.read_text(errors="replace").splitlines()
    emit(shares(lines, args.top), ["where", "samples", "share"])
    return 0


if __name__ == "__main__":
    sys.exit(main())
