"""This project's own receipts (the ``http(s)://`` providers' contract): ``{"message_id",
"status": "delivered" | "failed", "reason"}``, signed with HMAC-SHA256 over
``<timestamp>.<body>`` (``api.signing``) with the provider's secret from ``api.webhook_secrets``."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from pydantic import ValidationError

from api.models import ReceiptIn
from api.receipts.model import BadReceipt, ReceiptEvent
from api.signing import SIGNATURE_HEADER, TIMESTAMP_HEADER, verify
from operators.records import Channel
from senders.statuses import DeliveryStatus


@dataclass(frozen=True)
class NotifyReceipts:
    secret: bytes
    tolerance_s: int
    kind: str = "notify"
    channel: Channel | None = None

    def verify(self, headers: Mapping[str, str], body: bytes, now_s: float) -> str | None:
        return verify(self.secret, headers.get(TIMESTAMP_HEADER.lower()), headers.get(SIGNATURE_HEADER.lower()), body,
                      now_s, self.tolerance_s)

    def events(self, body: bytes) -> Sequence[ReceiptEvent]:
        try:  # pydantic's own JSON parser: bounded nesting, so no body (however deep) raises RecursionError
            parsed = ReceiptIn.model_validate_json(body)
        except ValidationError:
            raise BadReceipt("the receipt is not {message_id, status: delivered|failed, reason?}") from None
        status = DeliveryStatus(parsed.status)
        return [ReceiptEvent(parsed.message_id, status, status.value, parsed.reason)]
