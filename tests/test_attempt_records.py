"""What an attempt leaves behind, with real replicas: its record and its output tail.

Real ``pgcrond run`` replicas run real shell jobs against a real PostgreSQL;
what they left is read back the ways a person would: ``pgcrond logs``,
``pgcrond history``, the status page in headless Chromium, and the body of
the ``on_failure`` webhook.
"""

from __future__ import annotations

import json
import signal
import subprocess
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from pgcrond.daemon.page.routes import job_path
from pgcrond.run.output import HEAD_BYTES, TAIL_BYTES
from tests.helpers.browser import CHROMIUM, Browser
from tests.helpers.daemon_harness import PGCROND, Cluster, at, cluster, config, wait_until

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("system_processes")]

# The stderr line a failing job prints: a colour escape, markup, a byte that
# is not UTF-8, and the value of a secret-looking variable of its env.
NOISY = """\
  noisy:
    at: "{at}"
    shell: |
      printf 'out: first line\\n'
      printf 'err: \\033[31mred\\033[0m <b>bold</b> \\377 %s\\n' "$API_TOKEN" >&2
      printf 'out: last line\\n'
      exit 3
    env: {{API_TOKEN: "tok-abcdef123"}}
    on_failure:
      webhook: {url}
      timeout: 5s
"""
NOISY_STDOUT = "out: first line\nout: last line\n"
# As every view shows it: the escape and the stray byte made visible, the secret masked.
NOISY_STDERR = "err: \\x1b[31mred\\x1b[0m <b>bold</b> \\xff ***\n"


class Receiver:
    """A webhook receiver: records every JSON body it is posted."""

    def __init__(self) -> None:
        self.bodies: list[dict[str, Any]] = []
        bodies = self.bodies

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                length = int(self.headers.get("Content-Length", "0"))
                bodies.append(json.loads(self.rfile.read(length)))
                self.send_response(200)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *args: object) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/hook"


@contextmanager
def receiving() -> Iterator[Receiver]:
    receiver = Receiver()
    thread = threading.Thread(target=receiver.server.serve_forever, daemon=True)
    thread.start()
    try:
        yield receiver
    finally:
        receiver.server.shutdown()


def cli(running: Cluster, *args: str) -> subprocess.CompletedProcess[str]:
    """The real CLI against the cluster's database and config."""
    return subprocess.run(
        [str(PGCROND), *args, "-c", str(running.config_path)],
        capture_output=True,
        text=True,
        timeout=60,
        env=running.env(),
        check=False,
    )


def attempts(running: Cluster, code: str) -> list[dict[str, Any]]:
    return running.rows(
        f'SELECT a.*, l.run_key FROM "{running.schema}".leases_attempts a '
        f'JOIN "{running.schema}".leases l ON l.id = a.lease_id '
        "WHERE l.code = %s ORDER BY a.fencing_token",
        code,
    )


def test_a_failing_jobs_output_on_both_streams_is_shown_by_logs_history_the_page_and_the_hook(
    pg_dsn: str, schema: str, tmp_path: Path
) -> None:
    with receiving() as receiver, cluster(pg_dsn, schema, tmp_path) as running:
        path = running.write_config(config(schema, NOISY.format(at=at(3), url=receiver.url)))
        (replica,) = running.start(path, 1)
        wait_until(lambda: receiver.bodies, 30, "the on_failure webhook")
        logs = cli(running, "logs", "noisy")
        logs_json = cli(running, "logs", "noisy", "--json")
        history = cli(running, "history", "--job", "noisy")
        history_json = cli(running, "history", "--job", "noisy", "--json")
        page = _page(replica.http_address(), tmp_path) if CHROMIUM is not None else None

    (hook,) = receiver.bodies
    assert (3, "exit status 3") == (hook["exit_code"], hook["error"])
    assert {"text": NOISY_STDOUT, "dropped_bytes": 0} == hook["output"]["stdout"]
    assert {"text": NOISY_STDERR, "dropped_bytes": 0} == hook["output"]["stderr"]

    assert 0 == logs.returncode, logs.stderr
    assert "\x1b" not in logs.stdout and "tok-abcdef123" not in logs.stdout
    # The failing stream first.
    assert logs.stdout.index("--- stderr") < logs.stdout.index("--- stdout")
    assert NOISY_STDERR.rstrip("\n") in logs.stdout
    assert NOISY_STDOUT.rstrip("\n") in logs.stdout
    assert "attempt 1 on " in logs.stdout and "FAIL: exit status 3" in logs.stdout
    entry = json.loads(logs_json.stdout)
    assert ("fail", 3, 1) == (entry["status"], entry["exit_code"], entry["attempt"])
    assert NOISY_STDERR == entry["output"]["stderr"]["text"]

    assert 0 == history.returncode, history.stderr
    # Under the failed tick, its attempt: how it ended and the last line it printed.
    assert "└ fail" in history.stdout and "exit 3" in history.stdout
    assert "exit status 3 › err: \\x1b[31mred" in history.stdout
    assert "\x1b" not in history.stdout
    [tick] = json.loads(history_json.stdout)
    [kept] = tick["attempts"]
    assert ("fail", 3, "exit status 3") == (kept["status"], kept["exit_code"], kept["error"])
    assert NOISY_STDERR == kept["output"]["stderr"]["text"]

    if page is None:
        pytest.skip("headless Chromium is not installed: the page was not checked")
    assert 200 == page["status"]
    # Collapsed by default, stderr (the failing stream) first.
    assert [["stream", "stderr"], ["stream", "stdout"]] == page["classes"]
    assert [False, False] == page["open"]
    # Escaped: the job's markup is text, not an element.
    assert 0 == page["injected"]
    assert [NOISY_STDERR.rstrip("\n"), NOISY_STDOUT.rstrip("\n")] == page["texts"]
    # Opened, the output is visible.
    assert page["height_open"] > 0


