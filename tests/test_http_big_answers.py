"""An ``http:`` job's answer is streamed, never held: a gigabyte costs a few MiB.

A real HTTP server (a child process) answers with a body of a gigabyte; the
job runs in this process, whose peak RSS (VmHWM, reset before the run) is
compared with its RSS before it.
"""

from __future__ import annotations

import gc
import subprocess
import sys
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path

import pytest

from pgcrond.core.actions import HttpAction
from pgcrond.core.cancel import Cancellation
from pgcrond.run.output import HTTP_BODY_BYTES
from pgcrond.run.runner import execute
from tests.jobs_fixture import make_request

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("subprocesses")]

GIGABYTE = 1 << 30
# Answers every connection with a 200 and SIZE bytes of body, a MiB per write.
SERVER = """
import socket, sys
size = int(sys.argv[1])
listener = socket.create_server(("127.0.0.1", 0))
print(listener.getsockname()[1], flush=True)
chunk = b"x" * (1 << 20)
while True:
    conn, _ = listener.accept()
    with conn:
        request = b""
        while b"\\r\\n\\r\\n" not in request:
            request += conn.recv(65536)
        conn.sendall(b"HTTP/1.1 200 OK\\r\\nContent-Length: %d\\r\\n\\r\\n" % size)
        try:
            for start in range(0, size, len(chunk)):
                conn.sendall(chunk[: size - start])
        except OSError:
            pass  # the client stopped reading (max_response)
"""


@pytest.fixture
def gigabyte_server() -> Iterator[str]:
    server = subprocess.Popen(
        [sys.executable, "-c", SERVER, str(GIGABYTE)], stdout=subprocess.PIPE, text=True
    )
    try:
        assert server.stdout is not None
        yield f"http://127.0.0.1:{server.stdout.readline().strip()}/"
    finally:
        server.kill()
        server.wait(10)


def memory(field: str) -> int:
    """This process's VmRSS or VmHWM (its peak), in bytes."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(f"{field}:"):
            return int(line.split()[1]) * 1024
    raise AssertionError(f"no {field} in /proc/self/status")


def peak_from_here() -> int:
    """VmHWM counts from here on; this process's RSS now."""
    gc.collect()
    Path("/proc/self/clear_refs").write_text("5")
    return memory("VmRSS")


async def run_against(url: str, **fields: object) -> tuple[str, bytes, int]:
    """The run's outcome, what its record keeps of stdout, and the peak RSS above baseline."""
    action = HttpAction(url=url, method="GET", timeout=timedelta(seconds=60), **fields)  # type: ignore[arg-type]
    request = make_request(action, timeout=timedelta(seconds=120))
    baseline = peak_from_here()
    result = await execute(request, Cancellation())
    return result.outcome, result.output.stdout.head, memory("VmHWM") - baseline


async def test_a_gigabyte_answer_is_read_in_a_few_mib_and_its_size_kept(
    gigabyte_server: str,
) -> None:
    await run_against(gigabyte_server, max_response=HTTP_BODY_BYTES)  # httpx imported, warm
    outcome, stdout, grown = await run_against(gigabyte_server, max_response=2 * GIGABYTE)
    print(f"\npeak RSS above baseline while reading 1 GiB: {grown / (1 << 20):.1f} MiB")
    assert "success" == outcome
    assert grown < 8 << 20
    assert stdout.endswith(f"[… {GIGABYTE - HTTP_BODY_BYTES} more bytes of body …]".encode())


async def test_no_more_than_max_response_of_an_answer_is_read(gigabyte_server: str) -> None:
    outcome, stdout, _ = await run_against(gigabyte_server)  # the default: 16 MiB
    assert "success" == outcome
    assert stdout.endswith(
        f"[… {(16 << 20) - HTTP_BODY_BYTES} more bytes of body …]\n"
        f"[… the rest not read: max_response is {16 << 20} bytes …]".encode()
    )
