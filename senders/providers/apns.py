"""Apple Push Notification service, token-based authentication (spec ``apns``, settings
``[senders.apns]``).

``POST {base_url}/3/device/{token}`` over HTTP/2 (TLS only at Apple), ``authorization: bearer``
a provider token (an ES256 JWT of the team id and key id, ``credentials.ProviderTokens``), the
headers ``apns-topic`` (the bundle id), ``apns-push-type: alert``, ``apns-priority``,
``apns-expiration``, ``apns-collapse-id`` and ``apns-id`` (derived from the message key: a repeat
carries the same id, which is kept as the provider's message id), the body
``{"aps": {"alert": {"title", "body"}}, "message_key": ...}``.

Answers (status and the JSON ``reason``):

* 200: sent.
* 410 (``Unregistered``, ``ExpiredToken``) and 400 ``BadDeviceToken``: the address is deactivated.
* 429 (``TooManyRequests``, ``TooManyProviderTokenUpdates``) and 5xx: transient (``Retry-After``
  kept if given).
* 403 ``ExpiredProviderToken``: the token is renewed (unless it is younger than the 20 minutes
  APNs allows between renewals) and the message sent once more; expired again, or any other
  403 (``InvalidProviderToken``, ``MissingProviderToken``, ...): our credentials are refused
  (permanent, counted for the alert, never a deactivation).
* Any other 4xx (``BadTopic``, ``DeviceTokenNotForTopic``, ``PayloadTooLarge``, ...): permanent,
  the address kept.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from urllib.parse import quote

from operators.errors import ConfigError
from senders.errors import ProviderPermanentError, ProviderRetryableError
from senders.providers.base import Provider
from senders.providers.credentials import ApnsSigningKey, ProviderToken, ProviderTokens
from senders.providers.endpoint import Transport, reply_retry_after_s
from senders.providers.h2 import http2_transport, origin_and_path
from senders.providers.http1 import HttpReply, TransportError
from senders.providers.push import PushOptions, apns_priority, collapse_id, message_id, push_content
from senders.runtime.metrics import Metrics
from senders.templates.render import Rendered

EXPIRED_TOKEN = "ExpiredProviderToken"
#: the answers that say the device token is no good
INVALID_TOKEN_REASONS = frozenset({"BadDeviceToken"})
MAX_REASON = 40


def apns_headers(*, message_key: str, message: Rendered, topic: str, options: PushOptions, now_s: float,
                 provider: str = "apns") -> list[tuple[str, str]]:
    """The request's headers but ``authorization``; raises ProviderPermanentError for a message
    that lapsed."""
    context = message.context
    options.time_to_live_s(provider, context, now_s)
    return [
        ("apns-topic", topic),
        ("apns-push-type", "alert"),
        ("apns-priority", str(apns_priority(context))),
        ("apns-expiration", str(int(options.expires_at_s(context, now_s)))),
        ("apns-collapse-id", collapse_id(message_key)),
        ("apns-id", message_id(message_key)),
        ("content-type", "application/json"),
    ]


def apns_payload(*, message_key: str, message: Rendered, provider: str = "apns") -> bytes:
    content = push_content(provider, message)
    body = {"aps": {"alert": {"title": content.title, "body": content.body}}, "message_key": message_key}
    return json.dumps(body, ensure_ascii=False, separators=(",", ":")).encode("utf-8")


def reason_of(body: bytes) -> str:
    try:
        parsed = json.loads(body) if body else None
    except ValueError:
        return ""
    reason = parsed.get("reason") if isinstance(parsed, dict) else None
    return reason if isinstance(reason, str) and reason.isascii() and len(reason) <= MAX_REASON else ""


def outcome(provider: str, reply: HttpReply, sent_id: str) -> str:
    """The provider's message id of a 200: the ``apns-id`` sent (APNs echoes it; ours is the same
    on every attempt); raises the ProviderError of any other answer."""
    status = reply.status
    if status == 200:
        return sent_id
    reason = reason_of(reply.body)
    text = f"HTTP {status} {reason}".rstrip()
    if status == 410 or (status == 400 and reason in INVALID_TOKEN_REASONS):
        raise ProviderPermanentError(provider, text, status_code=status, deactivate_address=True)
    if status == 429 or status >= 500:
        hint = reply_retry_after_s(reply.headers)
        raise ProviderRetryableError(provider, text, status_code=status, retry_after_s=hint)
    if status == 403:
        raise ProviderPermanentError(provider, text, status_code=status, credentials=True)
    raise ProviderPermanentError(provider, text, status_code=status, deactivate_address=False)


class ApnsProvider(Provider):
    """APNs for one app (topic), its provider token shared by every call."""

    protocol = "apns-http2"
    deadline_setting = "http_timeout_ms"

    def __init__(
        self,
        *,
        name: str,
        key: ApnsSigningKey,
        topic: str,
        base_url: str = "https://api.push.apple.com",
        timeout_s: float,
        ca_file: str | None = None,
        options: PushOptions | None = None,
        metrics: Metrics | None = None,
        max_connections: int = 100,
        streams_per_connection: int = 100,
        clock: Callable[[], float] = time.time,
        transport: Transport | None = None,
    ) -> None:
        """``clock``: epoch seconds (the provider token's ``iat``, the expiry); ``transport``:
        connections to use instead (a test's)."""
        super().__init__(name=name, metrics=metrics)
        if not topic or not topic.isascii() or not topic.isprintable():
            raise ConfigError(f"provider {name}: senders.apns.topic (the app's bundle id) is required")
        origin, self._prefix = origin_and_path(f"provider {name}: senders.apns.base_url", base_url)
        self.timeout_s: float = timeout_s
        self._topic = topic
        self._options = options or PushOptions()
        self._clock = clock
        self.tokens = ProviderTokens(key)
        self._transport = transport or http2_transport(
            origin=origin, ca_file=ca_file, max_connections=max_connections, timeout_s=timeout_s,
            streams=streams_per_connection
        )

    def __repr__(self) -> str:
        return f"ApnsProvider({self.name!r})"

    async def aclose(self) -> None:
        await self._transport.aclose()

    async def _try_send(self, *, to: str, message_key: str, message: Rendered) -> str | None:
        now = self._clock()
        headers = apns_headers(message_key=message_key, message=message, topic=self._topic,
                               options=self._options, now_s=now, provider=self.name)
        body = apns_payload(message_key=message_key, message=message, provider=self.name)
        target = f"{self._prefix}/3/device/{quote(to, safe='')}"
        token = self.tokens.current(now)
        reply = await self._post(target, token, headers, body)
        if reply.status == 403 and reason_of(reply.body) == EXPIRED_TOKEN:
            renewed = self.tokens.renew(token, self._clock())
            if renewed is None:
                raise ProviderPermanentError(
                    self.name, f"HTTP 403 {EXPIRED_TOKEN} for a token made less than 20 minutes ago (check the clock)",
                    status_code=403, credentials=True,
                )
            reply = await self._post(target, renewed, headers, body)  # once; expired again is final
        return outcome(self.name, reply, dict(headers)["apns-id"])

    async def _post(self, target: str, token: ProviderToken, headers: list[tuple[str, str]], body: bytes) -> HttpReply:
        try:
            return await self._transport.post(target, [("authorization", f"bearer {token.value}"), *headers], body)
        except TransportError as exc:
            raise ProviderRetryableError(self.name, exc.reason) from None
