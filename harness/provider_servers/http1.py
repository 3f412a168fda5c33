"""A local HTTP/1.1 server under the protocol servers of Twilio and SendGrid: an asyncio server on
a thread of its own (keep-alive, many connections), each request handed to ``handle`` with its
method, target, headers (names in lower case) and body. Subclasses speak one provider's protocol."""

from __future__ import annotations

import asyncio
import ssl
import threading
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any


@dataclass
class Request:
    method: str
    target: str
    headers: dict[str, str]
    body: bytes
    at: float = field(default_factory=time.time)  # when it arrived


@dataclass
class Reply:
    status: int
    headers: dict[str, str] = field(default_factory=dict)
    body: bytes = b""
    delay_s: float = 0.0  # answered after this long (a slow server)


@dataclass(frozen=True)
class Serving:
    """An asyncio server listening on 127.0.0.1, its loop running on a thread of its own."""

    loop: asyncio.AbstractEventLoop
    server: asyncio.Server
    port: int
    thread: threading.Thread


def serve_in_thread(handler: Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]], *,
                    name: str, tls: ssl.SSLContext | None = None, backlog: int = 1024,
                    limit: int = 1 << 16) -> Serving:
    """Start ``handler``'s server on a free port of 127.0.0.1 in a thread of its own; returns once
    it listens (it serves until ``server.close()`` is called on its loop)."""
    started = threading.Event()
    found: dict[str, Any] = {}

    def run() -> None:
        loop = asyncio.new_event_loop()
        found["loop"] = loop

        async def main() -> None:
            server = await asyncio.start_server(handler, "127.0.0.1", 0, ssl=tls, backlog=backlog, limit=limit)
            found["server"] = server
            started.set()
            async with server:
                try:
                    await server.serve_forever()
                except asyncio.CancelledError:
                    pass

        try:
            loop.run_until_complete(main())
        finally:
            loop.close()

    thread = threading.Thread(target=run, name=name, daemon=True)
    thread.start()
    if not started.wait(10):
        raise RuntimeError(f"{name} did not start")
    server: asyncio.Server = found["server"]
    return Serving(found["loop"], server, server.sockets[0].getsockname()[1], thread)


class StubServer:
    """``start()`` / ``stop()``; ``base_url`` once started. ``handle`` is called on the server's
    loop, under no lock: a subclass keeps its own state thread-safe (the tests read it)."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._server: asyncio.Server | None = None
        self._writers: set[asyncio.StreamWriter] = set()
        self._thread: threading.Thread | None = None
        self.port = 0

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def handle(self, request: Request) -> Reply:
        raise NotImplementedError

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self._writers.add(writer)
        try:
            while True:
                try:
                    head = await reader.readuntil(b"\r\n\r\n")
                except (asyncio.IncompleteReadError, ConnectionError, asyncio.LimitOverrunError):
                    return
                lines = head.decode("latin-1").split("\r\n")
                method, target, _ = lines[0].split(" ", 2)
                headers: dict[str, str] = {}
                for line in lines[1:]:
                    if ":" in line:
                        name, value = line.split(":", 1)
                        headers[name.strip().lower()] = value.strip()
                body = await reader.readexactly(int(headers.get("content-length") or 0))
                reply = self.handle(Request(method, target, headers, body))
                if reply.delay_s:
                    await asyncio.sleep(reply.delay_s)
                out = [f"HTTP/1.1 {reply.status} X", *(f"{k}: {v}" for k, v in reply.headers.items()),
                       f"Content-Length: {len(reply.body)}"]
                writer.write(("\r\n".join(out) + "\r\n\r\n").encode("latin-1") + reply.body)
                await writer.drain()
        except (ConnectionError, asyncio.IncompleteReadError):
            return
        finally:
            self._writers.discard(writer)
            writer.close()

    def start(self) -> Any:
        serving = serve_in_thread(self._serve, name=type(self).__name__)
        self._loop, self._server, self.port, self._thread = serving.loop, serving.server, serving.port, serving.thread
        return self

    def stop(self) -> None:
        loop, server = self._loop, self._server

        def close() -> None:
            assert server is not None
            server.close()
            for writer in list(self._writers):
                writer.close()  # the connections too, before the loop ends

        if loop is not None and server is not None and not loop.is_closed():
            loop.call_soon_threadsafe(close)
        if self._thread is not None:
            self._thread.join(5)
