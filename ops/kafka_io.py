"""Topics, producing and consuming with confluent-kafka; every read is read_committed."""

from __future__ import annotations

import base64
import json
import logging
import time
import uuid
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from confluent_kafka import Consumer, KafkaError, KafkaException, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, ConfigResource, NewTopic

from operators import codec
from operators.contract import Topics
from operators.errors import DedupError
from settings.kafka import KafkaSettings, default_min_insync

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


class TopicError(DedupError):
    """Topics cannot be made as asked: too few live brokers for their replicas, or a cluster
    whose default replication cannot be read."""


@dataclass(frozen=True)
class Replication:
    """How a new topic is replicated.

    :param factor: its replicas
    :param min_insync: its ``min.insync.replicas``
    """

    factor: int
    min_insync: int


def replication_for(
    factor: int | None, min_insync: int | None, cluster_default: int | None, live_brokers: Sequence[int]
) -> Replication:
    """The replication of new topics: the factor asked for, else the cluster's
    ``default.replication.factor``; the min ISR asked for, else 2 from 3 replicas on, else 1.
    Refused when the live brokers cannot hold that many replicas, or the min ISR is above them."""
    rf = factor if factor is not None else cluster_default
    if rf is None or rf < 1:
        raise TopicError("the cluster's default.replication.factor is unknown: set kafka.replication_factor")
    isr = min_insync if min_insync is not None else default_min_insync(rf)
    if isr > rf:
        raise TopicError(
            f"min.insync.replicas {isr} is above the replication factor {rf}: no write could be acknowledged;"
            " lower kafka.min_insync_replicas"
        )
    if rf > len(live_brokers):
        where = "kafka.replication_factor" if factor is not None else "the cluster's default.replication.factor"
        raise TopicError(
            f"replication factor {rf} ({where}) needs {rf} live brokers, and the cluster has {len(live_brokers)}"
            f" (ids {', '.join(map(str, sorted(live_brokers))) or 'none'}): start the missing brokers, or set"
            " kafka.replication_factor lower"
        )
    return Replication(rf, isr)


def create_topics(
    client_config: Mapping[str, str],
    names: Iterable[str],
    partitions: int,
    replication: int | None = None,
    *,
    min_insync_replicas: int | None = None,
    config: Mapping[str, str] | None = None,
    timeout_s: float = 30.0,
) -> dict[str, str]:
    """Create the topics that do not exist yet; returns name -> "created" | "exists".

    Every topic any part of the project makes is made here: ``replication`` replicas (None: the
    cluster's ``default.replication.factor``) and ``min.insync.replicas`` (None: 2 from 3 replicas
    on, else 1), see ``replication_for``; ``config`` adds topic settings (``cleanup.policy``).
    Raises TopicError when too few brokers are alive for the replicas, KafkaException on any other
    error, or when the brokers do not answer within ``timeout_s``. Topics that exist are left as
    they are (a warning names those with fewer replicas).
    """
    wanted = list(dict.fromkeys(names))
    admin = AdminClient(dict(client_config))
    metadata = admin.list_topics(timeout=timeout_s)
    missing = [n for n in wanted if n not in metadata.topics]
    result = {n: "exists" for n in wanted if n not in missing}
    if not missing:
        return result
    default = None if replication is not None else _default_replication(admin, sorted(metadata.brokers))
    plan = replication_for(replication, min_insync_replicas, default, list(metadata.brokers))
    for name in result:
        held = min(len(p.replicas) for p in metadata.topics[name].partitions.values())
        if held < plan.factor:
            logger.warning("topic %s exists with %d replicas, fewer than the %d new ones get", name, held, plan.factor)
    topic_config = {"min.insync.replicas": str(plan.min_insync), **(config or {})}
    logger.info("creating %d topic(s): %d partitions, %d replicas, min.insync.replicas %d",
                len(missing), partitions, plan.factor, plan.min_insync)
    futures = admin.create_topics(
        [NewTopic(n, num_partitions=partitions, replication_factor=plan.factor, config=topic_config) for n in missing],
        operation_timeout=timeout_s, request_timeout=timeout_s,
    )
    for name, future in futures.items():
        try:
            future.result()
            result[name] = "created"
        except KafkaException as exc:
            code = exc.args[0].code()
            if code == KafkaError.TOPIC_ALREADY_EXISTS:
                result[name] = "exists"
            elif code == KafkaError.INVALID_REPLICATION_FACTOR:
                raise TopicError(f"topic {name}: {exc.args[0].str()}") from None
            else:
                raise
    _wait_visible(admin, [n for n in missing if result[n] == "created"], partitions)
    return {n: result[n] for n in wanted}


def _wait_visible(admin: AdminClient, names: Sequence[str], partitions: int, timeout_s: float = 30.0) -> None:
    """Until every broker asked knows the new topics with a leader for each partition: the
    controller has made them, but a broker's metadata may lag by a moment."""
    deadline = time.monotonic() + timeout_s
    pending = list(names)
    while pending and time.monotonic() < deadline:
        topics = admin.list_topics(timeout=10).topics
        pending = [n for n in pending if n not in topics or len(topics[n].partitions) < partitions
                   or any(p.leader < 0 for p in topics[n].partitions.values())]
        if pending:
            time.sleep(0.1)


