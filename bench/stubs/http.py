"""The HTTP provider stub: answers every POST after a set latency with ``200 {"id": ...}``, over
HTTP/1.1 (keep-alive, httptools' parser) or HTTP/2 over cleartext with prior knowledge (h2c:
a connection that opens with the HTTP/2 preface; the h2 library). One asyncio protocol per
connection; a call is counted on its channel, the path's first segment (``/sms`` -> ``sms``),
by its ``Idempotency-Key`` header, or, for the push protocols that have none, by the message key
the body carries (FCM HTTP v1: ``message.data.message_key``; APNs: ``message_key``). So the FCM
and APNs adapters run against it too (``base_url`` ``http://.../push``: h2c): a send is answered
``{"name": ...}`` (FCM's message id; APNs reads nothing from a 200), and ``POST /token`` (the
service-account key's ``token_uri``) an OAuth2 access token for an hour. Nothing is
authenticated: the protocols' checks are the tests' servers' (harness/provider_servers); this one
measures.

A call arrives when its request is complete and is answered ``latency`` later; an HTTP/1.1
connection answers in request order (pipelining), an HTTP/2 one per stream.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import logging
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import h2.config
import h2.connection
import h2.events
import h2.exceptions
import h2.settings
import httptools

from bench.stubs.tally import Tally

logger = logging.getLogger(__name__)

PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
KEY_HEADER = b"idempotency-key"
#: streams one HTTP/2 connection may have open at once (the client's pool decides the rest)
MAX_STREAMS = 65_535


@dataclass
class StubState:
    """Shared by every connection of one server: the latency, the tallies, the connections."""

    latency_s: float = 0.0
    status: int = 200
    tallies: dict[str, Tally] = field(default_factory=dict)
    connections: int = 0
    peak_connections: int = 0
    h2_connections: int = 0
    ids: itertools.count[int] = field(default_factory=itertools.count)
    clock: Callable[[], float] = time.time

    def tally(self, channel: str) -> Tally:
        found = self.tallies.get(channel)
        if found is None:
            found = self.tallies[channel] = Tally()
        return found

    def opened(self) -> None:
        self.connections += 1
        self.peak_connections = max(self.peak_connections, self.connections)

    def reply_body(self, path: bytes) -> bytes:
        if channel_of(path) == "token":
            return b'{"access_token": "stub-token", "expires_in": 3600, "token_type": "Bearer"}'
        n = next(self.ids)
        return b'{"id": "stub-%d", "name": "stub-%d"}' % (n, n)


def channel_of(path: bytes) -> str:
    return path.split(b"?", 1)[0].strip(b"/").split(b"/", 1)[0].decode("latin-1") or "-"


def body_key(body: bytes) -> bytes | None:
    """The message key a push protocol's JSON body carries (FCM's ``message.data.message_key``,
    APNs' ``message_key``); None when there is none."""
    try:
        parsed = json.loads(body) if body else None
    except ValueError:
        return None
    if not isinstance(parsed, dict):
        return None
    message = parsed.get("message")
    data = message.get("data") if isinstance(message, dict) else None
    key = data.get("message_key") if isinstance(data, dict) else parsed.get("message_key")
    return key.encode() if isinstance(key, str) and key else None


class HttpStubProtocol(asyncio.Protocol):
    def __init__(self, state: StubState) -> None:
        self.state = state
        self.transport: asyncio.Transport | None = None
        self.loop = asyncio.get_running_loop()
        self._head = b""
        self._h1: _Http1 | None = None
        self._h2: _Http2 | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]  # a TCP transport (uvloop's is no subclass)
        self.state.opened()

    def connection_lost(self, exc: Exception | None) -> None:
        self.state.connections -= 1
        if self._h1 is not None:
            self._h1.closed()
        if self._h2 is not None:
            self._h2.closed()
        self.transport = None

    def data_received(self, data: bytes) -> None:
        if self._h1 is not None:
            self._h1.feed(data)
            return
        if self._h2 is not None:
            self._h2.feed(data)
            return
        self._head += data
        if PREFACE.startswith(self._head[: len(PREFACE)]) and len(self._head) < len(PREFACE):
            return  # not enough yet to tell HTTP/2's preface from an HTTP/1.1 request
        head, self._head = self._head, b""
        assert self.transport is not None
        if head.startswith(PREFACE):
            self.state.h2_connections += 1
            self._h2 = _Http2(self, self.transport)
            self._h2.feed(head)
        else:
            self._h1 = _Http1(self, self.transport)
            self._h1.feed(head)

    def arrive(self, path: bytes, key: bytes | None) -> Tally:
        tally = self.state.tally(channel_of(path))
        tally.arrive(key.decode("latin-1") if key else None, self.state.clock())
        return tally

    def after_latency(self, then: Callable[[], None]) -> asyncio.TimerHandle | None:
        if self.state.latency_s <= 0:
            self.loop.call_soon(then)
            return None
        return self.loop.call_later(self.state.latency_s, then)


