"""HTTP/1.1 keep-alive connections for the providers' POSTs: asyncio transports, replies parsed
by httptools (llhttp, uvicorn's parser).

Why not httpx here: measured on this machine against a local stub in another process (uvloop,
200 POSTs in flight), httpx 0.28 took 6,600 us of CPU per call (httpcore's pool scans every
connection for every request), aiohttp 3.14 about 300 us, these connections 40 us; the sender's
whole budget is 250 us a message. httpx serves the providers that speak HTTP/2
(``senders.http2``). Figures and the command: docs/senders.md.

What a provider call needs and nothing else: one request per connection at a time, bounded
connections per provider, no redirects (a 3xx is a reply like any other), TLS through the given
verifying context, a reply body read up to a cap.
"""

from __future__ import annotations

import asyncio
import ssl
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import cast

import httptools

#: an idle connection older than this is closed rather than used (servers drop idle ones)
IDLE_S = 15.0


class TransportError(Exception):
    """No reply: the connection failed or closed first; ``reason`` is fit for logs."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


@dataclass(frozen=True, slots=True)
class HttpReply:
    status: int
    headers: dict[str, str]
    body: bytes


def connection_reason(exc: BaseException) -> str:
    if isinstance(exc, ssl.SSLCertVerificationError):
        return "TLS certificate not verified"
    if isinstance(exc, ssl.SSLError):
        return f"TLS failed: {type(exc).__name__}"
    return f"connection failed: {type(exc).__name__}"


class _Connection(asyncio.Protocol):
    """One keep-alive connection; ``exchange`` writes a request and awaits its whole reply."""

    def __init__(self, max_body: int) -> None:
        self._max_body = max_body
        self._transport: asyncio.Transport | None = None
        self._parser = httptools.HttpResponseParser(self)
        self._waiter: asyncio.Future[HttpReply] | None = None
        self._headers: dict[str, str] = {}
        self._body: list[bytes] = []
        self._size = 0
        self._headers_done = False
        self.closed = False
        self.idle_since = time.monotonic()

    # -- asyncio.Protocol ---------------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._transport = cast(asyncio.Transport, transport)  # uvloop's is no subclass of it

    def data_received(self, data: bytes) -> None:
        if self._waiter is None:
            self.close()  # bytes nobody asked for: the connection is not to be trusted
            return
        try:
            self._parser.feed_data(data)
        except httptools.HttpParserUpgrade:
            self._fail(TransportError("connection failed: the server upgraded the protocol"))
        except httptools.HttpParserError:
            self._fail(TransportError("connection failed: not an HTTP reply"))

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        if self._waiter is not None and not self._waiter.done():
            framed = "content-length" in self._headers or "transfer-encoding" in self._headers
            if self._headers_done and not framed:
                self._complete(keep_alive=False)  # a body delimited by the end of the connection
            else:
                reason = connection_reason(exc) if exc is not None else "connection failed: closed before the reply"
                self._waiter.set_exception(TransportError(reason))

    # -- httptools callbacks ------------------------------------------------------------------

    def on_header(self, name: bytes, value: bytes) -> None:
        self._headers[name.decode("latin-1").lower()] = value.decode("latin-1")

    def on_headers_complete(self) -> None:
        self._headers_done = True

    def on_body(self, body: bytes) -> None:
        room = self._max_body - self._size
        if room > 0:
            self._body.append(body[:room])
        self._size += len(body)

    def on_message_complete(self) -> None:
        if self._parser.get_status_code() < 200:
            self._reset()  # an interim reply (100 Continue, 103): the real one follows
            return
        self._complete(keep_alive=self._parser.should_keep_alive() and self._size <= self._max_body)

    # -- use ----------------------------------------------------------------------------------

    def _reset(self) -> None:
        self._headers, self._body, self._size, self._headers_done = {}, [], 0, False

    def _complete(self, *, keep_alive: bool) -> None:
        waiter, self._waiter = self._waiter, None
        reply = HttpReply(self._parser.get_status_code(), self._headers, b"".join(self._body))
        self._reset()
        if not keep_alive:
            self.close()
        if waiter is not None and not waiter.done():
            waiter.set_result(reply)

    def _fail(self, exc: Exception) -> None:
        waiter, self._waiter = self._waiter, None
        self.close()
        if waiter is not None and not waiter.done():
            waiter.set_exception(exc)

    async def exchange(self, request: bytes) -> HttpReply:
        assert self._transport is not None and self._waiter is None
        self._waiter = asyncio.get_running_loop().create_future()
        self._transport.write(request)
        try:
            return await self._waiter
        except BaseException:
            self.close()  # cancelled (the deadline) or failed mid-reply: never reused
            raise
        finally:
            self.idle_since = time.monotonic()

    def close(self) -> None:
        self.closed = True
        if self._transport is not None:
            self._transport.close()


class Http1Pool:
    """Up to ``max_connections`` connections to one host; a request waits for a free one. Bound
    to the event loop it is first used on."""

    def __init__(
        self, *, host: str, port: int, tls: ssl.SSLContext | None, max_connections: int, max_body: int
    ) -> None:
        self._host = host
        self._port = port
        self._tls = tls
        self._max_body = max_body
        self._slots = asyncio.Semaphore(max_connections)
        self._idle: list[_Connection] = []
        host_header = host if ":" not in host else f"[{host}]"
        default = 443 if tls is not None else 80
        self.host_header = host_header if port == default else f"{host_header}:{port}"

    async def _connect(self) -> _Connection:
        loop = asyncio.get_running_loop()
        try:
            _, conn = await loop.create_connection(
                lambda: _Connection(self._max_body),
                self._host,
                self._port,
                ssl=self._tls,
                server_hostname=self._host if self._tls is not None else None,
            )
        except (OSError, ssl.SSLError) as exc:
            raise TransportError(connection_reason(exc)) from None
        return conn

    def _take_idle(self) -> _Connection | None:
        now = time.monotonic()
        while self._idle:
            conn = self._idle.pop()
            if not conn.closed and now - conn.idle_since < IDLE_S:
                return conn
            conn.close()
        return None

    async def post(self, target: str, headers: Sequence[tuple[str, str]], body: bytes) -> HttpReply:
        """One POST; raises TransportError when no reply came (the caller's deadline cancels)."""
        head = [f"POST {target} HTTP/1.1", f"Host: {self.host_header}", f"Content-Length: {len(body)}"]
        head += [f"{name}: {value}" for name, value in headers]
        request = ("\r\n".join(head) + "\r\n\r\n").encode("latin-1") + body
        async with self._slots:
            conn = self._take_idle() or await self._connect()
            reply = await conn.exchange(request)
            if not conn.closed:
                self._idle.append(conn)
            return reply

    async def aclose(self) -> None:
        idle, self._idle = self._idle, []
        for conn in idle:
            conn.close()
