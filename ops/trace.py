"""``dedupctl trace ID``: what became of a notification, answered from the topics.

ID is a notification_id or a dedup key. The requests topic is read first: the requests with
that id, or whose dedup key is ID, give the ids and dedup keys to follow. Then the output topics:
channel messages (accepted, with topic and message key), duplicate notices (suppressed, and the
original they repeat), late notices (with the watermark), invalid records whose raw bytes
mention ID (best effort: a record that cannot be decoded has no fields to match), and, when the
senders' status topic exists, the delivery status of each message. Every read is read_committed,
from the start of each partition (or ``--since``) to its end when the scan reaches it.

Message parameters are never printed: they can hold one-time codes and addresses.
"""

from __future__ import annotations

import re
import time
import uuid
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import asdict, dataclass, field
from datetime import datetime
from typing import Any

from confluent_kafka import OFFSET_BEGINNING, OFFSET_END, Consumer, KafkaError, KafkaException, TopicPartition

from operators import codec
from operators.contract import Topics
from operators.dedup_key import dedup_key_of, derive_dedup_key, key_group_of, resolve_dedup_key, shard_of
from operators.errors import DedupError, InvalidRecordError
from ops import kafka_io
from settings import Settings

STATUS_SCHEMA = "delivery_status"


@dataclass(frozen=True)
class Where:
    """A record's place in Kafka."""

    topic: str
    partition: int
    offset: int
    key: str | None = None

    def __str__(self) -> str:
        return f"{self.topic}[{self.partition}]@{self.offset}"


@dataclass
class NotificationTrace:
    """Everything the topics hold about one notification id."""

    notification_id: str
    dedup_key: str | None = None
    request: dict[str, Any] | None = None
    request_at: Where | None = None
    accepted: list[dict[str, Any]] = field(default_factory=list)
    duplicate: dict[str, Any] | None = None
    late: dict[str, Any] | None = None
    statuses: list[dict[str, Any]] = field(default_factory=list)

    @property
    def channels(self) -> dict[str, dict[str, Any]]:
        """Per channel, where its message stands: the latest status record's status, reason,
        ``not_before`` (deferred), attempts, provider and template version."""
        latest: dict[str, dict[str, Any]] = {}
        for s in sorted(self.statuses, key=lambda s: (s.get("at") or 0, s["kafka"]["offset"])):
            latest[str(s.get("channel"))] = s
        return {
            channel: {
                "message_key": s.get("message_key"),
                "status": s.get("status"),
                "reason": s.get("reason"),
                "not_before": s.get("not_before") if s.get("status") == "deferred" else None,
                "attempts": s.get("attempt"),
                "provider": s.get("provider"),
                "template": s.get("template"),
                "template_version": s.get("template_version"),
                "locale": s.get("locale"),
                "at": s.get("at"),
            }
            for channel, s in sorted(latest.items())
        }

    @property
    def verdict(self) -> str:
        if self.accepted:
            return "accepted"
        if self.duplicate is not None:
            return "duplicate"
        if self.late is not None:
            return "late"
        return "pending" if self.request is not None else "unknown"


@dataclass
class TraceResult:
    query: str
    notifications: dict[str, NotificationTrace] = field(default_factory=dict)
    invalid: list[dict[str, Any]] = field(default_factory=list)
    topics_read: list[str] = field(default_factory=list)
    status_topic: str | None = None
    shards: int | None = None
    max_parallelism: int | None = None

    @property
    def found(self) -> bool:
        return bool(self.notifications or self.invalid)

    def of(self, notification_id: str) -> NotificationTrace:
        if notification_id not in self.notifications:
            self.notifications[notification_id] = NotificationTrace(notification_id)
        return self.notifications[notification_id]

    def placement(self, dedup_key: str | None) -> dict[str, int] | None:
        """Where the job keeps a dedup key's state: its shard (the key of key_by) and the shard's
        Flink key group, both fixed for the life of the state (dedup.shards, max parallelism)."""
        if dedup_key is None or self.shards is None or self.max_parallelism is None:
            return None
        shard = shard_of(dedup_key, self.shards)
        return {"shard": shard, "key_group": key_group_of(shard, self.max_parallelism)}

    def to_dict(self) -> dict[str, Any]:
        out = asdict(self)
        for nid, n in self.notifications.items():
            out["notifications"][nid]["verdict"] = n.verdict
            out["notifications"][nid]["channels"] = n.channels
            out["notifications"][nid]["state"] = self.placement(n.dedup_key)
        return out


