"""What the delivery benchmark feeds the senders and reads back: the profile file (JSON lines for
``dedupctl users import``), channel messages as the dedup job writes them (message key
``<dedup_key>:<channel>:<event_time>``, Kafka key the user id) produced in committed
transactions, and the status records the senders publish."""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from confluent_kafka import KafkaException, Producer

from operators import codec
from operators.dedup_key import derive_dedup_key, message_key
from operators.records import Category, Channel, Priority
from ops import kafka_io

CAMPAIGN_TEMPLATE = "eid_sale"  # marketing, every channel: a campaign as the API runs one
CODE_TEMPLATE = "otp"  # transactional, SMS, one-time code: the priority lane
MAX_USERS = 10_000_000  # the phone numbers below have 7 digits of user number


def campaign_user(i: int) -> str:
    return f"u-{i}"


def code_user(i: int) -> str:
    return f"otp-{i}"


def profile_line(user: str, number: int, prefix: str = "1555") -> str:
    """A user with an address on every channel (verified, active), English."""
    if not 0 <= number < MAX_USERS:
        raise ValueError(f"user number {number} out of range")
    return json.dumps({
        "user_id": user, "locale": "en",
        "contacts": {"push": [f"tok-{user}"], "sms": [f"+{prefix}{number:07d}"], "email": [f"{user}@example.com"]},
    })


def write_profiles(path: Path, campaign_users: int, code_users: int = 0) -> Path:
    """The import file: ``u-0`` .. and ``otp-0`` .. (codes go to numbers of their own)."""
    with path.open("w", encoding="utf-8") as out:
        for i in range(campaign_users):
            out.write(profile_line(campaign_user(i), i) + "\n")
        for i in range(code_users):
            out.write(profile_line(code_user(i), i, prefix="1666") + "\n")
    return path


def channel_message(
    *, user: str, channel: Channel, notification_id: str, template: str, params: dict[str, str],
    category: Category, priority: Priority, event_time: int,
) -> dict[str, Any]:
    """A ChannelMessage as the job writes it: the derived dedup key, the contract's message key."""
    dedup_key = derive_dedup_key(user, template, params)
    return {
        "message_key": message_key(dedup_key, channel, {"event_time": event_time}),
        "channel": channel.value, "notification_id": notification_id, "user_id": user, "template_id": template,
        "params": params, "channels": [channel.value], "priority": priority.value, "category": category.value,
        "event_time": event_time, "dedup_key": dedup_key, "dedup_ttl_sec": None,
    }


def campaign_messages(run: str, channel: Channel, users: int, event_time: int) -> list[dict[str, Any]]:
    return [
        channel_message(user=campaign_user(i), channel=channel, notification_id=f"{run}-c{i}",
                        template=CAMPAIGN_TEMPLATE, params={"pct": "20", "campaign": run},
                        category=Category.MARKETING, priority=Priority.NORMAL, event_time=event_time)
        for i in range(users)
    ]


def code_message(run: str, i: int, event_time: int) -> dict[str, Any]:
    return channel_message(user=code_user(i), channel=Channel.SMS, notification_id=f"{run}-otp{i}",
                           template=CODE_TEMPLATE, params={"code": f"{(i * 7919) % 1_000_000:06d}", "run": run},
                           category=Category.TRANSACTIONAL, priority=Priority.HIGH, event_time=event_time)


class TransactionalWriter:
    """Channel messages into a topic in committed transactions, as the job's sink writes them."""

    def __init__(self, bootstrap: str, name: str) -> None:
        self.producer = Producer({
            "bootstrap.servers": bootstrap, "transactional.id": f"bench-writer-{name}-{uuid.uuid4().hex[:8]}",
            "linger.ms": "20", "queue.buffering.max.messages": "1000000",
        })
        self.producer.init_transactions(30)

    def write(self, topic: str, messages: Iterable[dict[str, Any]], per_transaction: int = 10_000) -> int:
        """All of them, ``per_transaction`` in each; returns how many."""
        n = 0
        self.producer.begin_transaction()
        for m in messages:
            self._produce(topic, m, None)
            n += 1
            if n % per_transaction == 0:
                self.producer.commit_transaction(60)
                self.producer.begin_transaction()
        self.producer.commit_transaction(60)
        return n

    def write_one(self, topic: str, message: dict[str, Any]) -> int:
        """One message in a transaction of its own; returns its Kafka timestamp (ms), its write time."""
        stamp = int(time.time() * 1000)
        self.producer.begin_transaction()
        self._produce(topic, message, stamp)
        self.producer.commit_transaction(30)
        return stamp

    def _produce(self, topic: str, m: dict[str, Any], stamp: int | None) -> None:
        value = codec.encode("channel_message", m)
        while True:
            try:
                self.producer.produce(topic, key=m["user_id"].encode(), value=value, timestamp=stamp or 0)
                break
            except BufferError:
                self.producer.poll(0.1)
        self.producer.poll(0)

    def close(self) -> None:
        if self.producer.flush(30) > 0:
            raise KafkaException("the writer's records were still unsent after 30 s")


@dataclass
class Statuses:
    """What the senders published on their status topic, per message key."""

    claimed_ms: dict[str, int] = field(default_factory=dict)  # the first ``sending`` record's time
    final: dict[str, str] = field(default_factory=dict)  # the last status record's status
    records: int = 0

    def counts(self) -> dict[str, int]:
        out: dict[str, int] = {}
        for status in self.final.values():
            out[status] = out.get(status, 0) + 1
        return dict(sorted(out.items()))


def read_statuses(bootstrap: str, topic: str, expect: int, timeout_s: float = 60.0) -> Statuses:
    """The status topic, read_committed, until ``expect`` keys have a final status (sent,
    delivered, failed, skipped, rejected), it is idle for 3 s, or ``timeout_s`` passed."""
    final = {"sent", "delivered", "failed", "skipped", "rejected"}
    out = Statuses()
    done = 0
    for msg in kafka_io.read_committed({"bootstrap.servers": bootstrap}, [topic], idle_timeout_s=3.0,
                                       overall_timeout_s=timeout_s):
        if msg.value is None:
            continue
        rec = codec.decode("delivery_status", msg.value)
        out.records += 1
        key, status = rec["message_key"], rec["status"]
        if status == "sending":
            out.claimed_ms.setdefault(key, int(rec["at"]))
        was_final = out.final.get(key) in final
        out.final[key] = status
        if status in final and not was_final:
            done += 1
            if done >= expect:
                break
    return out


def iter_keys(messages: Iterable[dict[str, Any]]) -> Iterator[str]:
    for m in messages:
        yield str(m["message_key"])
