"""FCM's OAuth2 access token: exchanged for a signed assertion at the service account's
``token_uri`` (``grant_type=urn:ietf:params:oauth:grant-type:jwt-bearer``), cached until shortly
before it expires, fetched once for every call that waits for it.

The fetch runs as a task of its own (shielded): a call whose deadline passes while it waits
leaves the fetch going for the others. A fetch that failed is not cached: the next call tries
again. The endpoint's answers: 2xx with ``access_token`` and ``expires_in``; 400/401 (an OAuth2
error: ``invalid_grant``, ``invalid_client``: the key was revoked or is wrong) refuse our
credentials (permanent, an alert); 429, 5xx, a timeout or a connection error are transient.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from urllib.parse import urlencode

from pydantic import SecretStr

from senders.errors import ProviderPermanentError, ProviderRetryableError
from senders.providers.credentials import JWT_BEARER, ServiceAccount
from senders.providers.endpoint import Transport
from senders.providers.h2 import http2_transport, origin_and_path
from senders.providers.http1 import TransportError

Clock = Callable[[], float]
#: a token is renewed this long before it expires (at most: a tenth of its lifetime if shorter)
REFRESH_MARGIN_S = 300.0
#: the longest OAuth2 error code kept for a reason (the endpoint's text is never kept)
MAX_ERROR_CODE = 40


@dataclass(frozen=True)
class AccessToken:
    value: SecretStr
    expires_at_s: float
    refresh_at_s: float = field(default=0.0)

    @classmethod
    def lasting(cls, value: str, expires_in_s: float, now_s: float) -> AccessToken:
        margin = min(REFRESH_MARGIN_S, expires_in_s / 10)
        return cls(SecretStr(value), now_s + expires_in_s, now_s + expires_in_s - margin)


class AccessTokens:
    """The access token in use; ``fetch`` gets a new one (raises ProviderError)."""

    def __init__(self, fetch: Callable[[], Awaitable[AccessToken]], clock: Clock = time.time) -> None:
        self._fetch = fetch
        self._clock = clock
        self._token: AccessToken | None = None
        self._task: asyncio.Task[AccessToken] | None = None
        #: tokens fetched so far
        self.fetched = 0

    async def get(self) -> AccessToken:
        token = self._token
        if token is not None and self._clock() < token.refresh_at_s:
            return token
        return await self._fetched()

    async def refresh(self, rejected: AccessToken) -> AccessToken:
        """A token in place of one the server refused (401): a new one, unless another call
        got one already."""
        if self._token is rejected:
            self._token = None
        return await self.get()

    async def _fetched(self) -> AccessToken:
        task = self._task
        if task is None or task.get_loop() is not asyncio.get_running_loop():
            task = self._task = asyncio.get_running_loop().create_task(self._fetch_once())
        return await asyncio.shield(task)

    async def _fetch_once(self) -> AccessToken:
        try:
            token = await self._fetch()
            self._token = token
            self.fetched += 1
            return token
        finally:
            self._task = None


class TokenEndpoint:
    """The service account's ``token_uri``: POSTs the assertion, reads the token."""

    def __init__(
        self,
        *,
        provider: str,
        account: ServiceAccount,
        timeout_s: float,
        ca_file: str | None,
        clock: Clock = time.time,
        transport: Transport | None = None,
    ) -> None:
        self._provider = provider
        self._account = account
        self._clock = clock
        origin, path = origin_and_path(f"{provider}: the service account's token_uri", account.token_uri)
        self._target = path or "/"
        self._transport = transport or http2_transport(
            origin=origin, ca_file=ca_file, max_connections=4, timeout_s=timeout_s, http1=True
        )

    async def fetch(self) -> AccessToken:
        now = self._clock()
        body = urlencode({"grant_type": JWT_BEARER, "assertion": self._account.assertion(now)}).encode("ascii")
        headers = [("Content-Type", "application/x-www-form-urlencoded")]
        name = self._provider
        try:
            reply = await self._transport.post(self._target, headers, body)
        except TransportError as exc:
            raise ProviderRetryableError(name, f"token endpoint: {exc.reason}") from None
        except TimeoutError:
            raise ProviderRetryableError(name, "token endpoint: no reply in time") from None
        status = reply.status
        if status == 429 or status >= 500:
            raise ProviderRetryableError(name, f"token endpoint: HTTP {status}", status_code=status)
        parsed = _json(reply.body)
        if 200 <= status < 300:
            value, expires_in = parsed.get("access_token"), parsed.get("expires_in")
            if not isinstance(value, str) or not value or not value.isascii() or not value.isprintable() \
                    or isinstance(expires_in, bool) or not isinstance(expires_in, int | float) or expires_in <= 0:
                raise ProviderRetryableError(name, "token endpoint: a reply without access_token and expires_in")
            return AccessToken.lasting(value, float(expires_in), self._clock())
        code = parsed.get("error")
        code = code if isinstance(code, str) and code.isascii() and len(code) <= MAX_ERROR_CODE else "no error code"
        raise ProviderPermanentError(
            name, f"token endpoint refused the service account: HTTP {status} ({code})", status_code=status,
            credentials=True,
        )

    async def aclose(self) -> None:
        await self._transport.aclose()


def _json(body: bytes) -> dict[str, object]:
    try:
        parsed = json.loads(body) if body else {}
    except ValueError:
        return {}
    return parsed if isinstance(parsed, dict) else {}
