"""SMS through Twilio's Messages API (and the gateways that speak it): a form-encoded ``POST
{base}/2010-04-01/Accounts/{AccountSid}/Messages.json`` with HTTP basic auth (account SID, auth
token), ``To``, ``From`` or ``MessagingServiceSid``, ``Body`` and ``StatusCallback``; the reply's
``sid`` is the provider's message id, which its signed status callbacks name
(``api.receipts.twilio``).

Its answers (``https://www.twilio.com/docs/api/errors``), by the error ``code`` of the JSON reply:

* 2xx: sent.
* 21211 (invalid 'To' number) and 21614 (not a mobile number): the number can never take an SMS:
  permanent, the address deactivated (``senders.invalid_recipient_rules`` for ``twilio``
  replaces the rule).
* 21610 (the recipient replied STOP): permanent, the address **kept**: the number is valid, and
  Twilio lifts the block when the user replies START, which we never see; a deactivation would
  outlive it (and keep the user's one-time codes from them).
* 20003 / HTTP 401, 403 (authentication, permission): permanent for the message, the address
  kept; every message fails so, the breaker opens and ``SenderProviderRejectingAddresses`` fires.
* 429 / 20429 (too many requests), 408, 5xx, a timeout or no reply: retried, honouring
  ``Retry-After``.
* any other 4xx (a bad ``From``, a closed region): permanent, the address kept.

No reply body is logged or kept: it may echo the number; the reason names the status and code.
The Messages API has no idempotency key: a message whose call was open when the sender crashed
is sent again (the window docs/senders.md names).
"""

from __future__ import annotations

import base64
import json
from urllib.parse import urlencode, urlsplit

from pydantic import SecretStr

from operators.errors import ConfigError
from senders.errors import ProviderPermanentError, ProviderRetryableError
from senders.policy.recipients import RecipientRules
from senders.providers.base import Provider
from senders.providers.endpoint import Endpoint, Transport, reference, reply_retry_after_s
from senders.runtime.metrics import Metrics
from senders.templates.render import Rendered, SmsContent

#: the provider spec (and so its name: ``senders.sms_primary = "twilio"``, ``POST /webhooks/twilio``)
SPEC = "twilio"
API_VERSION = "2010-04-01"
#: error codes of a number that cannot take an SMS, in the reply to the POST
INVALID_NUMBER_CODES = ("21211", "21614")
#: error codes of a status callback that say the same of the number: unknown destination
#: handset (30005), a landline or unreachable carrier (30006); also those of the POST (a
#: messaging service reports them asynchronously)
UNREACHABLE_NUMBER_CODES = ("30005", "30006", *INVALID_NUMBER_CODES)
#: the recipient opted out (STOP): permanent, the number kept
UNSUBSCRIBED_CODE = "21610"
AUTH_CODES = frozenset({"20003"})
THROTTLED_CODES = frozenset({"20429"})
RETRYABLE_STATUS = frozenset({408, 429})
DEFAULT_INVALID_RECIPIENT = ",".join(f"400:{code}" for code in INVALID_NUMBER_CODES)


def error_code(body: bytes) -> str:
    """The ``code`` of a Twilio error reply (``{"code": 21211, "message": ..., "status": 400}``),
    as digits; "" when the body has none."""
    try:
        parsed = json.loads(body) if body else None
    except ValueError:
        return ""
    code = parsed.get("code") if isinstance(parsed, dict) else None
    if isinstance(code, bool) or not isinstance(code, int | str):
        return ""
    text = str(code)
    return text if text.isascii() and text.isdigit() and len(text) <= 8 else ""


