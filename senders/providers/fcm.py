"""Firebase Cloud Messaging, HTTP v1 (spec ``fcm``, settings ``[senders.fcm]``).

``POST {base_url}/v1/projects/{project}/messages:send`` over HTTP/2, ``Authorization: Bearer``
an OAuth2 access token of the service account (``access_token.py``), the body
``{"message": {"token", "notification": {"title", "body"}, "data": {"message_key"},
"android": {"priority", "ttl", "notification": {"tag"}}, "apns": {"headers": {...}}}}``
(``push.py`` decides priority, expiry and the collapse id). 2xx: sent; the reply's ``name`` is
the provider's message id.

Errors (the reply's ``error.status`` and the ``FcmError`` detail's ``errorCode``):

* ``UNREGISTERED``, and ``INVALID_ARGUMENT`` about the token (a ``BadRequest`` violation of
  ``message.token``, or FCM's "registration token is not valid" with no other field named): the
  address is deactivated. Another ``INVALID_ARGUMENT`` (our payload) is permanent, the address kept.
* ``QUOTA_EXCEEDED`` / 429, ``UNAVAILABLE`` / ``INTERNAL`` / 5xx: transient, ``Retry-After`` kept.
* 401: the access token is fetched again and the message sent once more; a second 401, a 403
  (``SENDER_ID_MISMATCH``, ``PERMISSION_DENIED``) or ``THIRD_PARTY_AUTH_ERROR`` (FCM's APNs or web
  push credentials) refuse our credentials: permanent, counted for the alert, never a deactivation.
* Any other 4xx: permanent, the address kept.
"""

from __future__ import annotations

import json
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from operators.errors import ConfigError
from senders.errors import ProviderPermanentError, ProviderRetryableError
from senders.providers.access_token import AccessToken, AccessTokens, Clock, TokenEndpoint
from senders.providers.base import Provider
from senders.providers.credentials import ServiceAccount
from senders.providers.endpoint import MAX_REFERENCE, Transport, reply_retry_after_s
from senders.providers.h2 import http2_transport, origin_and_path
from senders.providers.http1 import HttpReply, TransportError
from senders.providers.push import (
    PushOptions,
    android_priority,
    apns_priority,
    collapse_id,
    push_content,
)
from senders.runtime.metrics import Metrics
from senders.templates.render import Rendered

FCM_ERROR = "type.googleapis.com/google.firebase.fcm.v1.FcmError"
BAD_REQUEST = "type.googleapis.com/google.rpc.BadRequest"
TOKEN_FIELD = "message.token"
#: FCM error codes that refuse our credentials or identity (with 401/403 after a refresh)
CREDENTIAL_CODES = frozenset({"SENDER_ID_MISMATCH", "THIRD_PARTY_AUTH_ERROR", "PERMISSION_DENIED", "UNAUTHENTICATED"})
#: the error codes (and statuses) worth another attempt later
RETRYABLE_CODES = frozenset({"QUOTA_EXCEEDED", "UNAVAILABLE", "INTERNAL", "RESOURCE_EXHAUSTED"})


@dataclass(frozen=True, slots=True)
class FcmError:
    """What an error reply says: ``code`` is the FcmError's ``errorCode`` or else the
    ``error.status``; ``on_token``: the token itself is what is invalid."""

    code: str
    on_token: bool = False

    @classmethod
    def of(cls, body: bytes) -> FcmError:
        try:
            parsed = json.loads(body) if body else None
        except ValueError:
            parsed = None
        error = parsed.get("error") if isinstance(parsed, dict) else None
        if not isinstance(error, dict):
            return cls("")
        details = [d for d in error.get("details") or () if isinstance(d, dict)]
        codes = [d.get("errorCode") for d in details if d.get("@type") == FCM_ERROR]
        code = next((c for c in codes if isinstance(c, str)), None) or str(error.get("status") or "")
        fields = [
            str(v.get("field"))
            for d in details if d.get("@type") == BAD_REQUEST
            for v in d.get("fieldViolations") or () if isinstance(v, dict)
        ]
        message = str(error.get("message") or "").lower()
        on_token = TOKEN_FIELD in fields or (
            code == "INVALID_ARGUMENT" and not fields and "registration token" in message
        )
        return cls(code if code.isascii() and len(code) <= 40 else "", on_token)


