"""The wall-clock shim: shifted wall clock, untouched monotonic clock, no fork deadlock."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.faults.clockshift import ShimUnavailable, build, shifted

# Runs under the shim: reports its clocks, those of a subprocess it spawns,
# and those of a child forked while other threads keep reading the clock.
CHILD = r"""
import datetime, json, os, subprocess, sys, threading, time

stop = threading.Event()
def spin():
    while not stop.is_set():
        time.time(); time.monotonic(); datetime.datetime.now()
threads = [threading.Thread(target=spin, daemon=True) for _ in range(4)]
for t in threads:
    t.start()
report = {"wall": time.time(), "monotonic": time.monotonic(),
          "datetime": datetime.datetime.now(datetime.timezone.utc).timestamp()}
spawned = subprocess.run(
    [sys.executable, "-c", "import time, json; print(json.dumps([time.time(), time.monotonic()]))"],
    capture_output=True, text=True, check=True, timeout=20)
report["spawned"] = json.loads(spawned.stdout)
forks = []
for _ in range(20):
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(read)
        os.write(write, json.dumps(time.time()).encode())
        os._exit(0)
    os.close(write)
    forks.append(json.loads(os.read(read, 100)))
    os.close(read)
    os.waitpid(pid, 0)
report["forked"] = forks
stop.set()
print(json.dumps(report))
"""


# The fault suite's clock shim, compiled with cc: system tier.
pytestmark = pytest.mark.usefixtures("system_processes")


@pytest.fixture(scope="module")
def shim(tmp_path_factory: pytest.TempPathFactory) -> Path:
    try:
        return build(tmp_path_factory.mktemp("clockshift"))
    except ShimUnavailable as exc:
        pytest.fail(str(exc))


@pytest.mark.parametrize("shift_ms", [2000, -2000])
def test_wall_clock_shifted_monotonic_not_children_inherit(shim: Path, shift_ms: int) -> None:
    before_wall, before_mono = time.time(), time.monotonic()
    result = subprocess.run(
        [sys.executable, "-c", CHILD],
        env=shifted(os.environ, shim, shift_ms),
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    after_wall, after_mono = time.time(), time.monotonic()
    assert 0 == result.returncode, result.stderr
    report = json.loads(result.stdout)
    shift = shift_ms / 1000
    for wall in (report["wall"], report["datetime"], report["spawned"][0], *report["forked"]):
        assert before_wall + shift - 0.01 <= wall <= after_wall + shift + 0.01
    for mono in (report["monotonic"], report["spawned"][1]):
        assert before_mono <= mono <= after_mono


def test_no_shift_without_the_variable(shim: Path) -> None:
    env = shifted(os.environ, shim, 0)
    del env["PGCROND_CLOCK_SHIFT_MS"]
    before = time.time()
    out = subprocess.run(
        [sys.executable, "-c", "import time; print(time.time())"],
        env=env,
        capture_output=True,
        text=True,
        timeout=20,
        check=True,
    )
    assert before - 0.01 <= float(out.stdout) <= time.time() + 0.01
