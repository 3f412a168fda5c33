"""One HTTP(S) provider's base URL and its connections, for the adapters that POST to it (the
project's JSON contract, Twilio's Messages API, SendGrid's mail send).

HTTP/1.1 on the providers' own keep-alive connections (``senders.providers.http1``: httpx's
connection pool cost 6.6 ms of CPU a call at 200 in flight here), or httpx's ``AsyncClient``
with HTTP/2 for a provider that speaks it (``senders.http2``). Either way a redirect is an
answer, never followed; TLS is verified against the system's CAs or ``ca_file``; the caller's
deadline (``Provider.send``) bounds each POST.
"""

from __future__ import annotations

import asyncio
import math
import ssl
import time
from collections.abc import Mapping, Sequence
from email.utils import parsedate_to_datetime
from typing import Protocol
from urllib.parse import urlsplit

import httpx

from operators.errors import ConfigError
from senders.errors import ProviderRetryableError
from senders.providers.http1 import Http1Pool, HttpReply, TransportError, connection_reason
from senders.providers.tls import tls_context

#: the most of a reply body read (for its id or error code); the rest is not needed
MAX_BODY = 64 * 1024
#: the longest provider message id kept (a longer one is no id of ours to look up)
MAX_REFERENCE = 256


def retry_after_s(value: str, now_s: float | None = None) -> float | None:
    """A Retry-After header: seconds, or an HTTP date; anything else (inf, nan, negative,
    words) is no hint. Bounding a long hint is the retry policy's job."""
    text = value.strip()
    try:
        seconds = float(text)
    except ValueError:
        try:
            when = parsedate_to_datetime(text)
        except (TypeError, ValueError, IndexError):
            return None
        if when.tzinfo is None:
            return None
        return max(0.0, when.timestamp() - (time.time() if now_s is None else now_s))
    return seconds if math.isfinite(seconds) and seconds >= 0 else None


def reply_retry_after_s(headers: Mapping[str, str]) -> float | None:
    """The Retry-After of a reply (``headers``' names in lower case)."""
    value = headers.get("retry-after")
    return None if value is None else retry_after_s(value)


def header_value(value: str) -> str:
    """A header value as sent: no line breaks (a message key is data: it must not add headers)."""
    if any(c in value for c in "\r\n\0") or not value.isascii():
        raise ValueError("not a valid header value")
    return value


def reference(value: object) -> str | None:
    """A provider's message id as kept with the status, or None when it is no usable id."""
    if isinstance(value, bool) or not isinstance(value, str | int):
        return None
    text = str(value)
    if not text or len(text) > MAX_REFERENCE or not text.isprintable():
        return None
    return text


class Transport(Protocol):
    """Where a provider's POSTs go (its connections): raises TransportError without a reply."""

    async def post(self, target: str, headers: Sequence[tuple[str, str]], body: bytes) -> HttpReply: ...

    async def aclose(self) -> None: ...


class HttpxTransport:
    """httpx's AsyncClient (HTTP/2 when the server offers it through ALPN): one client per
    provider, its pool bounded, its timeouts one object."""

    def __init__(
        self, *, base_url: str, tls: ssl.SSLContext, max_connections: int, timeout_s: float, http1: bool = True
    ) -> None:
        """``tls``: a verifying context (made once: loading the CAs takes a while); ``http1``
        False: HTTP/2 only (over ``http://``, h2c with prior knowledge)."""
        self._base = base_url
        self._client = httpx.AsyncClient(
            http1=http1,
            http2=True,
            verify=tls,
            limits=httpx.Limits(max_connections=max_connections, max_keepalive_connections=max_connections),
            timeout=httpx.Timeout(timeout_s),
            follow_redirects=False,
            trust_env=False,
        )

    async def post(self, target: str, headers: Sequence[tuple[str, str]], body: bytes) -> HttpReply:
        try:
            async with self._client.stream("POST", self._base + target, content=body, headers=list(headers)) as r:
                chunks: list[bytes] = []
                size = 0
                async for chunk in r.aiter_raw():
                    chunks.append(chunk[: max(0, MAX_BODY - size)])
                    size += len(chunk)
                    if size >= MAX_BODY:
                        break
                return HttpReply(r.status_code, {k.lower(): v for k, v in r.headers.items()}, b"".join(chunks))
        except httpx.TimeoutException:
            raise TimeoutError from None
        except httpx.HTTPError as exc:
            cause: BaseException = exc
            while cause.__cause__ is not None or cause.__context__ is not None:
                nxt = cause.__cause__ or cause.__context__
                assert nxt is not None
                if isinstance(nxt, ssl.SSLError):
                    cause = nxt
                    break
                cause = nxt
            raise TransportError(connection_reason(cause)) from None

    async def aclose(self) -> None:
        await self._client.aclose()


class Endpoint:
    """A provider's ``scheme://host[:port]`` and the connections to it, made on the event loop
    that first uses them (the pool's loop runs in its own thread, started after the providers
    are built). ``post`` raises ProviderRetryableError when no reply came."""

    def __init__(
        self,
        *,
        name: str,
        url: str,
        timeout_s: float,
        ca_file: str | None = None,
        max_connections: int = 100,
        http2: bool = False,
        transport: Transport | None = None,
    ) -> None:
        """``url``: the provider's base URL (its path and any ``user:password@`` are the
        adapter's business); ``transport``: the connections to use instead (a test's)."""
        parts = urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ConfigError(f"provider {name}: not an http(s) URL")
        if max_connections < 1:
            raise ConfigError(f"provider {name}: max_connections must be at least 1")
        self.name = name
        self._timeout_s = timeout_s
        https = parts.scheme == "https"
        self._host = parts.hostname
        self._port = parts.port or (443 if https else 80)
        self._base = f"{parts.scheme}://{parts.netloc.rsplit('@', 1)[-1]}"
        self._max_connections = max_connections
        self._tls = tls_context(ca_file) if https else None
        # httpx wants a context even for http:// (where it is never used); made here, not per loop
        self._httpx_tls = (self._tls or tls_context(None)) if http2 else None
        self._injected = transport
        self._transport: Transport | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        if self._httpx_tls is not None:  # made now, not inside the first send's deadline (0.5 s)
            self._transport = self._httpx()

    def _connections(self) -> Transport:
        if self._injected is not None:
            return self._injected
        loop = asyncio.get_running_loop()
        if self._transport is not None and self._loop is None:
            self._loop = loop  # made beforehand, first used now
        if self._transport is None or self._loop is not loop:
            if self._httpx_tls is not None:
                self._transport = self._httpx()
            else:
                self._transport = Http1Pool(
                    host=self._host, port=self._port, tls=self._tls, max_connections=self._max_connections,
                    max_body=MAX_BODY,
                )
            self._loop = loop
        return self._transport

    def _httpx(self) -> HttpxTransport:
        assert self._httpx_tls is not None
        return HttpxTransport(
            base_url=self._base, tls=self._httpx_tls, max_connections=self._max_connections, timeout_s=self._timeout_s
        )

    async def post(self, target: str, headers: Sequence[tuple[str, str]], body: bytes) -> HttpReply:
        """``target``: the path (and query) on the provider's host."""
        try:
            return await self._connections().post(target, headers, body)
        except TransportError as exc:
            raise ProviderRetryableError(self.name, exc.reason) from None

    async def aclose(self) -> None:
        transport, self._transport = self._transport, None
        if transport is not None:
            await transport.aclose()
