"""A provider behind this project's own HTTP contract: POST JSON, the message key as the
idempotency key. Its connections (HTTP/1.1 keep-alive or HTTP/2, redirects never followed, TLS
verified): ``senders.providers.endpoint``; each send has one deadline (``Provider.send``).
"""

from __future__ import annotations

import base64
from urllib.parse import unquote, urlsplit

import orjson
from pydantic import SecretStr

from senders.errors import ProviderPermanentError, ProviderRetryableError
from senders.policy.recipients import RecipientRules
from senders.providers.base import Provider
from senders.providers.endpoint import Endpoint, Transport, header_value, reference, reply_retry_after_s
from senders.runtime.metrics import Metrics
from senders.templates.render import Rendered

IDEMPOTENCY_HEADER = "Idempotency-Key"

#: 4xx replies that are retried (the contract: 2xx sent, 408/425/429/5xx/timeout transient,
#: other 4xx permanent)
RETRYABLE_4XX = frozenset({408, 425, 429})
#: the answers of this project's HTTP contract that say the address itself is invalid
DEFAULT_INVALID_RECIPIENT = "400:invalid_recipient,404:invalid_recipient,410"


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

    protocol = "http"

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
        self.timeout_s: float = timeout_s
        self._endpoint = Endpoint(
            name=name, url=url, timeout_s=timeout_s, ca_file=ca_file, max_connections=max_connections, http2=http2,
            transport=transport,
        )
        parts = urlsplit(url)
        self._target = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
        self._auth: SecretStr | None = None
        if token is not None:
            self._auth = SecretStr(header_value(f"Bearer {token.get_secret_value()}"))
        elif parts.username:
            basic = base64.b64encode(f"{unquote(parts.username)}:{unquote(parts.password or '')}".encode()).decode()
            self._auth = SecretStr(f"Basic {basic}")

    def __repr__(self) -> str:
        return f"HttpProvider({self.name!r})"

    async def aclose(self) -> None:
        await self._endpoint.aclose()

    async def _try_send(self, *, to: str, message_key: str, message: Rendered) -> str | None:
        body = orjson.dumps(
            {
                "message_key": message_key,
                "channel": message.channel.value,
                "to": to,
                "template": message.template,
                "template_version": message.version,
                "locale": message.locale,
                **message.fields(),
            }
        )
        try:
            headers = [("Content-Type", "application/json"), (IDEMPOTENCY_HEADER, header_value(message_key))]
        except ValueError:
            raise ProviderPermanentError(
                self.name, "the message key cannot be an Idempotency-Key header", deactivate_address=False
            ) from None
        if self._auth is not None:
            headers.append(("Authorization", self._auth.get_secret_value()))
        reply = await self._endpoint.post(self._target, headers, body)
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
                self.name, reason, status_code=status, retry_after_s=reply_retry_after_s(reply.headers)
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
            parsed = orjson.loads(body) if body else None
        except ValueError:  # orjson's JSONDecodeError is one
            return None
        if not isinstance(parsed, dict):
            return None
        return reference(parsed.get("id", parsed.get("message_id")))
