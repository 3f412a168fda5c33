"""A provider behind an HTTP API: POST JSON, the message key as the idempotency key.

HTTP/1.1 on the providers' own keep-alive connections (``senders.providers.http1``: httpx's
connection pool cost 6.6 ms of CPU a call at 200 in flight here), or httpx's ``AsyncClient``
with HTTP/2 for a provider that speaks it (``senders.http2``). Either way a redirect is an
answer, never followed (urllib used to re-send a POST as a GET, ``Authorization`` included, to
wherever the ``Location`` pointed, and report that host's 2xx as sent); TLS is verified against
the system's CAs or ``ca_file``; each send has one deadline (``Provider.send``).
"""

from __future__ import annotations

import asyncio
import base64
import json
import math
import ssl
import time
from collections.abc import Mapping, Sequence
from email.utils import parsedate_to_datetime
from typing import Protocol
from urllib.parse import unquote, urlsplit

import httpx
from pydantic import SecretStr

from operators.errors import ConfigError
from senders.errors import ProviderPermanentError, ProviderRetryableError
from senders.policy.recipients import RecipientRules
from senders.providers.base import Provider
from senders.providers.http1 import Http1Pool, HttpReply, TransportError, connection_reason
from senders.providers.tls import tls_context
from senders.runtime.metrics import Metrics
from senders.templates.render import Rendered

IDEMPOTENCY_HEADER = "Idempotency-Key"
#: the most of a reply body read (for its ``id``); the rest is not needed
MAX_BODY = 64 * 1024
#: the longest provider message id kept (a longer one is no id of ours to look up)
MAX_REFERENCE = 256

#: 4xx replies that are retried (the contract: 2xx sent, 408/425/429/5xx/timeout transient,
#: other 4xx permanent)
RETRYABLE_4XX = frozenset({408, 425, 429})
#: the answers of this project's HTTP contract that say the address itself is invalid
DEFAULT_INVALID_RECIPIENT = "400:invalid_recipient,404:invalid_recipient,410"


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


def retry_after_hint(headers: Mapping[str, str]) -> float | None:
    """The reply's Retry-After, if it has a valid one; ``headers``' names in lower case."""
    value = headers.get("retry-after")
    return None if value is None else retry_after_s(value)


def _header_value(value: str) -> str:
    """A header value as sent: no line breaks (a message key is data: it must not add headers)."""
    if any(c in value for c in "\r\n\0") or not value.isascii():
        raise ValueError("not a valid header value")
    return value


class Transport(Protocol):
    """Where an HttpProvider's POSTs go (its connections): raises TransportError without a reply."""

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


