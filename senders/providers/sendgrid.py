"""Email through SendGrid's v3 mail send API: ``POST {base}/v3/mail/send`` with a bearer API key
and a JSON body (one personalization: the recipient, the message key as the custom argument
``notify_message_key`` that its event webhook echoes back; the rendered subject, plain text and
HTML; the ``X-Notify-Message-Key`` header; on every marketing email ``List-Unsubscribe`` and
``List-Unsubscribe-Post: List-Unsubscribe=One-Click``). Its reply is ``202`` with the message
id in ``X-Message-Id``, which its signed events name (``api.receipts.sendgrid``).

Why SendGrid's API as the model: it is the most widely used of the email APIs, its event
webhook is signed with a public key (ECDSA: the API holds no secret that could forge events),
and its events carry custom arguments, so a receipt names our message key as well as the
provider's id. Postmark and Mailgun differ in field names, not in kind.

Its answers (``https://www.twilio.com/docs/sendgrid/api-reference/mail-send``):

* 2xx: sent.
* 400 whose errors name the recipient's address (``personalizations.N.to.M.email``) as not
  valid: permanent, the address deactivated; any other 400 (our request is wrong): permanent,
  the address kept (``senders.invalid_recipient_rules`` for ``sendgrid`` replaces the rule).
* 401, 403 (the key is wrong or lacks the mail-send permission): permanent for the message, the
  address kept; every message fails so, the breaker opens and an alert fires.
* 408, 429, 5xx, a timeout or no reply: retried, honouring ``Retry-After`` (or the reset time
  of ``X-RateLimit-Reset``).
* any other 4xx (413 too large, ...): permanent, the address kept.
"""

from __future__ import annotations

import json
import time
from typing import Any
from urllib.parse import urlsplit

from pydantic import SecretStr

from operators.errors import ConfigError
from operators.records import Category
from senders.errors import ProviderPermanentError, ProviderRetryableError
from senders.policy import unsubscribe
from senders.policy.recipients import RecipientRules
from senders.providers.base import Provider
from senders.providers.endpoint import Endpoint, Transport, header_value, reference, reply_retry_after_s
from senders.runtime.metrics import Metrics
from senders.templates.render import EmailContent, Rendered

#: the provider spec (and so its name: ``senders.email_primary = "sendgrid"``, ``POST /webhooks/sendgrid``)
SPEC = "sendgrid"
MAIL_SEND = "/v3/mail/send"
#: the custom argument that carries the message key (its events echo it)
MESSAGE_KEY_ARG = "notify_message_key"
#: the email header that carries it (a mailbox, or support, can tell a repeat)
MESSAGE_KEY_HEADER = "X-Notify-Message-Key"
RETRYABLE_STATUS = frozenset({408, 429})


def invalid_recipient(body: bytes) -> bool:
    """A 400 whose errors say the recipient's address is not valid (``{"errors": [{"field":
    "personalizations.0.to.0.email", "message": "Does not contain a valid address."}]}``)."""
    try:
        parsed = json.loads(body) if body else None
    except ValueError:
        return False
    errors = parsed.get("errors") if isinstance(parsed, dict) else None
    for error in errors if isinstance(errors, list) else ():
        if not isinstance(error, dict):
            continue
        field, message = error.get("field"), error.get("message")
        if not isinstance(field, str) or not isinstance(message, str):
            continue
        parts = field.split(".")
        recipient = (len(parts) == 5 and parts[0] == "personalizations" and parts[1].isdigit() and parts[2] == "to"
                     and parts[3].isdigit() and parts[4] == "email")
        if recipient and "valid" in message.lower():
            return True
    return False


def _rate_limit_reset_s(headers: dict[str, str]) -> float | None:
    """``X-RateLimit-Reset`` (Unix seconds) as seconds from now."""
    value = headers.get("x-ratelimit-reset", "").strip()
    if not value.isascii() or not value.isdigit() or len(value) > 12:
        return None
    return max(0.0, int(value) - time.time())


