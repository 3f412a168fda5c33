"""SendGrid's signed event webhook: a JSON array of events in one POST, signed with ECDSA P-256
(SHA-256) over ``<timestamp><body>``, the signature (base64 DER) in
``X-Twilio-Email-Event-Webhook-Signature``, the timestamp in ``...-Timestamp``; verified with
the webhook's verification key (``[senders.sendgrid] webhook_public_key``). A timestamp further
than ``api.webhook_tolerance_s`` from the clock is refused (a replay).

Each event names its message by ``sg_message_id`` (the ``X-Message-Id`` of the send, then
``.filter...``) and carries the message key the send gave as a custom argument
(``notify_message_key``); an event without one is not ours (another sender on the account) and
is acknowledged.

* ``delivered`` -> delivered.
* ``bounce`` of type ``bounce`` (hard) -> failed and the address deactivated; of type
  ``blocked`` (soft: the receiving server refused for now, or for a policy) -> failed, the
  address kept.
* ``dropped`` (SendGrid did not send it: a suppression, an invalid message) -> failed, the
  address kept.
* ``spamreport`` (a complaint) -> delivered (the mail did arrive), the address deactivated and
  the user opted out of marketing email.
* anything else (``processed``, ``deferred``, ``open``, ``click``, ``unsubscribe``, ...) is
  acknowledged and changes nothing.
"""

from __future__ import annotations

import base64
import binascii
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.asymmetric import ec
from pydantic import BaseModel, ConfigDict, TypeAdapter, ValidationError

from api.receipts.model import BadReceipt, ReceiptEvent, clean_reason
from operators.records import Channel
from senders.providers.sendgrid import MESSAGE_KEY_ARG
from senders.statuses import DeliveryStatus

SIGNATURE_HEADER = "X-Twilio-Email-Event-Webhook-Signature"
TIMESTAMP_HEADER = "X-Twilio-Email-Event-Webhook-Timestamp"
_ENHANCED = re.compile(r"[245]\.\d{1,3}\.\d{1,3}")


class _Event(BaseModel):
    model_config = ConfigDict(extra="allow")  # the custom arguments are fields of the event

    event: str
    sg_message_id: str | None = None
    email: str | None = None
    type: str | None = None
    status: str | None = None

    @property
    def message_key(self) -> str | None:
        value = (self.model_extra or {}).get(MESSAGE_KEY_ARG)
        return value if isinstance(value, str) and value else None


_EVENTS: TypeAdapter[list[_Event]] = TypeAdapter(list[_Event])


def _enhanced(status: str | None) -> str:
    """A bounce's enhanced status code (``5.1.1``), or ""; never its text (it may hold the address)."""
    text = (status or "").strip()
    return text if _ENHANCED.fullmatch(text) else ""


def event_of(e: _Event) -> ReceiptEvent:
    """One event as a receipt event (its status None: acknowledged, no change)."""
    name = e.event.strip().lower()
    key = e.message_key
    reference = (e.sg_message_id or "").split(".", 1)[0].strip()
    if key is None or not reference:
        return ReceiptEvent(reference, None, name)
    if name == "delivered":
        return ReceiptEvent(reference, DeliveryStatus.DELIVERED, "delivered", message_key=key)
    if name == "bounce":
        hard = (e.type or "bounce").strip().lower() != "blocked"
        reason = clean_reason(f"sendgrid {'bounce' if hard else 'blocked'} {_enhanced(e.status)}")
        return ReceiptEvent(reference, DeliveryStatus.FAILED, "failed", reason, address=e.email, deactivate=hard,
                            message_key=key)
    if name == "dropped":
        return ReceiptEvent(reference, DeliveryStatus.FAILED, "failed", "sendgrid dropped", message_key=key)
    if name == "spamreport":
        return ReceiptEvent(reference, DeliveryStatus.DELIVERED, "complaint", "sendgrid spamreport", address=e.email,
                            deactivate=True, opt_out=True, message_key=key)
    return ReceiptEvent(reference, None, name, message_key=key)


@dataclass(frozen=True)
class SendGridReceipts:
    """``key``: the event webhook's verification key (``settings.sms_email.load_event_webhook_key``)."""

    key: ec.EllipticCurvePublicKey
    tolerance_s: int
    kind: str = "sendgrid"
    channel: Channel | None = Channel.EMAIL

    def verify(self, headers: Mapping[str, str], body: bytes, now_s: float) -> str | None:
        timestamp = headers.get(TIMESTAMP_HEADER.lower())
        given = headers.get(SIGNATURE_HEADER.lower())
        if not timestamp or not given:
            return "unsigned"
        if not (timestamp.isascii() and timestamp.isdigit()) or len(timestamp) > 12:
            return "malformed timestamp"
        if abs(now_s - int(timestamp)) > self.tolerance_s:
            return "timestamp outside the replay window"
        try:
            der = base64.b64decode(given.strip(), validate=True)
            self.key.verify(der, timestamp.encode("ascii") + body, ec.ECDSA(hashes.SHA256()))
        except (binascii.Error, ValueError, InvalidSignature):
            return "bad signature"
        return None

    def events(self, body: bytes) -> Sequence[ReceiptEvent]:
        try:  # pydantic's JSON parser: bounded nesting
            parsed: list[Any] = _EVENTS.validate_json(body)
        except ValidationError:
            raise BadReceipt("the events are not a JSON array of {event, sg_message_id, ...}") from None
        return [event_of(e) for e in parsed]