def _summary(request: Mapping[str, Any]) -> dict[str, Any]:
    """A request's fields without its params (they can hold codes and addresses)."""
    return {k: v for k, v in request.items() if k != "params"}


def resolved_key(request: Mapping[str, Any]) -> str:
    return str(request.get("dedup_key") or derive_dedup_key(
        str(request["user_id"]), str(request["template_id"]), request.get("params") or {}
    ))


def _decode(stem: str, raw: bytes) -> dict[str, Any] | None:
    """A record of a topic of the data contract, or None when it cannot be read (skipped)."""
    try:
        return dict(codec.decode(stem, raw))
    except Exception:  # noqa: BLE001 - fastavro raises many types; one bad record must not end a trace
        return None


def _where(msg: kafka_io.Message) -> Where:
    key = msg.key.decode("utf-8", "replace") if msg.key else None
    return Where(msg.topic, msg.partition, msg.offset, key)


class Tracer:
    """Matches records against the query and what the requests topic said about it."""

    def __init__(
        self, query: str, topics: Topics, status_topic: str | None = None, *,
        shards: int | None = None, max_parallelism: int | None = None,
    ) -> None:
        self.topics = topics
        self.result = TraceResult(query, status_topic=status_topic, shards=shards, max_parallelism=max_parallelism)
        self.ids: set[str] = {query}
        self.keys: set[str] = {query}
        self._needle = query.encode("utf-8")

    def add_request(self, msg: kafka_io.Message) -> None:
        try:
            req = codec.decode_request(msg.value or b"")
        except InvalidRecordError:
            return  # invalid input: the job sent it to the invalid topic, matched there
        key = resolve_dedup_key(req)
        if req.notification_id != self.result.query and key != self.result.query:
            return
        n = self.result.of(req.notification_id)
        n.request, n.request_at, n.dedup_key = _summary(req.to_avro()), _where(msg), key
        self.ids.add(req.notification_id)
        self.keys.add(key)

    def add_output(self, msg: kafka_io.Message) -> None:
        t = self.topics
        if msg.value is None:
            return
        if msg.topic == self.result.status_topic:
            self._status(msg)
        elif msg.topic == t.invalid:
            if self._needle in msg.value:
                rec = _decode("invalid_record", msg.value)
                if rec is None:
                    return
                # the raw bytes are not shown: they can hold a request's params
                self.result.invalid.append({
                    "kafka": asdict(_where(msg)), "error": rec["error"],
                    "source": str(Where(rec["topic"], rec["partition"], rec["offset"])),
                })
        elif msg.topic == t.duplicates:
            notice = _decode("duplicate_notice", msg.value)
            if notice is None:
                return
            original = notice["original_notification_id"]
            if self._ours(notice["notification_id"], notice["dedup_key"]) or original in self.ids:
                n = self.result.of(notice["notification_id"])
                n.dedup_key = notice["dedup_key"]
                n.duplicate = {**notice, "kafka": asdict(_where(msg))}
        elif msg.topic == t.late:
            notice = _decode("late_notice", msg.value)
            if notice is None:
                return
            req = notice["request"]
            key = resolved_key(req)
            if self._ours(req["notification_id"], key):
                n = self.result.of(req["notification_id"])
                n.dedup_key = key
                n.request = n.request or _summary(req)
                n.late = {"watermark": notice["watermark"], "reason": notice["reason"]}
                n.late["kafka"] = asdict(_where(msg))
        elif msg.topic in t.outputs():
            m = _decode("channel_message", msg.value)
            if m is not None and self._ours(m["notification_id"], m["dedup_key"]):
                n = self.result.of(m["notification_id"])
                n.dedup_key = m["dedup_key"]
                n.request = n.request or _summary({k: m[k] for k in m if k not in ("message_key", "channel")})
                n.accepted.append({
                    "channel": m["channel"], "priority": m["priority"], "message_key": m["message_key"],
                    "kafka": asdict(_where(msg)),
                })

    def _ours(self, notification_id: str, dedup_key: str | None) -> bool:
        return notification_id in self.ids or dedup_key in self.keys

    def _status(self, msg: kafka_io.Message) -> None:
        status = _decode(STATUS_SCHEMA, msg.value or b"")
        if status is None:
            return
        key = str(status.get("message_key", ""))
        if self._ours(str(status.get("notification_id", "")), dedup_key_of(key)):
            n = self.result.of(str(status["notification_id"]))
            n.statuses.append({**status, "kafka": asdict(_where(msg))})


