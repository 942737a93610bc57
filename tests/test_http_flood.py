"""A flood of idle connections against a real replica under RLIMIT_NOFILE 1024, on loopback.

2,000 connections that send nothing are opened at once and held for 20 s
(the server closes most of them to stay within ``http.max_connections``)
while a job runs every second: no run fails, and ``/healthz`` answers 200
throughout, but for at most one probe caught in the opening burst. The
figures are printed (``-s``) for the operations guide.
"""

from __future__ import annotations

import asyncio
import contextlib
import re
import statistics
import time
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from pgcrond.config.models import HttpLimits
from tests.helpers.daemon_harness import Replica, cluster, config

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("system_processes")]

FLOOD = 2000
FLOOD_S = 20.0
NOFILE = 1024
PROBE_EVERY_S = 0.25
# A probe slower than this is a probe a kubelet (1 s timeout by default) fails.
PROBE_TIMEOUT_S = 1.0


@dataclass
class Flood:
    opened: int = 0
    closed_by_server: int = 0
    # The most sockets the daemon held at once (sampled from /proc), and at the end.
    most_sockets: int = 0
    last_sockets: int = 0
    refused: int = 0
    probes: list[float] = field(default_factory=list)
    # (seconds into the flood, what came back)
    failed_probes: list[tuple[float, str]] = field(default_factory=list)


async def hold(port: int, until: float, flood: Flood) -> None:
    """One idle connection, held until ``until`` or until the server closes it."""
    loop = asyncio.get_running_loop()
    try:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
    except OSError:
        flood.refused += 1
        return
    flood.opened += 1
    try:
        async with asyncio.timeout(max(0.0, until - loop.time())):
            await reader.read()
        flood.closed_by_server += 1
    except TimeoutError:
        pass
    except OSError:
        flood.closed_by_server += 1
    finally:
        writer.close()


async def probe(port: int, until: float, flood: Flood) -> None:
    loop = asyncio.get_running_loop()
    began = loop.time()
    while loop.time() < until:
        started = loop.time()
        try:
            async with asyncio.timeout(PROBE_TIMEOUT_S):
                reader, writer = await asyncio.open_connection("127.0.0.1", port)
                writer.write(b"GET /healthz HTTP/1.1\r\nHost: t\r\nConnection: close\r\n\r\n")
                answer = await reader.read()
                writer.close()
            status = answer.split(b"\r\n", 1)[0]
            if b" 200 " not in status:
                flood.failed_probes.append((started - began, status.decode(errors="replace")))
            else:
                flood.probes.append(loop.time() - started)
        except (TimeoutError, OSError) as exc:
            flood.failed_probes.append((started - began, type(exc).__name__))
        await asyncio.sleep(PROBE_EVERY_S)


def sockets_of(pid: int) -> int:
    fds = Path(f"/proc/{pid}/fd")
    held = 0
    for fd in fds.iterdir():
        with contextlib.suppress(OSError):  # closed while being read
            held += fd.readlink().name.startswith("socket:")
    return held


async def count_sockets(pid: int, until: float, flood: Flood) -> None:
    loop = asyncio.get_running_loop()
    while loop.time() < until:
        flood.last_sockets = sockets_of(pid)
        flood.most_sockets = max(flood.most_sockets, flood.last_sockets)
        await asyncio.sleep(0.2)


async def flood_for(port: int, pid: int) -> Flood:
    flood = Flood()
    until = asyncio.get_running_loop().time() + FLOOD_S
    await asyncio.gather(
        probe(port, until, flood),
        count_sockets(pid, until, flood),
        *(hold(port, until, flood) for _ in range(FLOOD)),
    )
    return flood


def test_two_thousand_idle_connections_fail_no_run_and_keep_out_no_probe(
    pg_dsn: str, schema: str, tmp_path: Path
) -> None:
    jobs = "  every-second:\n    cron: '* * * * * *'\n    command: ['/bin/true']\n"
    with cluster(pg_dsn, schema, tmp_path) as running:
        path = running.write_config(config(schema, jobs))
        replica = Replica("replica-0", path, tmp_path / "replica.log", running.env(), nofile=NOFILE)
        replica.start()
        running.replicas.append(replica)
        port = int(replica.http_address().rsplit(":", 1)[1])
        limits = Path(f"/proc/{replica.pid}/limits").read_text()
        assert re.search(rf"Max open files\s+{NOFILE}\s+{NOFILE}", limits), limits
        replica.wait_event("run_finished", timeout=30)
        started = time.time()
        flood = asyncio.run(flood_for(port, replica.pid))
        took = time.time() - started
        # The flood is over: the runs of its seconds have finished.
        time.sleep(2)
        rows = running.rows(
            "SELECT status, count(*) AS n FROM {leases} "
            "WHERE code = 'every-second' AND acquired_at >= to_timestamp(%s) "
            "AND acquired_at < to_timestamp(%s) GROUP BY status",
            started,
            started + took,
        )
        errors = [e for e in replica.events() if e.get("level") in ("error", "critical")]
    outcomes = {row["status"]: row["n"] for row in rows}
    probes = sorted(flood.probes)
    print(
        f"\nflood: {FLOOD} connections held {took:.1f}s under RLIMIT_NOFILE {NOFILE}: "
        f"{flood.opened} opened, {flood.closed_by_server} seen closed, "
        f"{flood.refused} refused; daemon's sockets at most {flood.most_sockets}, "
        f"{flood.last_sockets} at the end; /healthz {len(probes)} answers 200, "
        f"{len(flood.failed_probes)} failed, median {statistics.median(probes) * 1000:.1f} ms, "
        f"max {probes[-1] * 1000:.1f} ms; runs {outcomes}"
    )
    # A probe that connects while the 2,000 arrive at once may be closed with
    # them before the server reads its request (the oldest silent connection
    # gives way): one at most, in the first second; none after.
    assert len(flood.failed_probes) <= 1, flood.failed_probes
    assert all(at < 1.0 for at, _ in flood.failed_probes), flood.failed_probes
    assert len(probes) >= FLOOD_S / (PROBE_EVERY_S + PROBE_TIMEOUT_S)
    assert {"SUCCESS"} == set(outcomes), outcomes
    # One a second: a tick is not lost to the flood either.
    assert outcomes["SUCCESS"] >= int(took) - 2
    assert [] == errors
    # The flood reached the limit: the server closed connections to admit others.
    # The descriptors the daemon holds stay bounded, whatever the client
    # believes is open (a connection the kernel completed but the server never
    # accepted looks open to the client and holds nothing of the daemon's):
    # max_connections admitted, plus accept bursts (asyncio accepts up to the
    # backlog in a loop turn) whose evicted connections close a loop turn
    # later: seen from 392 on an idle machine to 573 on a loaded one. What must
    # hold is room left under RLIMIT_NOFILE for the runs' pipes and the pool.
    assert flood.most_sockets <= NOFILE - HttpLimits().max_connections