class SendGridProvider(Provider):
    """One SendGrid account: its ``api_key`` (a secret), the ``sender`` address, and the
    unsubscribe link's base URL and signing key (required: every marketing email carries it)."""

    protocol = "sendgrid-v3"
    deadline_setting = "http_timeout_ms"

    def __init__(
        self,
        *,
        name: str,
        api_key: SecretStr | None,
        sender: str,
        timeout_s: float,
        unsubscribe_url: str,
        unsubscribe_key: bytes | None,
        base_url: str = "https://api.sendgrid.com",
        ca_file: str | None = None,
        invalid_recipient: RecipientRules | None = None,
        metrics: Metrics | None = None,
        max_connections: int = 100,
        http2: bool = False,
        transport: Transport | None = None,
    ) -> None:
        super().__init__(name=name, metrics=metrics)
        if api_key is None or not api_key.get_secret_value():
            raise ConfigError(f"provider {name}: set [senders.sendgrid] api_key")
        if not sender:
            raise ConfigError(f"provider {name}: set [senders.sendgrid] sender (or senders.smtp_from)")
        if not unsubscribe_url or not unsubscribe_key:
            raise ConfigError(
                f"provider {name}: set senders.unsubscribe_url and senders.unsubscribe_secrets (every marketing"
                " email carries a one-click unsubscribe link)"
            )
        try:
            self._auth = SecretStr(header_value(f"Bearer {api_key.get_secret_value()}"))
        except ValueError:
            raise ConfigError(f"provider {name}: [senders.sendgrid] api_key is no valid header value") from None
        self.timeout_s: float = timeout_s
        self.invalid_recipient = invalid_recipient
        self._sender = sender
        self._unsubscribe_url = unsubscribe_url
        self._unsubscribe_key = unsubscribe_key
        self._endpoint = Endpoint(
            name=name, url=base_url, timeout_s=timeout_s, ca_file=ca_file, max_connections=max_connections,
            http2=http2, transport=transport,
        )
        self._target = urlsplit(base_url).path.rstrip("/") + MAIL_SEND

    def __repr__(self) -> str:
        return f"SendGridProvider({self.name!r})"

    async def aclose(self) -> None:
        await self._endpoint.aclose()

    def payload(self, to: str, message_key: str, message: Rendered) -> dict[str, Any]:
        """The mail send request's JSON body."""
        content = message.content
        if not isinstance(content, EmailContent):
            raise ProviderPermanentError(self.name, f"not an email: {message.channel}", deactivate_address=False)
        try:
            headers = {MESSAGE_KEY_HEADER: header_value(message_key)}
        except ValueError:
            raise ProviderPermanentError(
                self.name, "the message key cannot be an email header", deactivate_address=False
            ) from None
        context = message.context
        if context.kind is Category.MARKETING:
            if not context.user_id:
                raise ProviderPermanentError(
                    self.name, "a marketing email without its user: no unsubscribe link", deactivate_address=False
                )
            headers.update(unsubscribe.headers(self._unsubscribe_url, self._unsubscribe_key, context.user_id))
        return {
            "personalizations": [{"to": [{"email": to}], "custom_args": {MESSAGE_KEY_ARG: message_key}}],
            "from": {"email": self._sender},
            "subject": content.subject,
            "content": [{"type": "text/plain", "value": content.text}, {"type": "text/html", "value": content.html}],
            "headers": headers,
        }

    async def _try_send(self, *, to: str, message_key: str, message: Rendered) -> str | None:
        body = json.dumps(self.payload(to, message_key, message), ensure_ascii=False).encode("utf-8")
        headers = [("Content-Type", "application/json"), ("Authorization", self._auth.get_secret_value())]
        reply = await self._endpoint.post(self._target, headers, body)
        status = reply.status
        if 200 <= status < 300:
            return reference(reply.headers.get("x-message-id", "").strip())
        reason = f"HTTP {status}"  # never the body: it may echo the address
        if 300 <= status < 400:
            raise ProviderPermanentError(
                self.name, f"{reason} (a redirect: not followed)", status_code=status, deactivate_address=False
            )
        if status in RETRYABLE_STATUS or status >= 500:
            hint = reply_retry_after_s(reply.headers)
            raise ProviderRetryableError(
                self.name, reason, status_code=status,
                retry_after_s=hint if hint is not None else _rate_limit_reset_s(reply.headers),
            )
        if status in (401, 403):
            raise ProviderPermanentError(
                self.name, f"{reason} (authentication: check [senders.sendgrid] api_key)", status_code=status,
                deactivate_address=False,
            )
        if self.invalid_recipient is not None:
            invalid = self.invalid_recipient.matches_http(status, reply.body)
        else:
            invalid = status == 400 and invalid_recipient(reply.body)
        raise ProviderPermanentError(
            self.name, f"{reason} (invalid recipient)" if invalid else reason, status_code=status,
            deactivate_address=invalid,
        )