def scan(
    client_config: Mapping[str, str],
    topics: Iterable[str],
    *,
    since_ms: int | None = None,
    timeout_s: float = 60.0,
) -> Iterator[kafka_io.Message]:
    """Every committed record of ``topics`` up to each partition's end as the scan reaches it."""
    consumer = Consumer({
        **client_config,
        "group.id": f"dedupctl-trace-{uuid.uuid4().hex[:12]}",
        "isolation.level": "read_committed",
        "enable.auto.commit": "false",
        "enable.partition.eof": "true",
        "auto.offset.reset": "earliest",
    })
    try:
        metadata = consumer.list_topics(timeout=10)
        names = list(topics)
        missing = [t for t in names if t not in metadata.topics]
        if missing:
            raise KafkaException(KafkaError(KafkaError.UNKNOWN_TOPIC_OR_PART, f"no such topic: {missing}"))
        parts = [TopicPartition(t, p, OFFSET_BEGINNING) for t in names for p in metadata.topics[t].partitions]
        if since_ms is not None and parts:
            wanted = [TopicPartition(p.topic, p.partition, since_ms) for p in parts]
            parts = [
                TopicPartition(p.topic, p.partition, p.offset if p.offset >= 0 else OFFSET_END)
                for p in consumer.offsets_for_times(wanted, 10)
            ]
        consumer.assign(parts)
        pending = {(p.topic, p.partition) for p in parts}
        deadline = time.monotonic() + timeout_s
        while pending and time.monotonic() < deadline:
            msg = consumer.poll(0.2)
            if msg is None:
                continue
            err = msg.error()
            if err is not None:
                if err.code() == KafkaError._PARTITION_EOF:
                    pending.discard((msg.topic(), msg.partition()))
                    continue
                raise KafkaException(err)
            yield kafka_io.Message.of(msg)
    finally:
        consumer.close()


def existing_topics(client_config: Mapping[str, str], names: Iterable[str]) -> set[str]:
    consumer = Consumer({**client_config, "group.id": f"dedupctl-trace-{uuid.uuid4().hex[:12]}"})
    try:
        known = consumer.list_topics(timeout=10).topics
    finally:
        consumer.close()
    return {n for n in names if n in known}


def status_topic_of(cfg: Settings) -> str | None:
    """The senders' status topic, when this build has senders (another component)."""
    senders = getattr(cfg, "senders", None)
    topic = getattr(senders, "status_topic", None)
    return str(topic) if topic else None


class TraceError(DedupError):
    """The topics to trace in are not there."""


def trace(
    cfg: Settings, query: str, *, since_ms: int | None = None, timeout_s: float = 60.0
) -> TraceResult:
    client = cfg.kafka.client_config()
    topics = cfg.topics
    status_topic = status_topic_of(cfg)
    found = existing_topics(client, [*topics.all(), *([status_topic] if status_topic else [])])
    missing = [t for t in topics.all() if t not in found]
    if missing:
        raise TraceError(f"no topic {', '.join(missing)} on {cfg.kafka.bootstrap_servers}: check [topics]")
    if status_topic not in found or STATUS_SCHEMA not in codec.SCHEMA_FILES:
        status_topic = None
    tracer = Tracer(query, topics, status_topic, shards=cfg.dedup.shards, max_parallelism=cfg.flink.max_parallelism)
    for msg in scan(client, [topics.requests], since_ms=since_ms, timeout_s=timeout_s):
        tracer.add_request(msg)
    outputs = [*topics.outputs(), *([status_topic] if status_topic else [])]
    for msg in scan(client, outputs, since_ms=since_ms, timeout_s=timeout_s):
        tracer.add_output(msg)
    tracer.result.topics_read = [topics.requests, *outputs]
    return tracer.result


_RELATIVE = re.compile(r"^(\d+(?:\.\d+)?)([smhd])$")


def parse_since(text: str, now_ms: int | None = None) -> int:
    """``30m``, ``2h``, ``7d`` ago; epoch milliseconds; or ISO-8601 (``...Z`` or an offset)."""
    now_ms = int(time.time() * 1000) if now_ms is None else now_ms
    rel = _RELATIVE.match(text.strip())
    if rel:
        unit = {"s": 1_000, "m": 60_000, "h": 3_600_000, "d": 86_400_000}[rel.group(2)]
        return now_ms - int(float(rel.group(1)) * unit)
    if text.strip().isdigit():
        return int(text)
    return int(datetime.fromisoformat(text.strip().replace("Z", "+00:00")).timestamp() * 1000)
