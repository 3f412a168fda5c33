"""A local HTTP provider for the tests: records every request, answers per recipient. An asyncio
server on a thread of its own, so it holds hundreds of connections and calls open at once (the
senders keep that many in flight), and tells how many were open at once."""

from __future__ import annotations

import asyncio
import json
import ssl
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from harness.provider_servers.http1 import serve_in_thread


@dataclass
class Recorded:
    idempotency_key: str | None
    authorization: str | None
    body: dict[str, Any]
    at: float  # time.time() when the request arrived


@dataclass
class FakeHttpProvider:
    """``replies`` maps a recipient to (status, headers); others get 202 ``{"id": ...}``.
    ``script`` maps a recipient to the replies of its first, second, ... request (the last one
    repeating). A recipient in ``stall`` is answered after ``stall_s`` (past the client's timeout).
    ``bodies`` maps a recipient to the body of its non-2xx replies. Every reply takes ``delay_s``."""

    delay_s: float = 0.0
    replies: dict[str, tuple[int, dict[str, str]]] = field(default_factory=dict)
    script: dict[str, list[tuple[int, dict[str, str]]]] = field(default_factory=dict)
    bodies: dict[str, dict[str, Any]] = field(default_factory=dict)
    stall: set[str] = field(default_factory=set)
    stall_s: float = 1.0
    tls: ssl.SSLContext | None = None  # serve HTTPS with this context
    default: tuple[int, dict[str, str]] = (202, {})  # the reply to a recipient in neither map
    requests: list[Recorded] = field(default_factory=list)
    #: requests being answered now, and the most there were at once
    in_flight: int = 0
    peak_in_flight: int = 0
    _per_recipient: Counter[str] = field(default_factory=Counter)
    _lock: threading.Lock = field(default_factory=threading.Lock)
    _loop: asyncio.AbstractEventLoop | None = None
    _server: asyncio.Server | None = None
    _port: int = 0

    @property
    def url(self) -> str:
        scheme = "https" if self.tls is not None else "http"
        return f"{scheme}://127.0.0.1:{self._port}/v1/send"

    def to(self, recipient: str) -> list[Recorded]:
        with self._lock:
            return [r for r in self.requests if r.body.get("to") == recipient]

    def keys(self) -> list[str | None]:
        with self._lock:
            return [r.idempotency_key for r in self.requests]

    def repeated(self) -> dict[str | None, int]:
        """Message keys received more than once, and how often."""
        return {k: n for k, n in Counter(self.keys()).items() if n > 1}

    def peak_rate(self, window_s: float = 1.0) -> int:
        """The most requests that arrived within any ``window_s``."""
        with self._lock:
            times = sorted(r.at for r in self.requests)
        best, first = 0, 0
        for last, at in enumerate(times):
            while at - times[first] >= window_s:
                first += 1
            best = max(best, last - first + 1)
        return best

    # -- the server -------------------------------------------------------------------------------

    def _reply_for(self, body: dict[str, Any]) -> tuple[int, dict[str, str], bytes]:
        to = body.get("to")
        with self._lock:
            n = len(self.requests)
            nth = self._per_recipient[str(to)] - 1
        if to in self.script:
            steps = self.script[to]
            status, headers = steps[min(nth, len(steps) - 1)]
        else:
            status, headers = self.replies.get(to, self.default)  # type: ignore[arg-type]
        error = self.bodies.get(to, {"error": "no"})  # type: ignore[arg-type]
        return status, headers, json.dumps({"id": f"msg-{n}"} if status < 300 else error).encode()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                try:
                    head = await reader.readuntil(b"\r\n\r\n")
                except (asyncio.IncompleteReadError, ConnectionError, asyncio.LimitOverrunError):
                    return
                lines = head.decode("latin-1").split("\r\n")
                headers = {}
                for line in lines[1:]:
                    if ":" in line:
                        name, value = line.split(":", 1)
                        headers[name.strip().lower()] = value.strip()
                raw = await reader.readexactly(int(headers.get("content-length") or 0))
                body = json.loads(raw)
                with self._lock:
                    self.requests.append(
                        Recorded(headers.get("idempotency-key"), headers.get("authorization"), body, time.time())
                    )
                    self._per_recipient[str(body.get("to"))] += 1
                    self.in_flight += 1
                    self.peak_in_flight = max(self.peak_in_flight, self.in_flight)
                try:
                    status, extra, payload = self._reply_for(body)
                    if self.delay_s:
                        await asyncio.sleep(self.delay_s)
                    if body.get("to") in self.stall:
                        await asyncio.sleep(self.stall_s)
                finally:
                    with self._lock:
                        self.in_flight -= 1
                out = [f"HTTP/1.1 {status} X"] + [f"{k}: {v}" for k, v in extra.items()]
                out += ["Content-Type: application/json", f"Content-Length: {len(payload)}"]
                writer.write(("\r\n".join(out) + "\r\n\r\n").encode("latin-1") + payload)
                await writer.drain()
        except (ConnectionError, asyncio.IncompleteReadError):
            return
        finally:
            writer.close()

    def start(self) -> FakeHttpProvider:
        serving = serve_in_thread(self._serve, name="fake-http", tls=self.tls, backlog=4096, limit=1 << 20)
        self._loop, self._server, self._port = serving.loop, serving.server, serving.port
        return self

    def stop(self) -> None:
        loop, server = self._loop, self._server
        if loop is not None and server is not None and not loop.is_closed():
            loop.call_soon_threadsafe(server.close)
