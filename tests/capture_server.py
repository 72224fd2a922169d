"""A server on a loopback port that records every request it receives, for token-origin tests.

It plays the server a colleague with Prefect API access would point a flow, a block or a record
at: whatever reaches it, and above all every ``Authorization`` header, is kept for the test to
judge. It answers every request with a redirect to ``redirect_to`` when one is set, else with a
contract-shaped error envelope.
"""

from __future__ import annotations

import json
import threading
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


@dataclass
class Received:
    """One request the capture server received."""

    method: str
    path: str
    authorization: str | None


@dataclass
class CaptureServer:
    """Start with ``with CaptureServer() as capture:``; ``capture.url`` is its origin."""

    redirect_to: str | None = None
    received: list[Received] = field(default_factory=list)
    _server: ThreadingHTTPServer | None = None
    _thread: threading.Thread | None = None

    @property
    def url(self) -> str:
        assert self._server is not None
        host, port = self._server.server_address[:2]
        return f"http://{host}:{port}"

    @property
    def authorizations(self) -> list[str]:
        """Every Authorization header received, in order."""
        return [r.authorization for r in self.received if r.authorization is not None]

    def __enter__(self) -> CaptureServer:
        capture = self

        class Handler(BaseHTTPRequestHandler):
            def _record(self) -> None:
                capture.received.append(
                    Received(self.command, self.path, self.headers.get("Authorization"))
                )
                if capture.redirect_to is not None:
                    self.send_response(307)
                    self.send_header("Location", capture.redirect_to + self.path)
                    self.send_header("Content-Length", "0")
                    self.end_headers()
                    return
                body = json.dumps(
                    {"error": {"code": "UNAUTHENTICATED", "message": "captured"}}
                ).encode()
                self.send_response(401)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            do_GET = do_POST = do_PUT = do_DELETE = _record

            def log_message(self, format: str, *args: Any) -> None:
                return None  # the test reads .received, not stderr

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        assert self._server is not None and self._thread is not None
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout=5)