class HttpProvider(Provider):
    """``POST <url>`` with ``{"message_key", "channel", "to", "template", "template_version",
    "locale", ...}`` and the rendered parts (push: ``title``, ``body``; SMS: ``text``,
    ``encoding``, ``segments``; email: ``subject``, ``text``, ``html``).

    2xx: sent; ``id`` (or ``message_id``) of a JSON reply is the provider's message id, recorded
    with the status so that its delivery receipts find the message. 408, 425, 429, 5xx, a timeout or a
    connection error: transient (Retry-After honoured). 3xx: permanent (the URL is wrong: not
    followed). Any other 4xx: permanent. Only an answer of ``invalid_recipient`` (by default
    ``410``, or 400/404 whose body says ``invalid_recipient``) deactivates the address: a wrong
    URL's 404 or a rejected credential must not silence every address it meets.
    ``user:password@`` in the URL is sent as Basic authentication (unless a bearer ``token`` is
    set) and shown nowhere.
    """

    deadline_setting = "http_timeout_ms"

    def __init__(
        self,
        *,
        name: str,
        url: str,
        timeout_s: float,
        token: SecretStr | None = None,
        ca_file: str | None = None,
        invalid_recipient: RecipientRules | None = None,
        metrics: Metrics | None = None,
        max_connections: int = 100,
        http2: bool = False,
        transport: Transport | None = None,
    ) -> None:
        """``max_connections``: the most connections (so calls) open at once; ``http2``: speak
        HTTP/2 through httpx; ``transport``: the connections to use instead (a test's)."""
        super().__init__(name=name, metrics=metrics)
        self.invalid_recipient = invalid_recipient or RecipientRules.parse(DEFAULT_INVALID_RECIPIENT)
        parts = urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ConfigError(f"provider {name}: not an http(s) URL")
        if max_connections < 1:
            raise ConfigError(f"provider {name}: max_connections must be at least 1")
        self.timeout_s: float = timeout_s
        self._https = parts.scheme == "https"
        self._host = parts.hostname
        self._port = parts.port or (443 if self._https else 80)
        self._base = f"{parts.scheme}://{parts.netloc.rsplit('@', 1)[-1]}"
        self._target = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
        self._max_connections = max_connections
        self._auth: SecretStr | None = None
        if token is not None:
            self._auth = SecretStr(_header_value(f"Bearer {token.get_secret_value()}"))
        elif parts.username:
            basic = base64.b64encode(f"{unquote(parts.username)}:{unquote(parts.password or '')}".encode()).decode()
            self._auth = SecretStr(f"Basic {basic}")
        self._tls = tls_context(ca_file) if self._https else None
        # httpx wants a context even for http:// (where it is never used); made here, not per loop
        self._httpx_tls = (self._tls or tls_context(None)) if http2 else None
        self._injected = transport
        self._transport: Transport | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        if self._httpx_tls is not None:  # made now, not inside the first send's deadline (0.5 s)
            self._transport = self._httpx()

    def __repr__(self) -> str:
        return f"HttpProvider({self.name!r})"

    def _connections(self) -> Transport:
        """The transport of the running event loop (made on first use: the pool's loop runs in
        its own thread, started after the providers are built)."""
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
            base_url=self._base, tls=self._httpx_tls, max_connections=self._max_connections, timeout_s=self.timeout_s
        )

    async def aclose(self) -> None:
        transport, self._transport = self._transport, None
        if transport is not None:
            await transport.aclose()

    async def _try_send(self, *, to: str, message_key: str, message: Rendered) -> str | None:
        body = json.dumps(
            {
                "message_key": message_key,
                "channel": message.channel.value,
                "to": to,
                "template": message.template,
                "template_version": message.version,
                "locale": message.locale,
                **message.fields(),
            },
            ensure_ascii=False,
        ).encode("utf-8")
        try:
            headers = [("Content-Type", "application/json"), (IDEMPOTENCY_HEADER, _header_value(message_key))]
        except ValueError:
            raise ProviderPermanentError(
                self.name, "the message key cannot be an Idempotency-Key header", deactivate_address=False
            ) from None
        if self._auth is not None:
            headers.append(("Authorization", self._auth.get_secret_value()))
        try:
            reply = await self._connections().post(self._target, headers, body)
        except TransportError as exc:
            raise ProviderRetryableError(self.name, exc.reason) from None
        status = reply.status
        if 200 <= status < 300:
            return self._reference(reply.body)
        reason = f"HTTP {status}"  # never the body: it may echo the address
        if 300 <= status < 400:
            raise ProviderPermanentError(
                self.name, f"{reason} (a redirect: not followed)", status_code=status, deactivate_address=False
            )
        if status in RETRYABLE_4XX or not 400 <= status < 500:
            raise ProviderRetryableError(
                self.name, reason, status_code=status, retry_after_s=retry_after_hint(reply.headers)
            )
        raise ProviderPermanentError(
            self.name,
            reason,
            status_code=status,
            deactivate_address=self.invalid_recipient.matches_http(status, reply.body),
        )

    @staticmethod
    def _reference(body: bytes) -> str | None:
        try:
            parsed = json.loads(body) if body else None
        except ValueError:
            return None
        if not isinstance(parsed, dict):
            return None
        ref = parsed.get("id", parsed.get("message_id"))
        if isinstance(ref, bool) or not isinstance(ref, str | int) or not str(ref) or len(str(ref)) > MAX_REFERENCE:
            return None
        return str(ref)
