"""Topics, producing and consuming with confluent-kafka; every read is read_committed."""

from __future__ import annotations

import base64
import json
import logging
import time
import uuid
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from confluent_kafka import Consumer, KafkaError, KafkaException, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

from operators import codec
from operators.contract import Topics

logger = logging.getLogger(__name__)


def schema_of(topic: str, topics: Topics) -> str | None:
    """The schema stem of a topic of the data contract, or None for a topic outside it."""
    if topic == topics.requests:
        return "notification_request"
    if topic == topics.duplicates:
        return "duplicate_notice"
    if topic == topics.late:
        return "late_notice"
    if topic == topics.invalid:
        return "invalid_record"
    if topic in topics.outputs():
        return "channel_message"
    return None


def create_topics(
    client_config: Mapping[str, str], names: Iterable[str], partitions: int, replication: int = 1
) -> dict[str, str]:
    """Create topics; returns name -> "created" | "exists". Raises on any other error."""
    admin = AdminClient(dict(client_config))
    futures = admin.create_topics(
        [NewTopic(n, num_partitions=partitions, replication_factor=replication) for n in names],
        operation_timeout=30,
    )
    result = {}
    for name, future in futures.items():
        try:
            future.result()
            result[name] = "created"
        except KafkaException as exc:
            if exc.args[0].code() != KafkaError.TOPIC_ALREADY_EXISTS:
                raise
            result[name] = "exists"
    return result


def producer(client_config: Mapping[str, str], **extra: str) -> Producer:
    conf = {**client_config, "enable.idempotence": "true", "linger.ms": "5", **extra}
    return Producer(conf)


def produce_all(
    prod: Producer, topic: str, records: Iterable[tuple[bytes | None, bytes]], partition: int | None = None
) -> int:
    errors: list[str] = []

    def on_delivery(err: KafkaError | None, _msg: Any) -> None:
        if err is not None:
            errors.append(str(err))

    n = 0
    for key, value in records:
        while True:
            try:
                if partition is None:
                    prod.produce(topic, key=key, value=value, on_delivery=on_delivery)
                else:
                    prod.produce(topic, key=key, value=value, partition=partition, on_delivery=on_delivery)
                break
            except BufferError:
                prod.poll(0.1)
        n += 1
        prod.poll(0)
    if prod.flush(60) > 0:
        raise KafkaException(KafkaError(KafkaError._MSG_TIMED_OUT, "records still unsent after 60 s"))
    if errors:
        raise KafkaException(KafkaError(KafkaError._FAIL, f"{len(errors)} records failed: {errors[0]}"))
    return n


@dataclass(frozen=True)
class Message:
    topic: str
    partition: int
    offset: int
    key: bytes | None
    value: bytes | None
    timestamp_ms: int

    @classmethod
    def of(cls, msg: Any) -> Message:
        """A consumed record (not an error event) as a Message."""
        return cls(msg.topic(), msg.partition(), msg.offset(), msg.key(), msg.value(), msg.timestamp()[1])


def read_committed(
    client_config: Mapping[str, str],
    topics: Iterable[str],
    *,
    max_messages: int | None = None,
    idle_timeout_s: float = 5.0,
    overall_timeout_s: float | None = None,
) -> Iterator[Message]:
    """Every committed record of ``topics`` from the beginning, until idle for ``idle_timeout_s``."""
    names = list(topics)
    consumer = Consumer(
        {
            **client_config,
            "group.id": f"dedupctl-read-{uuid.uuid4().hex[:12]}",
            "isolation.level": "read_committed",
            "enable.auto.commit": "false",
            "auto.offset.reset": "earliest",
        }
    )
    try:
        metadata = consumer.list_topics(timeout=10)
        parts = [
            TopicPartition(t, p, -2)  # OFFSET_BEGINNING
            for t in names
            if t in metadata.topics
            for p in metadata.topics[t].partitions
        ]
        missing = [t for t in names if t not in metadata.topics]
        if missing:
            raise KafkaException(KafkaError(KafkaError.UNKNOWN_TOPIC_OR_PART, f"no such topic: {missing}"))
        consumer.assign(parts)
        seen = 0
        start = time.monotonic()
        last = start
        while True:
            now = time.monotonic()
            if now - last > idle_timeout_s:
                return
            if overall_timeout_s is not None and now - start > overall_timeout_s:
                return
            msg = consumer.poll(0.2)
            if msg is None:
                continue
            err = msg.error()
            if err is not None:
                if err.code() == KafkaError._PARTITION_EOF:
                    continue
                raise KafkaException(err)
            last = time.monotonic()
            yield Message.of(msg)
            seen += 1
            if max_messages is not None and seen >= max_messages:
                return
    finally:
        consumer.close()


def read_outputs(
    client_config: Mapping[str, str], topics: Topics, idle_timeout_s: float = 2.0
) -> dict[str, list[tuple[bytes | None, dict[str, Any]]]]:
    """Every committed record of every output topic, decoded: topic -> [(Kafka key, value)]."""
    out: dict[str, list[tuple[bytes | None, dict[str, Any]]]] = {t: [] for t in topics.outputs()}
    for msg in read_committed(client_config, topics.outputs(), idle_timeout_s=idle_timeout_s):
        stem = schema_of(msg.topic, topics)
        assert stem is not None and msg.value is not None
        out[msg.topic].append((msg.key, codec.decode(stem, msg.value)))
    return out


def decode_message(msg: Message, topics: Topics) -> dict[str, Any]:
    """A record as JSON-ready fields: its decoded value, or an error and the raw bytes."""
    stem = schema_of(msg.topic, topics)
    out: dict[str, Any] = {"topic": msg.topic, "partition": msg.partition, "offset": msg.offset}
    out["key"] = msg.key.decode("utf-8", "replace") if msg.key is not None else None
    if stem is None or msg.value is None:
        out["raw"] = base64.b64encode(msg.value or b"").decode()
        return out
    try:
        value = codec.decode(stem, msg.value)
    except Exception as exc:  # noqa: BLE001 - show what cannot be decoded instead of stopping
        out["error"] = f"{type(exc).__name__}: {exc}"
        out["raw"] = base64.b64encode(msg.value).decode()
        return out
    if stem == "invalid_record":
        value["raw"] = base64.b64encode(value["raw"]).decode()
    out["value"] = value
    return out


def to_json(record: Mapping[str, Any]) -> str:
    return json.dumps(record, ensure_ascii=False, sort_keys=False)
