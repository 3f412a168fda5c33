"""``POST /webhooks/{provider}``: delivery receipts. The signature is checked before the body is
read as JSON; a receipt moves its message from sent to delivered or failed, once, found by the
provider's message id; the change goes to the senders' status topic too."""

from __future__ import annotations

import logging
import time
from typing import Annotated, Any

from fastapi import APIRouter, Header, Path, Request
from pydantic import ValidationError

from api.docs import errors
from api.errors import UNAUTHORIZED, ApiError, bad_request, not_found
from api.models import ReceiptIn, ReceiptOut
from api.producer import NotAcknowledged
from api.services import services
from api.signing import SIGNATURE_HEADER, TIMESTAMP_HEADER, verify
from api.store import record_receipt
from operators import codec
from senders.statuses import DeliveryStatus
from senders.store.db import Database
from senders.store.status import StatusRow, StatusStore

logger = logging.getLogger(__name__)
router = APIRouter()

_BODY = {"requestBody": {"required": True, "content": {"application/json": {"schema": ReceiptIn.model_json_schema()}}}}


def status_record(row: StatusRow, now_ms: int) -> dict[str, Any]:
    """The receipt's change as the senders' status records say it (no address, no params)."""
    t = row.template
    return {
        "message_key": row.message_key, "notification_id": row.notification_id, "channel": row.channel.value,
        "lane": row.lane.value, "status": row.status.value, "attempt": row.attempts, "provider": row.provider,
        "error": None, "retry_at": None, "at": now_ms, "reason": row.reason, "not_before": None,
        "template": t.name if t else None, "template_version": t.version if t else None,
        "locale": t.locale if t else None,
    }


@router.post(
    "/webhooks/{provider}",
    response_model=ReceiptOut,
    responses=errors(400, 401, 404, 409, 413, 503),
    openapi_extra=_BODY,
    summary="A provider's delivery receipt (HMAC-SHA256 signed)",
)
async def receipt(
    provider: Annotated[str, Path(min_length=1, max_length=256)],
    request: Request,
    timestamp: Annotated[str | None, Header(alias=TIMESTAMP_HEADER)] = None,
    signature: Annotated[str | None, Header(alias=SIGNATURE_HEADER)] = None,
) -> ReceiptOut:
    s = services(request)
    body = await request.body()
    problem = verify(s.webhook_secrets.get(provider), timestamp, signature, body, time.time(),
                     s.cfg.api.webhook_tolerance_s)
    if problem is not None:
        logger.warning("refused a receipt for provider %s: %s", provider if provider in s.webhook_secrets else "?",
                       problem)
        raise UNAUTHORIZED
    try:  # pydantic's own JSON parser: bounded nesting, so no body (however deep) raises RecursionError
        parsed = ReceiptIn.model_validate_json(body)
    except ValidationError:
        raise bad_request("the receipt is not {message_id, status: delivered|failed, reason?}",
                          code="invalid_receipt") from None
    status = DeliveryStatus(parsed.status)
    now = int(time.time() * 1000)

    def apply(db: Database) -> tuple[StatusRow | None, bool]:
        row, changed = StatusStore(db).apply_receipt(provider, parsed.message_id, status, parsed.reason, now)
        if row is not None:
            record_receipt(db, provider, parsed.message_id, status.value, row.message_key, parsed.reason, now)
        return row, changed

    row, changed = await s.pool.run(apply)
    if row is None:
        raise not_found("no sent message of this provider has this id (yet)", code="unknown_message")
    if changed:
        value = codec.encode("delivery_status", status_record(row, now))
        try:
            await s.producer.write(s.cfg.senders.status_topic, row.message_key.encode(), value)
        except NotAcknowledged as exc:  # the store has it: the status topic misses this one change
            logger.warning("the receipt of %s is stored, not on the status topic: %s", row.message_key, exc.reason)
    if not changed and row.status is not status:
        raise ApiError(409, "conflict", f"the message is {row.status.value}, a receipt cannot change it")
    return ReceiptOut(message_key=row.message_key, status=row.status.value, changed=changed)