def _page(address: str, tmp_path: Path) -> dict[str, Any]:
    browser = Browser(tmp_path / "profile")
    try:
        status = browser.load(f"http://{address}{job_path('noisy')}")
        query = "[...document.querySelectorAll('.attempt details.stream')]"
        script = (
            "(() => { const d = QUERY; return {"
            "classes: d.map(e => [...e.classList]),"
            "open: d.map(e => e.open),"
            "injected: document.querySelectorAll('.attempt pre b').length,"
            "texts: d.map(e => e.querySelector('pre').textContent.replace(/\\n$/, '')) }; })()"
        )
        seen = browser.evaluate(script.replace("QUERY", query))
        browser.evaluate(f"{query}[0].querySelector('summary').click()")
        height = browser.evaluate(f"{query}[0].querySelector('pre').offsetHeight")
    finally:
        browser.close()
    return {"status": status, **seen, "height_open": height}


def test_a_job_writing_100_mb_keeps_a_bounded_record_and_the_daemons_memory_stays_bounded(
    pg_dsn: str, schema: str, tmp_path: Path
) -> None:
    total = 100_000_000
    jobs = (
        "  chatty:\n"
        f'    at: "{at(4)}"\n'
        f"    shell: yes 0123456789abcdef | head -c {total}; echo THE-END >&2\n"
    )
    with cluster(pg_dsn, schema, tmp_path) as running:
        (replica,) = running.start(running.write_config(config(schema, jobs)), 1)
        before = _memory(replica.pid)
        replica.wait_event("run_finished", timeout=60)
        after = _memory(replica.pid)
        [record] = attempts(running, "chatty")
    grew_kib = after["VmHWM"] - before["VmRSS"]
    print(f"daemon RSS before {before['VmRSS']} KiB, peak after 100 MB of output "
          f"{after['VmHWM']} KiB (+{grew_kib} KiB)")  # fmt: skip
    assert "success" == record["status"]
    assert (HEAD_BYTES, TAIL_BYTES) == (len(record["stdout_head"]), len(record["stdout_tail"]))
    assert total - HEAD_BYTES - TAIL_BYTES == record["stdout_dropped"]
    assert b"THE-END\n" == bytes(record["stderr_head"])
    # The pipe is read in 64 KiB chunks and never held: the peak grows by far
    # less than the output (the log's own 1 MiB cap and a few buffers).
    assert grew_kib < 32 * 1024, f"the daemon's peak RSS grew by {grew_kib} KiB"


def _memory(pid: int) -> dict[str, int]:
    fields = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        name, _, value = line.partition(":")
        if name in ("VmRSS", "VmHWM"):
            fields[name] = int(value.split()[0])
    return fields


def test_a_replica_killed_mid_attempt_leaves_a_lost_record_and_the_takeover_keeps_its_own(
    pg_dsn: str, schema: str, tmp_path: Path
) -> None:
    jobs = (
        "  long:\n"
        f'    at: "{at(4)}"\n'
        "    lease: 2s\n"
        "    heartbeat: 500ms\n"
        "    shell: |\n"
        '      echo "attempt $PGCRON_ATTEMPT started"\n'
        '      if [ "$PGCRON_ATTEMPT" -lt 2 ]; then sleep 60; fi\n'
        '      echo "attempt $PGCRON_ATTEMPT done" >&2\n'
    )
    with cluster(pg_dsn, schema, tmp_path) as running:
        running.start(running.write_config(config(schema, jobs)), 2)
        started = wait_until(
            lambda: next(((r, e) for r in running.replicas for e in r.events("run_started")), None),
            30,
            "the first attempt to start",
        )
        victim, first = started
        victim.signal(signal.SIGKILL)
        survivor = next(r for r in running.replicas if r is not victim)
        finished = survivor.wait_event("run_finished", timeout=30)
        lost, taken = attempts(running, "long")
    assert 2 == finished["attempt"]
    assert (1, "lost", first["replica"]) == (lost["attempt"], lost["status"], lost["replica"])
    assert f"{taken['replica']} took the tick over (attempt 2)" in lost["error"]
    assert lost["finished_at"] is not None
    assert (2, "success") == (taken["attempt"], taken["status"])
    assert taken["replica"] != lost["replica"]
    assert b"attempt 2 started\n" == bytes(taken["stdout_head"])
    assert b"attempt 2 done\n" == bytes(taken["stderr_head"])