def fcm_message(*, to: str, message_key: str, message: Rendered, options: PushOptions, now_s: float,
                provider: str = "fcm") -> dict[str, Any]:
    """The ``messages:send`` body; raises ProviderPermanentError for a message that lapsed or is
    not a push message."""
    content = push_content(provider, message)
    context = message.context
    ttl = options.time_to_live_s(provider, context, now_s)
    collapse = collapse_id(message_key)
    return {
        "message": {
            "token": to,
            "notification": {"title": content.title, "body": content.body},
            "data": {"message_key": message_key},
            "android": {"priority": android_priority(context), "ttl": f"{ttl}s", "notification": {"tag": collapse}},
            "apns": {"headers": {
                "apns-priority": str(apns_priority(context)),
                "apns-expiration": str(int(options.expires_at_s(context, now_s))),
                "apns-collapse-id": collapse,
            }},
        }
    }


def outcome(provider: str, reply: HttpReply) -> str | None:
    """The provider's message id of a 2xx reply; raises the ProviderError of any other."""
    status = reply.status
    if 200 <= status < 300:
        return _reference(reply.body)
    error = FcmError.of(reply.body)
    reason = f"HTTP {status} {error.code}".rstrip()  # never the message: it may quote the token
    if status in (401, 403) or error.code in CREDENTIAL_CODES:
        raise ProviderPermanentError(provider, reason, status_code=status, credentials=True)
    if status == 429 or status >= 500 or error.code in RETRYABLE_CODES:
        hint = reply_retry_after_s(reply.headers)
        raise ProviderRetryableError(provider, reason, status_code=status, retry_after_s=hint)
    deactivate = error.code == "UNREGISTERED" or (error.code == "INVALID_ARGUMENT" and error.on_token)
    raise ProviderPermanentError(provider, reason, status_code=status, deactivate_address=deactivate)


def _reference(body: bytes) -> str | None:
    try:
        parsed = json.loads(body) if body else None
    except ValueError:
        return None
    name = parsed.get("name") if isinstance(parsed, dict) else None
    return name if isinstance(name, str) and 0 < len(name) <= MAX_REFERENCE else None


class FcmProvider(Provider):
    """FCM HTTP v1 for one project, its access token shared by every call."""

    protocol = "fcm-http-v1"
    deadline_setting = "http_timeout_ms"

    def __init__(
        self,
        *,
        name: str,
        account: ServiceAccount,
        project_id: str = "",
        base_url: str = "https://fcm.googleapis.com",
        timeout_s: float,
        ca_file: str | None = None,
        options: PushOptions | None = None,
        metrics: Metrics | None = None,
        max_connections: int = 100,
        streams_per_connection: int = 100,
        clock: Clock = time.time,
        transport: Transport | None = None,
        token_transport: Transport | None = None,
    ) -> None:
        """``project_id``: empty, the key's; ``clock``: epoch seconds (the tokens' and the
        expiry's); ``transport`` / ``token_transport``: connections to use instead (a test's)."""
        super().__init__(name=name, metrics=metrics)
        self.timeout_s: float = timeout_s
        project = project_id or account.project_id
        if not project:
            raise ConfigError(f"provider {name}: no project (senders.fcm.project_id, or the key's project_id)")
        origin, prefix = origin_and_path(f"provider {name}: senders.fcm.base_url", base_url)
        self._target = f"{prefix}/v1/projects/{project}/messages:send"
        self._options = options or PushOptions()
        self._clock = clock
        self._endpoint = TokenEndpoint(provider=name, account=account, timeout_s=timeout_s, ca_file=ca_file,
                                       clock=clock, transport=token_transport)
        self.tokens = AccessTokens(self._endpoint.fetch, clock)
        self._transport = transport or http2_transport(
            origin=origin, ca_file=ca_file, max_connections=max_connections, timeout_s=timeout_s,
            streams=streams_per_connection, http1=True
        )

    def __repr__(self) -> str:
        return f"FcmProvider({self.name!r})"

    async def aclose(self) -> None:
        await self._transport.aclose()
        await self._endpoint.aclose()

    async def _try_send(self, *, to: str, message_key: str, message: Rendered) -> str | None:
        body = json.dumps(
            fcm_message(to=to, message_key=message_key, message=message, options=self._options,
                        now_s=self._clock(), provider=self.name),
            ensure_ascii=False,
        ).encode("utf-8")
        token = await self.tokens.get()
        reply = await self._post(token, body)
        if reply.status == 401 and FcmError.of(reply.body).code != "THIRD_PARTY_AUTH_ERROR":
            reply = await self._post(await self.tokens.refresh(token), body)  # once; a second 401 is final
        return outcome(self.name, reply)

    async def _post(self, token: AccessToken, body: bytes) -> HttpReply:
        headers: Mapping[str, str] = {
            "Content-Type": "application/json; charset=UTF-8",
            "Authorization": f"Bearer {token.value.get_secret_value()}",
        }
        try:
            return await self._transport.post(self._target, list(headers.items()), body)
        except TransportError as exc:
            raise ProviderRetryableError(self.name, exc.reason) from None
