"""The loop-stall probe's own CPU: what timing each turn of the daemon's loop costs.

    .venv/bin/python -m bench.stall_probe [--turns 200000] [--rounds 5]

``--turns`` turns of an event loop (a task that yields to it each time, as
a busy replica's loop turns) on the daemon's loop, whose selector times each
turn for the probe (``pgcrond/daemon/stall.py``), with fires in flight the
whole time, and on asyncio's own loop; the figure is the difference in
process CPU per turn, best of ``--rounds`` each (the least disturbed on a
shared machine), alternating. The probe has no timer: a loop asleep costs
it nothing.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import time
from collections.abc import Callable

from pgcrond.daemon.stall import StallProbe


async def turning(turns: int) -> float:
    began = time.process_time()
    for _ in range(turns):
        await asyncio.sleep(0)
    return time.process_time() - began


def cpu(loop_factory: Callable[[], asyncio.AbstractEventLoop] | None, turns: int) -> float:
    with asyncio.Runner(loop_factory=loop_factory) as runner:
        return runner.run(turning(turns))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--turns", type=int, default=200_000)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    probe = StallProbe(lambda: True, lambda _: None)
    timed, plain = [], []
    for _ in range(args.rounds):
        timed.append(cpu(probe.new_loop, args.turns))
        plain.append(cpu(None, args.turns))
    print(
        json.dumps(
            {
                "turns": args.turns,
                "plain_loop_us_per_turn": round(min(plain) / args.turns * 1e6, 3),
                "timed_loop_us_per_turn": round(min(timed) / args.turns * 1e6, 3),
                "probe_us_per_turn": round((min(timed) - min(plain)) / args.turns * 1e6, 3),
            }
        )
    )


if __name__ == "__main__":
    main()