class _Http1:
    """HTTP/1.1 on one connection: requests parsed by httptools, answered in order."""

    def __init__(self, proto: HttpStubProtocol, transport: asyncio.Transport) -> None:
        self.proto = proto
        self.transport = transport
        self.parser = httptools.HttpRequestParser(self)
        self.url = b""
        self.key: bytes | None = None
        self.body = b""
        self.pending: deque[list[Any]] = deque()  # [answered?, response bytes, close after?, tally]
        self.timers: list[asyncio.TimerHandle] = []
        self.closing = False

    def feed(self, data: bytes) -> None:
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserError:
            self.transport.write(b"HTTP/1.1 400 Bad Request\r\nContent-Length: 0\r\nConnection: close\r\n\r\n")
            self.transport.close()

    # httptools' callbacks
    def on_message_begin(self) -> None:
        self.url = b""
        self.key = None
        self.body = b""

    def on_url(self, url: bytes) -> None:
        self.url += url

    def on_header(self, name: bytes, value: bytes) -> None:
        if name.lower() == KEY_HEADER:
            self.key = value

    def on_body(self, body: bytes) -> None:
        if self.key is None:  # only a push protocol's body is read (for its message key)
            self.body += body

    def on_message_complete(self) -> None:
        tally = self.proto.arrive(self.url, self.key if self.key is not None else body_key(self.body))
        state = self.proto.state
        body = state.reply_body(self.url)
        keep = self.parser.should_keep_alive()
        head = (
            f"HTTP/1.1 {state.status} OK\r\nContent-Type: application/json\r\nContent-Length: {len(body)}\r\n"
            + ("" if keep else "Connection: close\r\n")
            + "\r\n"
        ).encode()
        entry: list[Any] = [False, head + body, not keep, tally]
        self.pending.append(entry)

        def answer() -> None:
            entry[0] = True
            self._flush()

        timer = self.proto.after_latency(answer)
        if timer is not None:
            self.timers.append(timer)
            if len(self.timers) > 64:
                self.timers = [t for t in self.timers if not t.cancelled() and t.when() > self.proto.loop.time()]

    def _flush(self) -> None:
        while self.pending and self.pending[0][0]:
            _, data, close, tally = self.pending.popleft()
            tally.answered()
            if self.closing:
                continue
            self.transport.write(data)
            if close:
                self.closing = True
                self.transport.close()

    def closed(self) -> None:
        """The connection went: what was in flight on it is no longer."""
        self.closing = True
        for timer in self.timers:
            timer.cancel()
        while self.pending:
            self.pending.popleft()[3].answered()


class _Http2:
    """HTTP/2 on one connection (h2c, prior knowledge): each stream answered on its own."""

    def __init__(self, proto: HttpStubProtocol, transport: asyncio.Transport) -> None:
        self.proto = proto
        self.transport = transport
        config = h2.config.H2Configuration(client_side=False, header_encoding=None)
        self.conn = h2.connection.H2Connection(config=config)
        self.conn.local_settings = h2.settings.Settings(
            client=False, initial_values={h2.settings.SettingCodes.MAX_CONCURRENT_STREAMS: MAX_STREAMS}
        )
        self.conn.initiate_connection()
        self.streams: dict[int, tuple[bytes, bytes | None]] = {}  # open, request not complete yet
        self.bodies: dict[int, bytes] = {}  # of open streams without a key header
        self.waiting: dict[int, tuple[Tally, asyncio.TimerHandle | None]] = {}
        self.gone = False

    def feed(self, data: bytes) -> None:
        try:
            events = self.conn.receive_data(data)
        except h2.exceptions.ProtocolError:
            self.transport.write(self.conn.data_to_send())
            self.transport.close()
            return
        for event in events:
            if isinstance(event, h2.events.RequestReceived):
                headers = dict(event.headers or [])
                self.streams[event.stream_id] = (headers.get(b":path", b"/"), headers.get(KEY_HEADER))
                if event.stream_ended is not None:
                    self._complete(event.stream_id)
            elif isinstance(event, h2.events.DataReceived):
                if event.flow_controlled_length:
                    self.conn.acknowledge_received_data(event.flow_controlled_length, event.stream_id)
                request = self.streams.get(event.stream_id)
                if request is not None and request[1] is None and event.data:
                    self.bodies[event.stream_id] = self.bodies.get(event.stream_id, b"") + event.data
                if event.stream_ended is not None:
                    self._complete(event.stream_id)
            elif isinstance(event, h2.events.StreamEnded):
                self._complete(event.stream_id)
            elif isinstance(event, h2.events.StreamReset):
                self._drop(event.stream_id)
            elif isinstance(event, h2.events.ConnectionTerminated):
                self.transport.close()
        self._send()

    def _complete(self, stream_id: int) -> None:
        request = self.streams.pop(stream_id, None)
        body = self.bodies.pop(stream_id, b"")
        if request is None:
            return
        path, key = request
        tally = self.proto.arrive(path, key if key is not None else body_key(body))
        timer = self.proto.after_latency(lambda: self._answer(stream_id, path))
        self.waiting[stream_id] = (tally, timer)

    def _answer(self, stream_id: int, path: bytes) -> None:
        waiting = self.waiting.pop(stream_id, None)
        if waiting is None:
            return
        waiting[0].answered()
        if self.gone:
            return
        state = self.proto.state
        body = state.reply_body(path)
        try:
            self.conn.send_headers(
                stream_id,
                [(b":status", str(state.status).encode()), (b"content-type", b"application/json"),
                 (b"content-length", str(len(body)).encode())],
            )
            self.conn.send_data(stream_id, body, end_stream=True)
        except h2.exceptions.H2Error:
            return  # the stream was reset meanwhile
        self._send()

    def _drop(self, stream_id: int) -> None:
        self.streams.pop(stream_id, None)
        self.bodies.pop(stream_id, None)
        waiting = self.waiting.pop(stream_id, None)
        if waiting is not None:
            waiting[0].answered()
            if waiting[1] is not None:
                waiting[1].cancel()

    def _send(self) -> None:
        data = self.conn.data_to_send()
        if data and not self.gone:
            self.transport.write(data)

    def closed(self) -> None:
        self.gone = True
        for stream_id in list(self.waiting):
            self._drop(stream_id)
