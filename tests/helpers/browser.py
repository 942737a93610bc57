"""Headless Chromium, driven over its DevTools pipe; a self-signed certificate to serve it HTTPS."""

from __future__ import annotations

import base64
import contextlib
import hashlib
import json
import os
import select
import shutil
import ssl
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

CHROMIUM = next(
    (found for name in ("chromium", "chromium-browser") if (found := shutil.which(name))), None
)


# Puts the pipe ends at fds 3 and 4, where --remote-debugging-pipe wants them, then
# becomes Chromium. Copies above 9 first: a pipe end may itself be fd 3 or 4.
PIPE_TRAMPOLINE = """
import fcntl, os, sys
ends = [fcntl.fcntl(int(fd), fcntl.F_DUPFD, 10) for fd in sys.argv[1:3]]
for wanted, end in zip((3, 4), ends):
    os.dup2(end, wanted)
os.execv(sys.argv[3], sys.argv[3:])
"""


class Browser:
    """Headless Chromium driven over ``--remote-debugging-pipe``: JSON messages, NUL-ended.

    Chromium reads commands on its fd 3 and writes answers and events on its fd 4;
    no WebSocket client is needed. One page (target), attached in flat mode.
    """

    def __init__(self, profile: Path, extra: tuple[str, ...] = ()) -> None:
        assert CHROMIUM is not None
        to_child, self._commands = os.pipe()
        self._answers, from_child = os.pipe()
        self.process = subprocess.Popen(
            [
                sys.executable,
                "-c",
                PIPE_TRAMPOLINE,
                str(to_child),
                str(from_child),
                CHROMIUM,
                "--headless",
                "--no-sandbox",
                "--disable-gpu",
                "--no-first-run",
                f"--user-data-dir={profile}",
                "--remote-debugging-pipe",
                *extra,
                "about:blank",
            ],
            pass_fds=(to_child, from_child),
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        os.close(to_child)
        os.close(from_child)
        self._buffer = b""
        self._next_id = 0
        self.events: list[dict[str, Any]] = []
        target = self.call("Target.createTarget", url="about:blank")["targetId"]
        self.session = self.call("Target.attachToTarget", targetId=target, flatten=True)[
            "sessionId"
        ]
        self.call("Page.enable", session=True)
        self.call("Network.enable", session=True)

    def call(self, method: str, *, session: bool = False, **params: Any) -> dict[str, Any]:
        """Send one command and await its answer (events meanwhile are kept)."""
        self._next_id += 1
        message: dict[str, Any] = {"id": self._next_id, "method": method, "params": params}
        if session:
            message["sessionId"] = self.session
        os.write(self._commands, json.dumps(message).encode() + b"\0")
        while True:
            received = self._receive(30, method)
            if received.get("id") == self._next_id:
                assert "error" not in received, (method, received["error"])
                result: dict[str, Any] = received["result"]
                return result
            self.events.append(received)

    def wait_for(self, event: str, timeout: float = 30) -> dict[str, Any]:
        """Await the next ``event`` of the page (kept ones first)."""
        for index, seen in enumerate(self.events):
            if seen.get("method") == event:
                return self.events.pop(index)
        while True:
            received = self._receive(timeout, event)
            if received.get("method") == event:
                return received
            self.events.append(received)

    def _receive(self, timeout: float, waiting_for: str) -> dict[str, Any]:
        deadline = time.monotonic() + timeout
        while b"\0" not in self._buffer:
            left = deadline - time.monotonic()
            ready, _, _ = select.select([self._answers], [], [], max(0.0, left))
            if not ready:
                raise AssertionError(f"Chromium sent nothing for {timeout}s: {waiting_for}")
            chunk = os.read(self._answers, 1 << 20)
            assert chunk, f"Chromium closed its pipe while we waited for {waiting_for}"
            self._buffer += chunk
        message, _, self._buffer = self._buffer.partition(b"\0")
        parsed: dict[str, Any] = json.loads(message)
        return parsed

    def send_headers(self, headers: dict[str, str]) -> None:
        self.call("Network.setExtraHTTPHeaders", session=True, headers=headers)

    def load(self, url: str) -> int:
        """Navigate to ``url`` and await its load; the HTTP status of the page."""
        self.events.clear()
        self.call("Page.navigate", session=True, url=url)
        self.wait_for("Page.loadEventFired")
        return self.page_status()

    def page_status(self) -> int:
        """The status of the last document this page received."""
        documents = [
            e["params"]["response"]
            for e in self.events
            if e.get("method") == "Network.responseReceived" and e["params"]["type"] == "Document"
        ]
        assert documents, "no document was received"
        return int(documents[-1]["status"])

    def evaluate(self, expression: str) -> Any:
        """DevTools evaluates outside the page's policy (the page itself runs no script)."""
        result = self.call(
            "Runtime.evaluate", session=True, expression=expression, returnByValue=True
        )
        return result["result"].get("value")

    def submit(self, form: str, fields: dict[str, str] | None = None) -> None:
        """Fill ``form``'s fields and press its button, as a person would; await the next page."""
        self.events.clear()
        fill = "".join(
            f"f.querySelector('[name={json.dumps(name)}]').value = {json.dumps(value)};"
            for name, value in (fields or {}).items()
        )
        self.evaluate(
            f"(() => {{ const f = document.querySelector({json.dumps(form)}); {fill}"
            "f.querySelector('button').click(); })()"
        )
        self.wait_for("Page.loadEventFired")

    def text(self) -> str:
        return str(self.evaluate("document.body.innerText"))

    def close(self) -> None:
        with contextlib.suppress(OSError):
            os.close(self._commands)
        try:
            self.process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
        os.close(self._answers)


def self_signed(directory: Path, name: str) -> tuple[Path, Path, str]:
    """A certificate for 127.0.0.1 signed by its own key; and its key's SPKI hash."""
    cert, key = directory / f"{name}.crt", directory / f"{name}.key"
    subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256",
         "-nodes", "-days", "2", "-subj", "/CN=127.0.0.1", "-addext",
         "subjectAltName=IP:127.0.0.1", "-keyout", str(key), "-out", str(cert)],
        check=True, capture_output=True, timeout=60,
    )  # fmt: skip
    der = ssl.PEM_cert_to_DER_cert(cert.read_text())
    public = subprocess.run(
        ["openssl", "x509", "-inform", "der", "-pubkey", "-noout"],
        input=der, check=True, capture_output=True, timeout=60,
    ).stdout  # fmt: skip
    spki = subprocess.run(
        ["openssl", "pkey", "-pubin", "-outform", "der"],
        input=public, check=True, capture_output=True, timeout=60,
    ).stdout  # fmt: skip
    return cert, key, base64.b64encode(hashlib.sha256(spki).digest()).decode()
