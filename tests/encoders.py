"""The job's output records encoded in Python (fastavro), for the tests only: the job writes them
in the JVM (connector/.../Outputs.java), and the tests check it byte for byte against these, which
follow the contract's rule (harness.reference.output_record) and schemas/*.avsc."""

from __future__ import annotations

from dataclasses import dataclass

from harness.reference import kafka_key, output_record, request_record
from operators import codec
from operators.contract import Topics, contract
from operators.dedup_key import message_key
from operators.records import NotificationRequest, SourcePosition
from operators.window import Accepted


@dataclass(frozen=True, slots=True)
class Routed:
    """One output record: topic, Kafka key (None for no key) and Avro value."""

    topic: str
    key: bytes | None
    value: bytes


def _spec(role: str):  # noqa: ANN202 - a contract TopicSpec
    return contract().topic(role)


def channel_messages(req: NotificationRequest, dedup_key: str, topics: Topics) -> list[Routed]:
    base = request_record(req)
    out = []
    for channel in base["channels"]:
        topic = topics.channel_topic(channel, req.priority)
        msg = output_record(
            "channel_message", base, channel=channel, dedup_key=dedup_key,
            message_key=message_key(dedup_key, channel, base),
        )
        spec = topics.spec_of(topic)
        assert spec is not None
        out.append(Routed(topic, kafka_key(spec, base, dedup_key), codec.encode("channel_message", msg)))
    return out


def duplicate_notice(req: NotificationRequest, dedup_key: str, original: Accepted, topics: Topics) -> Routed:
    base = request_record(req)
    notice = output_record(
        "duplicate_notice", base, dedup_key=dedup_key, original_notification_id=original.notification_id,
        first_seen_event_time=original.event_time, occurrence=original.occurrences,
    )
    return Routed(topics.duplicates, kafka_key(_spec("duplicates"), base, dedup_key),
                  codec.encode("duplicate_notice", notice))


def late_notice(req: NotificationRequest, watermark: int, reason: str, topics: Topics) -> Routed:
    base = request_record(req)
    notice = output_record("late_notice", base, request=base, watermark=watermark, reason=reason)
    return Routed(topics.late, kafka_key(_spec("late"), base, ""), codec.encode("late_notice", notice))


def invalid_record(raw: bytes, error: str, pos: SourcePosition, topics: Topics, prefix_bytes: int = 4096) -> Routed:
    import hashlib

    record = {
        "raw": raw[:prefix_bytes], "raw_length": len(raw), "raw_sha256": hashlib.sha256(raw).hexdigest(),
        "error": error, "topic": pos.topic, "partition": pos.partition, "offset": pos.offset,
    }
    return Routed(topics.invalid, None, codec.encode("invalid_record", record))