def ensure_topics(
    kafka: KafkaSettings,
    names: Iterable[str],
    partitions: int | None = None,
    *,
    config: Mapping[str, str] | None = None,
    timeout_s: float = 30.0,
) -> dict[str, str]:
    """``create_topics`` with the replication and partitions of the ``[kafka]`` settings."""
    return create_topics(
        kafka.client_config(), names, partitions or kafka.partitions, kafka.replication_factor,
        min_insync_replicas=kafka.min_insync_replicas, config=config, timeout_s=timeout_s,
    )


def topic_replication(client_config: Mapping[str, str], topic: str, timeout_s: float = 15.0) -> Replication:
    """How an existing topic is replicated, read back: its fewest replicas of any partition and
    its ``min.insync.replicas``. A topic just made may be unknown to some brokers for a moment:
    asked again until ``timeout_s``."""
    admin = AdminClient(dict(client_config))
    resource = ConfigResource(ConfigResource.Type.TOPIC, topic)
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            metadata = admin.list_topics(topic, timeout=30)
            if topic not in metadata.topics or metadata.topics[topic].error is not None:
                raise KafkaException(KafkaError(KafkaError.UNKNOWN_TOPIC_OR_PART, f"no such topic: {topic}"))
            entries = admin.describe_configs([resource], request_timeout=30)[resource].result()
            replicas = min(len(p.replicas) for p in metadata.topics[topic].partitions.values())
            return Replication(replicas, int(entries["min.insync.replicas"].value))
        except KafkaException as exc:
            if exc.args[0].code() != KafkaError.UNKNOWN_TOPIC_OR_PART or time.monotonic() > deadline:
                raise
            time.sleep(0.2)


#: a partition's leader moved under a request (a broker down or back): ask again with fresh metadata
_LEADER_MOVED = frozenset({KafkaError.UNKNOWN_LEADER_EPOCH, KafkaError.FENCED_LEADER_EPOCH,
                           KafkaError.NOT_LEADER_FOR_PARTITION, KafkaError.LEADER_NOT_AVAILABLE})


def stable_offsets(client_config: Mapping[str, str], topics: Iterable[str], timeout_s: float = 60.0) -> int:
    """The sum of the topics' last stable offsets: what ``read_committed`` readers can see grows it.
    A retriable error, or a leader that moved while a broker is down (``_LEADER_MOVED``), asks
    again with fresh metadata, until ``timeout_s``."""
    from confluent_kafka import IsolationLevel
    from confluent_kafka.admin import OffsetSpec

    wanted = list(topics)
    admin = AdminClient(dict(client_config))
    deadline = time.monotonic() + timeout_s
    while True:
        metadata = admin.list_topics(timeout=30)
        parts = [TopicPartition(t, p) for t in wanted for p in metadata.topics[t].partitions]
        futures = admin.list_offsets({tp: OffsetSpec.latest() for tp in parts},
                                     isolation_level=IsolationLevel.READ_COMMITTED, request_timeout=30)
        try:
            return sum(int(f.result().offset) for f in futures.values())
        except KafkaException as exc:
            err = exc.args[0]
            if not (err.retriable() or err.code() in _LEADER_MOVED) or time.monotonic() > deadline:
                raise
            time.sleep(0.5)


def _default_replication(admin: AdminClient, brokers: Sequence[int]) -> int:
    """The cluster's ``default.replication.factor``, as a broker reports it."""
    if not brokers:
        raise TopicError("no live broker to create topics on")
    resource = ConfigResource(ConfigResource.Type.BROKER, str(brokers[0]))
    try:
        entries = admin.describe_configs([resource], request_timeout=30)[resource].result()
        return int(entries["default.replication.factor"].value)
    except (KafkaException, KeyError, ValueError) as exc:
        raise TopicError(
            f"cannot read the cluster's default.replication.factor ({exc}): set kafka.replication_factor"
        ) from None


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
    until_end: bool = False,
) -> Iterator[Message]:
    """Every committed record of ``topics`` from the beginning, until idle for ``idle_timeout_s``;
    ``until_end``: until every partition has been read to its end (its last stable offset), so
    that a pause in delivery (a leader that moved, a busy machine) does not end the read early."""
    names = list(topics)
    consumer = Consumer(
        {
            **client_config,
            "group.id": f"dedupctl-read-{uuid.uuid4().hex[:12]}",
            "isolation.level": "read_committed",
            "enable.auto.commit": "false",
            "auto.offset.reset": "earliest",
            "enable.partition.eof": "true" if until_end else "false",
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
        ended: set[tuple[str, int]] = set()
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
                    ended.add((str(msg.topic()), int(msg.partition() or 0)))
                    if until_end and len(ended) == len(parts):
                        return
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
    client_config: Mapping[str, str], topics: Topics, idle_timeout_s: float = 2.0, until_end: bool = False
) -> dict[str, list[tuple[bytes | None, dict[str, Any]]]]:
    """Every committed record of every output topic, decoded: topic -> [(Kafka key, value)]
    (``until_end``: see ``read_committed``)."""
    out: dict[str, list[tuple[bytes | None, dict[str, Any]]]] = {t: [] for t in topics.outputs()}
    for msg in read_committed(client_config, topics.outputs(), idle_timeout_s=idle_timeout_s, until_end=until_end):
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
