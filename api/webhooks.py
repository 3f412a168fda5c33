"""``POST /webhooks/{provider}``: delivery receipts, checked and read by the provider's scheme
(``api.receipts``: this project's HMAC-SHA256 receipts, Twilio's status callbacks, SendGrid's
event webhook). The signature is checked before the body is read; a receipt moves its message
from sent to delivered or failed, once, found by the provider's message id; the change goes to
the senders' status topic too. A refusal is 401 whatever the reason (logged, without the body).

This project's receipts answer as before: ``{message_key, status, changed}``, 404 for a message
not (yet) recorded as sent (its sender sends it again), 409 for one a receipt cannot change. A
provider's (one callback, or a batch of events) answers 200 ``{events, held, receipts:
[{message_key, status, changed}]}``: an event naming a message not recorded yet (a callback
sooner than the sender's batch) is held and applied once it is (api/receipts/held.py), since
a provider such as Twilio does not call again; the events that change nothing are answered too.
"""

from __future__ import annotations

import logging
import time
from typing import Annotated, Any

from fastapi import APIRouter, Path, Request
from pydantic import BaseModel, Field

from api.docs import errors
from api.errors import UNAUTHORIZED, ApiError, bad_request, not_found
from api.models import ReceiptIn, ReceiptOut
from api.producer import NotAcknowledged
from api.receipts import sendgrid as sendgrid_receipts
from api.receipts import twilio as twilio_receipts
from api.receipts.apply import Applied, apply_events, status_record
from api.receipts.held import hold, holds
from api.receipts.model import BadReceipt, ReceiptScheme
from api.receipts.registry import receipt_schemes
from api.services import Services, services
from api.signing import SIGNATURE_HEADER, TIMESTAMP_HEADER
from operators import codec
from senders.store.db import Database

logger = logging.getLogger(__name__)
router = APIRouter()


class ReceiptsOut(BaseModel):
    """A provider's receipt (a status callback, a batch of events): what became of each
    message it named."""

    events: int = Field(description="the events the receipt carried")
    held: int = Field(default=0, description="events whose message is not recorded as sent yet: kept, and applied"
                                             " when it is (within api.held_receipts_ttl_s)")
    receipts: list[ReceiptOut] = Field(description="the messages they named, as they are now")


#: the signature headers, one scheme's each (which are required depends on the provider's scheme)
_SIGNATURE_HEADERS = (
    (TIMESTAMP_HEADER, "this project's receipts: the Unix time signed"),
    (SIGNATURE_HEADER, "this project's receipts: hex HMAC-SHA256 of <timestamp>.<body>"),
    (twilio_receipts.SIGNATURE_HEADER, "Twilio's status callbacks: base64 HMAC-SHA1 of the URL and the parameters"),
    (sendgrid_receipts.TIMESTAMP_HEADER, "SendGrid's event webhook: the time signed"),
    (sendgrid_receipts.SIGNATURE_HEADER, "SendGrid's event webhook: base64 ECDSA P-256 of <timestamp><body>"),
)
_BODY = {"parameters": [
    {"in": "header", "name": name, "required": False, "description": text, "schema": {"type": "string"}}
    for name, text in _SIGNATURE_HEADERS
], "requestBody": {"required": True, "content": {
    "application/json": {"schema": {"anyOf": [
        ReceiptIn.model_json_schema(),
        {"type": "array", "description": "SendGrid's event webhook: a batch of events",
         "items": {"type": "object", "properties": {"event": {"type": "string"}, "sg_message_id": {"type": "string"}},
                   "required": ["event"]}},
    ]}},
    "application/x-www-form-urlencoded": {"schema": {
        "type": "object", "description": "Twilio's status callback",
        "properties": {"MessageSid": {"type": "string"}, "MessageStatus": {"type": "string"},
                       "ErrorCode": {"type": "string"}},
    }},
}}}


def _schemes(request: Request, s: Services) -> dict[str, ReceiptScheme]:
    """The schemes of this app's services, made once (the settings do not change)."""
    made: tuple[Services, dict[str, ReceiptScheme]] | None = getattr(request.app.state, "receipt_schemes", None)
    if made is None or made[0] is not s:
        made = (s, receipt_schemes(s.cfg, s.webhook_secrets))
        request.app.state.receipt_schemes = made
    return made[1]


async def _publish(s: Services, applied: list[Applied], now: int) -> None:
    for a in applied:
        if not a.changed or a.row is None:
            continue
        value = codec.encode("delivery_status", status_record(a.row, now))
        try:
            await s.producer.write(s.cfg.senders.status_topic, a.row.message_key.encode(), value)
        except NotAcknowledged as exc:  # the store has it: the status topic misses this one change
            logger.warning("the receipt of %s is stored, not on the status topic: %s", a.row.message_key, exc.reason)


@router.post(
    "/webhooks/{provider}",
    response_model=ReceiptOut | ReceiptsOut,
    responses=errors(400, 401, 404, 409, 413, 503),
    openapi_extra=_BODY,
    summary="A provider's delivery receipts (signed: this project's HMAC-SHA256, Twilio's, SendGrid's)",
)
async def receipt(provider: Annotated[str, Path(min_length=1, max_length=256)], request: Request) -> Any:
    s = services(request)
    body = await request.body()
    scheme = _schemes(request, s).get(provider)
    headers = {k.lower(): v for k, v in request.headers.items()}
    problem = "no receipts are configured for this provider" if scheme is None else scheme.verify(
        headers, body, time.time())
    if problem is not None:
        logger.warning("refused a receipt for provider %s: %s", provider if scheme is not None else "?", problem)
        raise UNAUTHORIZED
    assert scheme is not None
    try:
        events = list(scheme.events(body))
    except BadReceipt as exc:
        raise bad_request(str(exc), code="invalid_receipt") from None
    now = int(time.time() * 1000)

    def apply(db: Database) -> list[Applied]:
        applied = apply_events(db, s.cipher, provider, scheme, events, now)
        if holds(scheme):  # a provider that would not call again: kept until the message is recorded
            for a in applied:
                if a.missing:
                    hold(db, s.cipher, provider, a.event, now)
        return applied

    applied = await s.pool.run(apply)
    for a in applied:
        if a.event.opt_out and a.row is not None and a.row.user_id:
            s.profiles.drop(a.row.user_id)  # the accept path's read of the profile is stale now
    await _publish(s, applied, now)
    if holds(scheme):
        return ReceiptsOut(events=len(events), held=sum(a.missing for a in applied), receipts=[
            ReceiptOut(message_key=a.row.message_key, status=a.row.status.value, changed=a.changed)
            for a in applied if a.row is not None
        ])
    if any(a.missing for a in applied):
        raise not_found("no sent message of this provider has this id (yet)", code="unknown_message")
    [one] = applied
    assert one.row is not None and one.event.status is not None
    if not one.changed and one.row.status is not one.event.status:
        raise ApiError(409, "conflict", f"the message is {one.row.status.value}, a receipt cannot change it")
    return ReceiptOut(message_key=one.row.message_key, status=one.row.status.value, changed=one.changed)
