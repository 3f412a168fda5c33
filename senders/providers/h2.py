"""The push providers' HTTP/2 connections: httpx's ``AsyncClient`` (h2), one per provider and
event loop, many calls multiplexed as streams on few connections.

``https://``: TLS verified against the system's CAs or ``ca_file``, HTTP/2 through ALPN.
``http://``: HTTP/2 in clear with prior knowledge (h2c), for test stubs only (no real push
service speaks it).

Addresses and credentials stay out of the logs: httpx's INFO line of every request names its URL
(an APNs URL holds the device token) and hpack's DEBUG lines every header it encodes (the
``authorization`` included), so both are dropped where they are logged.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Sequence
from urllib.parse import urlsplit

from operators.errors import ConfigError
from senders.providers.endpoint import HttpxTransport, Transport
from senders.providers.h2_pool import StreamPool
from senders.providers.http1 import HttpReply
from senders.providers.tls import tls_context


class _Quiet(logging.Filter):
    """Drops httpx's request lines and hpack's header dumps; lets their warnings through."""

    def filter(self, record: logging.LogRecord) -> bool:
        if record.name.startswith("hpack"):
            return record.levelno >= logging.WARNING
        return not (record.levelno < logging.WARNING and str(record.msg).startswith("HTTP Request:"))


for _name in ("httpx", "hpack.hpack", "hpack.table"):
    logging.getLogger(_name).addFilter(_Quiet())


def origin_and_path(what: str, url: str) -> tuple[str, str]:
    """``https://host[:port]/prefix`` -> (``https://host[:port]``, ``/prefix`` without a trailing
    slash); ConfigError for anything else (credentials, a query, another scheme)."""
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname or "@" in parts.netloc:
        raise ConfigError(f"{what}: not an http(s) URL without credentials")
    if parts.query or parts.fragment:
        raise ConfigError(f"{what}: a base URL has no query or fragment")
    return f"{parts.scheme}://{parts.netloc}", parts.path.rstrip("/")


class LoopTransport:
    """A Transport of the running event loop: httpx's clients belong to the loop they ran on, so
    a provider used from another loop (the pool's, a test's) gets a client of that loop. The
    first is made at once (not inside the first send's deadline)."""

    def __init__(self, make: Callable[[], Transport]) -> None:
        self._make = make
        self._transport: Transport | None = make()
        self._loop: asyncio.AbstractEventLoop | None = None

    def _current(self) -> Transport:
        loop = asyncio.get_running_loop()
        if self._transport is not None and self._loop is None:
            self._loop = loop
        if self._transport is None or self._loop is not loop:
            self._transport, self._loop = self._make(), loop
        return self._transport

    async def post(self, target: str, headers: Sequence[tuple[str, str]], body: bytes) -> HttpReply:
        return await self._current().post(target, headers, body)

    async def aclose(self) -> None:
        transport, self._transport, self._loop = self._transport, None, None
        if transport is not None:
            await transport.aclose()


def http2_transport(*, origin: str, ca_file: str | None, max_connections: int, timeout_s: float,
                    http1: bool = False, streams: int = 100) -> LoopTransport:
    """HTTP/2 to ``origin``: over TLS (ALPN; ``http1`` allows a fallback to HTTP/1.1), or h2c
    with prior knowledge for ``http://``. ``max_connections``: the calls open at once, spread
    ``streams`` at most to a connection (``h2_pool.StreamPool``)."""
    tls = tls_context(ca_file)  # made once: loading the CAs takes a while
    cleartext = origin.startswith("http://")

    def connection() -> Transport:
        return HttpxTransport(base_url=origin, tls=tls, max_connections=1, timeout_s=timeout_s,
                              http1=http1 and not cleartext)

    return LoopTransport(lambda: StreamPool(connection, calls=max_connections, streams=streams))
