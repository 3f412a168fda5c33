"""A provider behind an HTTP API: POST JSON, the message key as the idempotency key."""

from __future__ import annotations

import http.client
import json
import urllib.error
import urllib.request
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from pydantic import SecretStr

from operators.records import Channel
from senders.errors import ProviderPermanentError, ProviderRetryableError
from senders.providers.base import Provider
from senders.runtime.metrics import Metrics

IDEMPOTENCY_HEADER = "Idempotency-Key"

#: the one 4xx that is retried (the contract: 2xx sent, 429/5xx/timeout transient, other 4xx
#: permanent)
RETRYABLE_4XX = frozenset({429})
#: permanent 4xx replies that are not about the address (our credentials, the request, the
#: message): dead-lettered, but the address stays active, so a bad API key cannot silence users
MESSAGE_4XX = frozenset({401, 403, 407, 408, 413, 415, 425})


@dataclass(frozen=True, slots=True)
class HttpReply:
    status: int
    headers: Mapping[str, str]
    body: bytes


Transport = Callable[[urllib.request.Request, float], HttpReply]


def urllib_transport(request: urllib.request.Request, timeout_s: float) -> HttpReply:
    """The default transport (stdlib); a non-2xx reply is a reply, not an exception."""
    try:
        with urllib.request.urlopen(request, timeout=timeout_s) as resp:  # noqa: S310 - configured URL
            return HttpReply(resp.status, dict(resp.headers.items()), resp.read())
    except urllib.error.HTTPError as exc:
        return HttpReply(exc.code, dict(exc.headers.items()) if exc.headers else {}, exc.read() or b"")


def _retry_after_s(headers: Mapping[str, str]) -> float | None:
    for name, value in headers.items():
        if name.lower() == "retry-after":
            try:
                return max(0.0, float(value))
            except ValueError:
                return None  # an HTTP date: the backoff decides
    return None


class HttpProvider(Provider):
    """``POST <url>`` with ``{"message_key", "channel", "to", "template_id", "params"}``.

    2xx: sent (``id`` of a JSON reply is the reference). 429, 5xx, a timeout or a connection
    error: transient (Retry-After honoured). Any other 4xx: permanent. 401/403/407/408/413/415/425
    do not blame the address (a rejected credential must not deactivate every address it meets):
    dead-lettered with the address kept active; the rest deactivate the address.
    """

    def __init__(
        self,
        *,
        name: str,
        url: str,
        timeout_s: float,
        token: SecretStr | None = None,
        transport: Transport = urllib_transport,
        metrics: Metrics | None = None,
    ) -> None:
        super().__init__(name=name, metrics=metrics)
        self.url = url
        self.timeout_s = timeout_s
        self._token = token
        self._transport = transport

    def _try_send(
        self, *, to: str, message_key: str, channel: Channel, template_id: str, params: Mapping[str, str]
    ) -> str | None:
        body = json.dumps(
            {
                "message_key": message_key,
                "channel": channel.value,
                "to": to,
                "template_id": template_id,
                "params": dict(params),
            }
        ).encode("utf-8")
        headers = {"Content-Type": "application/json", IDEMPOTENCY_HEADER: message_key}
        if self._token:
            headers["Authorization"] = f"Bearer {self._token.get_secret_value()}"
        request = urllib.request.Request(self.url, data=body, headers=headers, method="POST")
        try:
            reply = self._transport(request, self.timeout_s)
        except TimeoutError:
            raise ProviderRetryableError(self.name, f"no reply within {self.timeout_s:g} s") from None
        except (urllib.error.URLError, http.client.HTTPException, OSError) as exc:
            raise ProviderRetryableError(self.name, f"connection failed: {type(exc).__name__}") from None
        status = reply.status
        if 200 <= status < 300:
            return self._reference(reply.body)
        reason = f"HTTP {status}"  # never the body: it may echo the address
        if status in RETRYABLE_4XX or not 400 <= status < 500:
            raise ProviderRetryableError(
                self.name, reason, status_code=status, retry_after_s=_retry_after_s(reply.headers)
            )
        raise ProviderPermanentError(
            self.name, reason, status_code=status, deactivate_address=status not in MESSAGE_4XX
        )

    @staticmethod
    def _reference(body: bytes) -> str | None:
        try:
            parsed = json.loads(body) if body else None
        except ValueError:
            return None
        ref = parsed.get("id") if isinstance(parsed, dict) else None
        return str(ref) if ref is not None else None