class TwilioProvider(Provider):
    """One Twilio account: ``account_sid`` and its ``auth_token`` (a secret), a sender
    (``sender`` or ``messaging_service_sid``), the ``status_callback`` URL (empty: none)."""

    protocol = "twilio-messages"
    deadline_setting = "http_timeout_ms"

    def __init__(
        self,
        *,
        name: str,
        account_sid: str,
        auth_token: SecretStr | None,
        timeout_s: float,
        sender: str = "",
        messaging_service_sid: str = "",
        status_callback: str = "",
        base_url: str = "https://api.twilio.com",
        ca_file: str | None = None,
        invalid_recipient: RecipientRules | None = None,
        metrics: Metrics | None = None,
        max_connections: int = 100,
        http2: bool = False,
        transport: Transport | None = None,
    ) -> None:
        super().__init__(name=name, metrics=metrics)
        if not account_sid or not account_sid.isalnum() or not account_sid.isascii():
            raise ConfigError(f"provider {name}: set [senders.twilio] account_sid (letters and digits)")
        if auth_token is None or not auth_token.get_secret_value():
            raise ConfigError(f"provider {name}: set [senders.twilio] auth_token")
        if not sender and not messaging_service_sid:
            raise ConfigError(f"provider {name}: set [senders.twilio] sender or messaging_service_sid")
        self.timeout_s: float = timeout_s
        self.invalid_recipient = invalid_recipient or RecipientRules.parse(DEFAULT_INVALID_RECIPIENT)
        self._endpoint = Endpoint(
            name=name, url=base_url, timeout_s=timeout_s, ca_file=ca_file, max_connections=max_connections,
            http2=http2, transport=transport,
        )
        prefix = urlsplit(base_url).path.rstrip("/")
        self._target = f"{prefix}/{API_VERSION}/Accounts/{account_sid}/Messages.json"
        basic = base64.b64encode(f"{account_sid}:{auth_token.get_secret_value()}".encode()).decode("ascii")
        self._auth = SecretStr(f"Basic {basic}")
        self._fixed: list[tuple[str, str]] = []
        if sender:
            self._fixed.append(("From", sender))
        if messaging_service_sid:
            self._fixed.append(("MessagingServiceSid", messaging_service_sid))
        if status_callback:
            self._fixed.append(("StatusCallback", status_callback))

    def __repr__(self) -> str:
        return f"TwilioProvider({self.name!r})"

    async def aclose(self) -> None:
        await self._endpoint.aclose()

    def form(self, to: str, message: Rendered) -> bytes:
        """The form the POST carries (``To``, the sender, ``Body``, ``StatusCallback``)."""
        content = message.content
        if not isinstance(content, SmsContent):
            raise ProviderPermanentError(self.name, f"not an SMS: {message.channel}", deactivate_address=False)
        return urlencode([("To", to), *self._fixed, ("Body", content.text)]).encode("ascii")

    async def _try_send(self, *, to: str, message_key: str, message: Rendered) -> str | None:
        body = self.form(to, message)
        headers = [
            ("Content-Type", "application/x-www-form-urlencoded"),
            ("Accept", "application/json"),
            ("Authorization", self._auth.get_secret_value()),
        ]
        reply = await self._endpoint.post(self._target, headers, body)
        status = reply.status
        if 200 <= status < 300:
            try:
                parsed = json.loads(reply.body)
            except ValueError:
                parsed = None
            return reference(parsed.get("sid")) if isinstance(parsed, dict) else None
        code = error_code(reply.body)
        reason = f"HTTP {status}" + (f" Twilio {code}" if code else "")  # never the body: it echoes the number
        if 300 <= status < 400:
            raise ProviderPermanentError(
                self.name, f"{reason} (a redirect: not followed)", status_code=status, deactivate_address=False
            )
        if status in RETRYABLE_STATUS or code in THROTTLED_CODES or status >= 500:
            raise ProviderRetryableError(
                self.name, reason, status_code=status, retry_after_s=reply_retry_after_s(reply.headers)
            )
        if status in (401, 403) or code in AUTH_CODES:
            raise ProviderPermanentError(
                self.name, f"{reason} (authentication: check [senders.twilio] account_sid and auth_token)",
                status_code=status, deactivate_address=False,
            )
        raise ProviderPermanentError(
            self.name, reason, status_code=status, deactivate_address=self.invalid_recipient.matches_code(status, code)
        )
