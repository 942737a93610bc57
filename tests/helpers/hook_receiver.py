"""A local HTTP server that records every POST: what hooks and pings send."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


@dataclass(frozen=True)
class Received:
    """One request: its path (with the query) and its body."""

    path: str
    body: bytes

    def json(self) -> dict[str, Any]:
        found: dict[str, Any] = json.loads(self.body)
        return found


class Receiver:
    """Records every POST, in arrival order; ``fail_first``: the first is answered 503."""

    def __init__(self, *, fail_first: bool = False) -> None:
        self.received: list[Received] = []
        receiver = self
        lock = threading.Lock()

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                length = int(self.headers.get("Content-Length", "0"))
                with lock:
                    receiver.received.append(Received(self.path, self.rfile.read(length)))
                    refused = fail_first and len(receiver.received) == 1
                self.send_response(503 if refused else 200)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *args: object) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.base = f"http://127.0.0.1:{self.server.server_address[1]}"

    def events(self, path: str = "/hook") -> list[dict[str, Any]]:
        """The JSON events posted to ``path``, in arrival order."""
        return [r.json() for r in list(self.received) if r.path == path]

    def pings(self, prefix: str = "/ping/") -> list[Received]:
        """The requests to paths under ``prefix``, in arrival order."""
        return [r for r in list(self.received) if r.path.startswith(prefix)]


@contextmanager
def receiving(*, fail_first: bool = False) -> Iterator[Receiver]:
    found = Receiver(fail_first=fail_first)
    thread = threading.Thread(target=found.server.serve_forever, daemon=True)
    thread.start()
    try:
        yield found
    finally:
        found.server.shutdown()
