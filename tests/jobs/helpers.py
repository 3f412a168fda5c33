"""Reading what the job wrote, the way a user would: read_committed, decoded, per topic."""

from __future__ import annotations

import time
from collections.abc import Iterable
from typing import Any

from operators.contract import Topics
from operators.records import NotificationRequest
from ops import kafka_io


def read_outputs(bootstrap: str, topics: Topics, idle_s: float = 2.0) -> dict[str, list[tuple[bytes | None, Any]]]:
    """Every committed record of every output topic: topic -> [(key, decoded value)]."""
    return dict(kafka_io.read_outputs({"bootstrap.servers": bootstrap}, topics, idle_timeout_s=idle_s))


def wait_for_total(bootstrap: str, topics: Topics, total: int, timeout_s: float = 120.0) -> None:
    """Until at least ``total`` committed records are in the output topics."""
    deadline = time.monotonic() + timeout_s
    seen = 0
    while time.monotonic() < deadline:
        seen = sum(len(v) for v in read_outputs(bootstrap, topics, idle_s=1.0).values())
        if seen >= total:
            return
        time.sleep(1.0)
    raise AssertionError(f"only {seen} of {total} output records after {timeout_s:.0f} s")


def produce(bootstrap: str, topic: str, records: Iterable[tuple[bytes | None, bytes, int | None]]) -> None:
    prod = kafka_io.producer({"bootstrap.servers": bootstrap})
    for key, value, partition in records:
        kafka_io.produce_all(prod, topic, [(key, value)], partition)


def channel_message(req: NotificationRequest, dedup_key: str, channel: str) -> dict[str, Any]:
    """The ChannelMessage a user expects, written out field by field."""
    return {
        "message_key": f"{dedup_key}:{channel}:{req.event_time}",
        "channel": channel,
        "notification_id": req.notification_id,
        "user_id": req.user_id,
        "template_id": req.template_id,
        "params": dict(req.params),
        "channels": [str(c) for c in req.channels],
        "priority": str(req.priority),
        "category": str(req.category),
        "event_time": req.event_time,
        "dedup_key": dedup_key,
        "dedup_ttl_sec": req.dedup_ttl_sec,
        "traceparent": req.traceparent,
    }
