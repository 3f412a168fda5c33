"""Where each outcome goes: channel topics and lanes, and the records written there."""

from __future__ import annotations

from dataclasses import dataclass

from operators import codec
from operators.records import Channel, NotificationRequest, Priority, SourcePosition
from operators.window import Accepted


@dataclass(frozen=True, slots=True)
class Topics:
    """Topic names; every one of them can be renamed in configuration."""

    requests: str = "notifications.requests"
    push: str = "notifications.push"
    sms: str = "notifications.sms"
    email: str = "notifications.email"
    push_priority: str = "notifications.push.priority"
    sms_priority: str = "notifications.sms.priority"
    email_priority: str = "notifications.email.priority"
    duplicates: str = "notifications.duplicates"
    late: str = "notifications.late"
    invalid: str = "notifications.invalid"

    def channel_topic(self, channel: Channel, priority: Priority) -> str:
        """High priority requests (one-time codes) go to the channel's priority lane."""
        lane = "_priority" if priority is Priority.HIGH else ""
        return str(getattr(self, f"{channel.value}{lane}"))

    def outputs(self) -> list[str]:
        return [
            self.push, self.sms, self.email,
            self.push_priority, self.sms_priority, self.email_priority,
            self.duplicates, self.late, self.invalid,
        ]

    def all(self) -> list[str]:
        return [self.requests, *self.outputs()]


@dataclass(frozen=True, slots=True)
class Routed:
    """One output record: topic, Kafka key (None for no key) and Avro value."""

    topic: str
    key: bytes | None
    value: bytes


def message_key(dedup_key: str, channel: Channel) -> str:
    return f"{dedup_key}:{channel.value}"


def channel_messages(req: NotificationRequest, dedup_key: str, topics: Topics) -> list[Routed]:
    user_key = req.user_id.encode("utf-8")
    base = req.to_avro()
    base["dedup_key"] = dedup_key
    out = []
    for channel in req.channels:
        msg = dict(base, message_key=message_key(dedup_key, channel), channel=channel.value)
        out.append(
            Routed(topics.channel_topic(channel, req.priority), user_key, codec.encode("channel_message", msg))
        )
    return out


def duplicate_notice(
    req: NotificationRequest, dedup_key: str, original: Accepted, topics: Topics
) -> Routed:
    notice = {
        "notification_id": req.notification_id,
        "dedup_key": dedup_key,
        "original_notification_id": original.notification_id,
        "first_seen_event_time": original.event_time,
        "event_time": req.event_time,
        "occurrence": original.occurrences,
    }
    return Routed(topics.duplicates, dedup_key.encode("utf-8"), codec.encode("duplicate_notice", notice))


def late_notice(req: NotificationRequest, watermark: int, reason: str, topics: Topics) -> Routed:
    notice = {"request": req.to_avro(), "watermark": watermark, "reason": reason}
    return Routed(topics.late, req.user_id.encode("utf-8"), codec.encode("late_notice", notice))


def invalid_record(raw: bytes, error: str, pos: SourcePosition, topics: Topics) -> Routed:
    record = {
        "raw": raw,
        "error": error,
        "topic": pos.topic,
        "partition": pos.partition,
        "offset": pos.offset,
    }
    return Routed(topics.invalid, None, codec.encode("invalid_record", record))
