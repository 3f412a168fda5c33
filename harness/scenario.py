"""The demo's scenario: every kind of input the pipeline handles, in a few records.

Event times are fixed (``BASE``), so the outcome is exact and repeatable. The requests topic
needs two partitions: the watermark is per partition, so the step that moves it sends one
request to each.
"""

from __future__ import annotations

import io
from dataclasses import dataclass

from fastavro import schemaless_writer

from operators import codec
from operators.records import Category, Channel, NotificationRequest, Priority

BASE = 1_796_115_600_000  # 2026-12-01T09:00:00Z
SECOND = 1_000
MINUTE = 60 * SECOND


@dataclass(frozen=True)
class Step:
    """One record to produce: a request, or raw bytes; ``note`` says what it shows."""

    note: str
    partition: int
    request: NotificationRequest | None = None
    raw: bytes | None = None
    #: wait until every earlier output is visible (and the watermark has moved) first
    barrier: bool = False

    def key(self) -> bytes | None:
        return self.request.user_id.encode() if self.request else None

    def value(self) -> bytes:
        if self.request is not None:
            return codec.encode_request(self.request)
        assert self.raw is not None
        return self.raw


def _req(nid: str, user: str, template: str, params: dict[str, str], channels: tuple[Channel, ...],
         t: int, **kw: object) -> NotificationRequest:
    return NotificationRequest(
        notification_id=nid, user_id=user, template_id=template, params=params,
        channels=channels, event_time=t, **kw,  # type: ignore[arg-type]
    )


def _empty_notification_id() -> bytes:
    """Valid Avro, but the contract's non-empty notification_id is empty."""
    fields = _req("x", "u-ivan", "order_shipped", {}, (Channel.PUSH,), BASE).to_avro()
    fields["notification_id"] = ""
    buf = io.BytesIO()
    schemaless_writer(buf, codec.load_schema("notification_request"), fields)
    return buf.getvalue()


PUSH, SMS, EMAIL = Channel.PUSH, Channel.SMS, Channel.EMAIL


def steps() -> list[Step]:
    return [
        Step("new request: push and email", 0,
             _req("n-001", "u-alice", "order_shipped", {"order": "1001"}, (PUSH, EMAIL), BASE)),
        Step("new request: sms", 0,
             _req("n-002", "u-bob", "payment_update", {"amount": "12.50"}, (SMS,), BASE + 1 * SECOND)),
        Step("producer retry of n-001: duplicate", 0,
             _req("n-003", "u-alice", "order_shipped", {"order": "1001"}, (PUSH, EMAIL), BASE + 5 * SECOND)),
        Step("explicit dedup key, source A", 0,
             _req("n-004", "u-carol", "campaign_nov", {"variant": "a"}, (EMAIL,), BASE + 2 * SECOND,
                  dedup_key="campaign-2026-11:carol", category=Category.MARKETING, priority=Priority.LOW)),
        Step("same dedup key from source B: duplicate", 0,
             _req("n-005", "u-carol", "campaign_nov_v2", {"variant": "b"}, (EMAIL,), BASE + 3 * SECOND,
                  dedup_key="campaign-2026-11:carol", category=Category.MARKETING, priority=Priority.LOW)),
        Step("out of order by 40 s (within the 60 s bound): new", 1,
             _req("n-006", "u-dave", "welcome", {}, (PUSH,), BASE - 40 * SECOND)),
        Step("out-of-order repeat of n-002: duplicate", 0,
             _req("n-007", "u-bob", "payment_update", {"amount": "12.50"}, (SMS,), BASE - 20 * SECOND)),
        Step("one-time code: the sms priority lane", 1,
             _req("n-008", "u-erin", "otp", {"code": "493817"}, (SMS,), BASE + 6 * SECOND,
                  priority=Priority.HIGH, dedup_ttl_sec=300)),
        Step("undecodable bytes: invalid", 1, raw=b"\x00\x01not-avro"),
        Step("empty notification_id: invalid", 0, raw=_empty_notification_id()),
        Step("ten minutes later (moves the watermark on partition 0)", 0,
             _req("n-011", "u-frank", "weekly_digest", {"week": "48"}, (EMAIL,), BASE + 10 * MINUTE)),
        Step("ten minutes later (moves the watermark on partition 1)", 1,
             _req("n-012", "u-grace", "weekly_digest", {"week": "48"}, (EMAIL,), BASE + 10 * MINUTE)),
        Step("nine minutes behind the watermark: late", 0,
             _req("n-013", "u-heidi", "reminder", {"list": "groceries"}, (PUSH,), BASE), barrier=True),
    ]


#: how many records the scenario leaves in each output topic (Topics attribute -> count)
EXPECTED_COUNTS = {
    "push": 2,
    "sms": 1,
    "email": 4,
    "push_priority": 0,
    "sms_priority": 1,
    "email_priority": 0,
    "duplicates": 3,
    "late": 1,
    "invalid": 2,
}
