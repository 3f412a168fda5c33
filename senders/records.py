"""The senders' records: a delivery decoded from a channel or delay topic, and the status,
retry and dead-letter records built from it (as the dicts fastavro writes)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from operators import codec
from operators.records import Channel
from senders.statuses import DeadLetterReason, DeliveryStatus, Lane


@dataclass(frozen=True, slots=True)
class TemplateRef:
    """Which template, version and locale a message is (or would be) rendered from."""

    name: str
    version: int | None = None
    locale: str | None = None


@dataclass(frozen=True, slots=True)
class Delivery:
    """One attempt to make: the channel message and where it stands.

    :param payload: the ChannelMessage bytes exactly as read from ``source_topic``
    :param attempt: 1 for a record of the channel topic, n for a retry record of attempt n
    :param not_before_ms: a retry is not made before this instant (0 for a first attempt)
    :param last_error: the previous attempt's error, for a retry
    """

    message_key: str
    channel: Channel
    lane: Lane
    notification_id: str
    user_id: str
    template_id: str
    source_topic: str
    payload: bytes
    kafka_key: bytes | None
    attempt: int = 1
    not_before_ms: int = 0
    last_error: str = ""
    params: Mapping[str, str] = field(default_factory=dict, repr=False)  # codes: never in repr or logs
    event_time_ms: int = 0  # the accepted request's: it chooses the template version
    category: str = "transactional"  # the request's (transactional, marketing): labels the SLIs
    traceparent: str | None = None  # the request's trace context: the attempt's spans continue it


def from_channel_record(
    value: bytes,
    *,
    key: bytes | None,
    lane: Lane,
    source_topic: str,
    attempt: int = 1,
    not_before_ms: int = 0,
    last_error: str = "",
) -> Delivery:
    """Decode a ChannelMessage; raises ValueError (or fastavro's errors) on bad bytes."""
    msg = codec.decode("channel_message", value)
    return Delivery(
        message_key=msg["message_key"],
        channel=Channel(msg["channel"]),
        lane=lane,
        notification_id=msg["notification_id"],
        user_id=msg["user_id"],
        template_id=msg["template_id"],
        params=dict(msg.get("params") or {}),
        source_topic=source_topic,
        payload=value,
        kafka_key=key,
        attempt=attempt,
        not_before_ms=not_before_ms,
        last_error=last_error,
        event_time_ms=int(msg["event_time"]),
        category=str(msg["category"]),
        traceparent=msg.get("traceparent"),
    )


def from_delay_record(value: bytes, *, key: bytes | None, lane: Lane) -> Delivery:
    env = codec.decode("delayed_delivery", value)
    return from_channel_record(
        env["payload"],
        key=key,
        lane=lane,
        source_topic=env["source_topic"],
        attempt=env["attempt"],
        not_before_ms=env["not_before"],
        last_error=env["last_error"],
    )


def delay_record(d: Delivery, *, attempt: int, not_before_ms: int, last_error: str) -> dict[str, Any]:
    return {
        "message_key": d.message_key,
        "attempt": attempt,
        "not_before": not_before_ms,
        "last_error": last_error,
        "source_topic": d.source_topic,
        "payload": d.payload,
    }


def status_record(
    d: Delivery,
    *,
    status: DeliveryStatus,
    attempt: int,
    at_ms: int,
    provider: str | None = None,
    error: str | None = None,
    retry_at_ms: int | None = None,
    reason: str | None = None,
    not_before_ms: int | None = None,
    template: TemplateRef | None = None,
) -> dict[str, Any]:
    return {
        "message_key": d.message_key,
        "notification_id": d.notification_id,
        "channel": d.channel.value,
        "lane": d.lane.value,
        "status": status.value,
        "attempt": attempt,
        "provider": provider,
        "error": error,
        "retry_at": retry_at_ms,
        "at": at_ms,
        "reason": reason,
        "not_before": not_before_ms,
        "template": template.name if template else None,
        "template_version": template.version if template else None,
        "locale": template.locale if template else None,
    }


def dead_letter_record(
    *,
    message_key: str | None,
    channel: Channel,
    lane: Lane,
    reason_kind: DeadLetterReason,
    reason: str,
    attempts: int,
    provider: str | None,
    source_topic: str,
    payload: bytes,
    at_ms: int,
) -> dict[str, Any]:
    return {
        "message_key": message_key,
        "channel": channel.value,
        "lane": lane.value,
        "reason_kind": reason_kind.value,
        "reason": reason,
        "attempts": attempts,
        "provider": provider,
        "source_topic": source_topic,
        "payload": payload,
        "at": at_ms,
    }
