"""Typed records of the data contract (schemas/*.avsc is the source of truth for the wire)."""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum


class Channel(StrEnum):
    PUSH = "push"
    SMS = "sms"
    EMAIL = "email"


class Priority(StrEnum):
    HIGH = "high"
    NORMAL = "normal"
    LOW = "low"


class Category(StrEnum):
    TRANSACTIONAL = "transactional"
    MARKETING = "marketing"


@dataclass(frozen=True, slots=True)
class NotificationRequest:
    """One validated request from ``notifications.requests``."""

    notification_id: str
    user_id: str
    template_id: str
    channels: tuple[Channel, ...]
    event_time: int
    params: dict[str, str] = field(default_factory=dict)
    priority: Priority = Priority.NORMAL
    category: Category = Category.TRANSACTIONAL
    dedup_key: str | None = None
    dedup_ttl_sec: int | None = None
    traceparent: str | None = None  # W3C trace context of the request's trace (operators.tracing)

    def to_avro(self) -> dict[str, object]:
        """The request as the dict fastavro writes for ``NotificationRequest``."""
        return {
            "notification_id": self.notification_id,
            "user_id": self.user_id,
            "template_id": self.template_id,
            "params": dict(self.params),
            "channels": [str(c) for c in self.channels],
            "priority": str(self.priority),
            "category": str(self.category),
            "event_time": self.event_time,
            "dedup_key": self.dedup_key,
            "dedup_ttl_sec": self.dedup_ttl_sec,
            "traceparent": self.traceparent,
        }


@dataclass(frozen=True, slots=True)
class SourcePosition:
    """Where a raw record was read from."""

    topic: str
    partition: int
    offset: int
