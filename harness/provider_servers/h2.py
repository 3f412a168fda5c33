"""What the tests' push servers share: an ASGI app served by hypercorn on a thread of its own,
HTTP/2 over TLS (a throwaway CA, harness/provider_servers/tls.py) or h2c (prior knowledge), a clock the
test moves, and the requests each server saw (HTTP version, connection, headers, body)."""

from __future__ import annotations

import asyncio
import json
import socket
import threading
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from hypercorn.asyncio import serve
from hypercorn.config import Config

from harness.provider_servers.script import Script
from harness.provider_servers.tls import Pki

Scope = dict[str, Any]
Receive = Callable[[], Awaitable[dict[str, Any]]]
Send = Callable[[dict[str, Any]], Awaitable[None]]


@dataclass
class Clock:
    """Epoch seconds that move only when told (shared by a provider and its server)."""

    now: float = field(default_factory=time.time)

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


@dataclass(frozen=True)
class Seen:
    """One request as the server got it."""

    http_version: str
    connection: tuple[str, int]  # the client's address: one per connection
    method: str
    path: str  # decoded
    raw_path: str  # as it was on the wire
    headers: dict[str, str]
    body: bytes
    at: float = field(default_factory=time.time)

    def json(self) -> Any:
        return json.loads(self.body)


@dataclass(frozen=True)
class Reply:
    status: int
    body: Any = None  # JSON, or bytes as they are
    headers: tuple[tuple[str, str], ...] = ()

    def encoded(self) -> bytes:
        if self.body is None:
            return b""
        return self.body if isinstance(self.body, bytes) else json.dumps(self.body).encode()


class H2Server:
    """Subclasses answer ``handle(seen) -> Reply`` (a coroutine); this serves them. Every
    request is recorded in ``seen``; ``in_flight`` / ``peak_in_flight`` count those being answered."""

    def __init__(self, *, pki: Pki | None, max_streams: int = 1000, delay_s: float = 0.0,
                 slow_s: float = 5.0) -> None:
        """``delay_s``: every scripted answer takes this long (a provider's latency); ``slow_s``:
        how long a ``"slow"`` one takes (past the client's deadline)."""
        self.pki = pki
        self.max_streams = max_streams
        self.delay_s = delay_s
        self.slow_s = slow_s
        #: per device token, the answers of its requests: ``"ok"``, ``"slow"`` or a name of the
        #: subclass's ``ANSWERS``
        self.script: Script[str] = Script("ok")
        self.seen: list[Seen] = []
        self.in_flight = 0
        self.peak_in_flight = 0
        self._lock = threading.Lock()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stop: asyncio.Event | None = None
        self._thread: threading.Thread | None = None
        self.port = 0

    @property
    def origin(self) -> str:
        return f"{'https' if self.pki is not None else 'http'}://127.0.0.1:{self.port}"

    def connections(self) -> set[tuple[str, int]]:
        with self._lock:
            return {s.connection for s in self.seen}

    async def handle(self, seen: Seen) -> Reply:
        raise NotImplementedError

    async def scripted(self, device: str, answers: dict[str, Reply]) -> Reply | None:
        """The next scripted answer for ``device``, after the server's latency: one of
        ``answers``, or None for ``"ok"`` (the subclass answers success its own way)."""
        answer = self.script.next(device)
        if self.delay_s:
            await asyncio.sleep(self.delay_s)
        if answer == "slow":
            await asyncio.sleep(self.slow_s)
        elif answer != "ok":
            return answers[answer]
        return None

    # -- serving ----------------------------------------------------------------------------------

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan":
            while True:
                kind = (await receive())["type"]
                await send({"type": f"{kind}.complete"})  # lifespan.startup, lifespan.shutdown
                if kind == "lifespan.shutdown":
                    return
        chunks = []
        while True:
            event = await receive()
            chunks.append(event.get("body", b""))
            if not event.get("more_body"):
                break
        seen = Seen(
            http_version=scope["http_version"],
            connection=tuple(scope["client"]),  # type: ignore[arg-type]
            method=scope["method"],
            path=scope["path"],
            raw_path=(scope.get("raw_path") or scope["path"].encode()).decode("latin-1").split("?", 1)[0],
            headers={k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope["headers"]},
            body=b"".join(chunks),
        )
        with self._lock:
            self.seen.append(seen)
            self.in_flight += 1
            self.peak_in_flight = max(self.peak_in_flight, self.in_flight)
        try:
            reply = await self.handle(seen)
        finally:
            with self._lock:
                self.in_flight -= 1
        body = reply.encoded()
        headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
        headers += [(k.encode(), v.encode()) for k, v in reply.headers]
        await send({"type": "http.response.start", "status": reply.status, "headers": headers})
        await send({"type": "http.response.body", "body": body})

    def start(self) -> H2Server:
        sock = socket.socket()
        sock.bind(("127.0.0.1", 0))
        sock.listen(512)
        self.port = sock.getsockname()[1]
        config = Config()
        config.bind = [f"fd://{sock.detach()}"]  # hypercorn's from now on (it closes it)
        config.h2_max_concurrent_streams = self.max_streams
        config.loglevel = "WARNING"
        config.graceful_timeout = 0.2  # a scripted slow answer is not waited for at the end
        if self.pki is not None:
            config.certfile, config.keyfile = str(self.pki.cert_file), str(self.pki.key_file)
        ready = threading.Event()

        def run() -> None:
            loop = asyncio.new_event_loop()
            self._loop = loop
            self._stop = asyncio.Event()
            loop.call_soon(ready.set)
            loop.run_until_complete(serve(self, config, shutdown_trigger=self._stop.wait))  # type: ignore[arg-type]
            loop.close()

        self._thread = threading.Thread(target=run, name=type(self).__name__, daemon=True)
        self._thread.start()
        ready.wait(10)
        return self

    def stop(self) -> None:
        if self._loop is not None and self._stop is not None:
            self._loop.call_soon_threadsafe(self._stop.set)
        if self._thread is not None:
            self._thread.join(10)


def error_json(code: int, status: str, message: str, *details: dict[str, Any]) -> dict[str, Any]:
    """A Google API error body (``google.rpc.Status``)."""
    return {"error": {"code": code, "message": message, "status": status, "details": list(details)}}
