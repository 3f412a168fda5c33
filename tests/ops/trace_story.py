"""A small story in the topics, written the way the job writes it (tests/encoders.py): what
``dedupctl trace`` must tell apart. Used with and without a broker."""

from __future__ import annotations

import io
from dataclasses import dataclass

from fastavro import schemaless_writer

from operators import codec
from operators.contract import Topics
from operators.dedup_key import resolve_dedup_key
from operators.records import Channel, NotificationRequest, Priority, SourcePosition
from operators.window import Accepted
from ops import kafka_io
from tests import encoders as routing

BASE = 1_796_115_600_000
WATERMARK = BASE + 9 * 60_000 - 1


def req(
    nid: str, t: int, *, user: str = "u-1", channels=(Channel.PUSH, Channel.SMS), **kw: object
) -> NotificationRequest:
    return NotificationRequest(
        notification_id=nid, user_id=user, template_id="order_shipped",
        params={"order": "42", "code": "9931"}, channels=channels, event_time=t, **kw,
    )


N1 = req("n-1", BASE)                                     # accepted on push and sms
N2 = req("n-2", BASE + 5_000)                             # duplicate of n-1
N3 = req("n-3", BASE, user="u-3")                         # late
N5 = req("n-5", BASE + 1_000, user="u-5")                 # read, no outcome yet
N6 = req("n-6", BASE, user="u-6", channels=(Channel.EMAIL,), dedup_key="campaign:carol",
         priority=Priority.HIGH)
N7 = req("n-7", BASE + 1_000, user="u-7", channels=(Channel.EMAIL,), dedup_key="campaign:carol")
KEY1 = resolve_dedup_key(N1)


def invalid_bytes(notification_id: str = "n-4") -> bytes:
    """Valid Avro naming ``notification_id``, but its user_id is empty."""
    fields = req(notification_id, BASE, user="x").to_avro()
    fields["user_id"] = ""
    buf = io.BytesIO()
    schemaless_writer(buf, codec.load_schema("notification_request"), fields)
    return buf.getvalue()


@dataclass(frozen=True)
class Record:
    topic: str
    key: bytes | None
    value: bytes


def records(topics: Topics, status_topic: str | None = None) -> list[Record]:
    out = [
        Record(topics.requests, r.user_id.encode(), codec.encode_request(r)) for r in (N1, N2, N3, N5, N6, N7)
    ]
    out.append(Record(topics.requests, None, invalid_bytes()))
    routed = [
        *routing.channel_messages(N1, KEY1, topics),
        routing.duplicate_notice(N2, KEY1, Accepted("n-1", BASE, 86_400_000, 2), topics),
        routing.late_notice(N3, WATERMARK, f"event_time {BASE} is behind the watermark {WATERMARK}", topics),
        routing.invalid_record(
            invalid_bytes(), "user_id is missing or empty", SourcePosition(topics.requests, 0, 6), topics
        ),
        *routing.channel_messages(N6, "campaign:carol", topics),
        routing.duplicate_notice(N7, "campaign:carol", Accepted("n-6", BASE, 86_400_000, 2), topics),
    ]
    out += [Record(r.topic, r.key, r.value) for r in routed]
    if status_topic:
        changes = (("queued", 1, BASE + 100), ("sending", 1, BASE + 200), ("sent", 1, BASE + 900))
        for status, attempt, at in changes:
            value = {
                "message_key": f"{KEY1}:push:{N1.event_time}", "notification_id": "n-1", "channel": "push", "lane": "normal",
                "status": status, "attempt": attempt, "provider": "fake" if status != "queued" else None,
                "error": None, "retry_at": None, "at": at,
            }
            out.append(Record(status_topic, f"{KEY1}:push:{N1.event_time}".encode(), codec.encode("delivery_status", value)))
        sms_key = f"{KEY1}:sms:{N1.event_time}"
        deferred = {
            "message_key": sms_key, "notification_id": "n-1", "channel": "sms", "lane": "normal",
            "status": "deferred", "attempt": 1, "provider": None, "error": None, "retry_at": None,
            "at": BASE + 300, "reason": "quiet_hours", "not_before": BASE + 3_600_000,
            "template": "order_shipped", "template_version": 2, "locale": "bn",
        }
        out.append(Record(status_topic, sms_key.encode(), codec.encode("delivery_status", deferred)))
    return out


def messages(topics: Topics, status_topic: str | None = None) -> list[kafka_io.Message]:
    """The records as a consumer would see them, one partition per topic, offsets from 0."""
    offsets: dict[str, int] = {}
    out = []
    for r in records(topics, status_topic):
        offsets[r.topic] = offsets.get(r.topic, -1) + 1
        out.append(kafka_io.Message(r.topic, 0, offsets[r.topic], r.key, r.value, BASE))
    return out
