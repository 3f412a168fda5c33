"""A local HTTP provider for the tests: records every request, answers per recipient."""

from __future__ import annotations

import json
import ssl
import threading
import time
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


@dataclass
class Recorded:
    idempotency_key: str | None
    authorization: str | None
    body: dict[str, Any]
    at: float


@dataclass
class FakeHttpProvider:
    """``replies`` maps a recipient to (status, headers); others get 202 ``{"id": ...}``.
    ``script`` maps a recipient to the replies of its first, second, ... request (the last one
    repeating). A recipient in ``stall`` is answered after ``stall_s`` (past the client's timeout).
    ``bodies`` maps a recipient to the body of its non-2xx replies."""

    delay_s: float = 0.0
    replies: dict[str, tuple[int, dict[str, str]]] = field(default_factory=dict)
    script: dict[str, list[tuple[int, dict[str, str]]]] = field(default_factory=dict)
    bodies: dict[str, dict[str, Any]] = field(default_factory=dict)
    stall: set[str] = field(default_factory=set)
    stall_s: float = 1.0
    tls: ssl.SSLContext | None = None  # serve HTTPS with this context
    default: tuple[int, dict[str, str]] = (202, {})  # the reply to a recipient in neither map
    requests: list[Recorded] = field(default_factory=list)
    _lock: threading.Lock = field(default_factory=threading.Lock)
    _server: ThreadingHTTPServer | None = None

    @property
    def url(self) -> str:
        assert self._server is not None
        scheme = "https" if self.tls is not None else "http"
        return f"{scheme}://127.0.0.1:{self._server.server_address[1]}/v1/send"

    def to(self, recipient: str) -> list[Recorded]:
        with self._lock:
            return [r for r in self.requests if r.body.get("to") == recipient]

    def keys(self) -> list[str | None]:
        with self._lock:
            return [r.idempotency_key for r in self.requests]

    def start(self) -> FakeHttpProvider:
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 - the http.server API
                body = json.loads(self.rfile.read(int(self.headers.get("Content-Length") or 0)))
                with outer._lock:
                    outer.requests.append(
                        Recorded(
                            self.headers.get("Idempotency-Key"),
                            self.headers.get("Authorization"),
                            body,
                            time.time(),
                        )
                    )
                    n = len(outer.requests)
                    to = body.get("to")
                    nth = sum(1 for r in outer.requests if r.body.get("to") == to) - 1
                if outer.delay_s:
                    time.sleep(outer.delay_s)
                if body.get("to") in outer.stall:
                    time.sleep(outer.stall_s)
                if to in outer.script:
                    steps = outer.script[to]
                    status, headers = steps[min(nth, len(steps) - 1)]
                else:
                    status, headers = outer.replies.get(to, outer.default)
                error = outer.bodies.get(to, {"error": "no"})
                payload = json.dumps({"id": f"msg-{n}"} if status < 300 else error).encode()
                try:
                    self.send_response(status)
                    for k, v in headers.items():
                        self.send_header(k, v)
                    self.send_header("Content-Type", "application/json")
                    self.send_header("Content-Length", str(len(payload)))
                    self.end_headers()
                    self.wfile.write(payload)
                except (BrokenPipeError, ConnectionResetError):
                    pass

            def log_message(self, *args: Any) -> None:
                pass

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        if self.tls is not None:
            self._server.socket = self.tls.wrap_socket(self._server.socket, server_side=True)
        threading.Thread(target=self._server.serve_forever, daemon=True).start()
        return self

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
