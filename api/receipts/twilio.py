"""Twilio's status callbacks (``StatusCallback`` of each message sent, ``senders.providers.twilio``):
a form-encoded POST signed in ``X-Twilio-Signature`` with base64(HMAC-SHA1(auth token, the full
callback URL followed by every POST parameter's name and value, sorted by name)).

The URL is the one the messages were given (``[senders.twilio] status_callback``), not the one
this process sees (a proxy in front changes scheme, host or port). The signature carries no
time: a replayed callback is the same receipt again, which changes nothing.

``MessageStatus``: ``delivered`` -> delivered; ``undelivered`` and ``failed`` -> failed, the
``ErrorCode`` as the reason, and the number deactivated when that code says it cannot take an
SMS (``UNREACHABLE_NUMBER_CODES``: 30005 unknown handset, 30006 landline or unreachable carrier,
21211, 21614); any other (``queued``, ``sending``, ``sent``, ``accepted``, ...) is acknowledged
and changes nothing.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from urllib.parse import parse_qsl

from pydantic import SecretStr

from api.receipts.model import BadReceipt, ReceiptEvent, clean_reason
from operators.records import Channel
from senders.providers.twilio import UNREACHABLE_NUMBER_CODES
from senders.statuses import DeliveryStatus

SIGNATURE_HEADER = "X-Twilio-Signature"
#: a status callback has a dozen or two parameters
MAX_FIELDS = 200
FAILED = frozenset({"undelivered", "failed"})


def signature(auth_token: bytes, url: str, params: Sequence[tuple[str, str]]) -> str:
    """The ``X-Twilio-Signature`` of a POST of ``params`` to ``url``."""
    data = url + "".join(name + value for name, value in sorted(params))
    return base64.b64encode(hmac.new(auth_token, data.encode("utf-8"), hashlib.sha1).digest()).decode("ascii")


def form(body: bytes) -> list[tuple[str, str]]:
    """The POST parameters; raises BadReceipt when the body is no form."""
    try:
        return parse_qsl(body.decode("utf-8"), keep_blank_values=True, strict_parsing=bool(body),
                         max_num_fields=MAX_FIELDS)
    except (UnicodeDecodeError, ValueError):
        raise BadReceipt("the callback is not a form (application/x-www-form-urlencoded, UTF-8)") from None


@dataclass(frozen=True)
class TwilioReceipts:
    """``auth_token``: the account's (it signs the callbacks); ``url``: the callback URL the
    messages were sent with; ``account_sid``: a callback of another account is refused."""

    auth_token: SecretStr = field(repr=False)
    url: str
    account_sid: str
    kind: str = "twilio"
    channel: Channel | None = Channel.SMS

    def verify(self, headers: Mapping[str, str], body: bytes, now_s: float) -> str | None:
        given = headers.get(SIGNATURE_HEADER.lower())
        if not given:
            return "unsigned"
        try:
            params = form(body)
        except BadReceipt:
            return "malformed body"
        expected = signature(self.auth_token.get_secret_value().encode("utf-8"), self.url, params)
        if not hmac.compare_digest(expected.encode("ascii"), given.strip().encode("utf-8", "replace")):
            return "bad signature"
        account = dict(params).get("AccountSid")
        if account is not None and account != self.account_sid:
            return "a callback of another account"
        return None

    def events(self, body: bytes) -> Sequence[ReceiptEvent]:
        params = dict(form(body))
        reference = params.get("MessageSid") or params.get("SmsSid")
        state = (params.get("MessageStatus") or params.get("SmsStatus") or "").strip().lower()
        if not reference or not state:
            raise BadReceipt("the callback has no MessageSid and MessageStatus")
        if state == "delivered":
            return [ReceiptEvent(reference, DeliveryStatus.DELIVERED, "delivered")]
        if state in FAILED:
            code = params.get("ErrorCode", "").strip()
            code = code if code.isascii() and code.isdigit() else ""
            reason = clean_reason(f"twilio {code} {state}" if code else f"twilio {state}")
            return [ReceiptEvent(reference, DeliveryStatus.FAILED, "failed", reason, address=params.get("To"),
                                 deactivate=code in UNREACHABLE_NUMBER_CODES)]
        return [ReceiptEvent(reference, None, state)]
