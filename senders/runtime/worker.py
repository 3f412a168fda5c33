"""A sender worker: one consumer (read_committed) on a channel topic and its delay topics, one
transactional producer. Each batch's status, retry and dead-letter records and its consumer
offsets commit in one Kafka transaction, after the status store has recorded the outcomes.

A retry that is not due yet holds its partition: the consumer seeks back to it and pauses that
partition until the retry's time, while every other partition goes on.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from confluent_kafka import Consumer, KafkaError, KafkaException, Message, Producer, TopicPartition

from senders.errors import SenderError, StoreUnavailableError
from senders.runtime.handler import DeliveryHandler, Output
from senders.runtime.metrics import Metrics

logger = logging.getLogger(__name__)

TP = tuple[str, int]


@dataclass(frozen=True, slots=True)
class WorkerOptions:
    """How a worker talks to Kafka.

    :param group_id: its consumer group (one per channel and lane)
    :param transactional_id: its producer's transactional id (unique among live workers)
    :param source_topic: the channel topic (a lane of one channel)
    :param delay_topics: that topic's delay topics: name -> delay step (ms)
    :param batch_size: records per poll, committed as one transaction
    :param poll_timeout_s: longest wait for records
    :param session_timeout_ms: consumer session timeout
    :param transaction_timeout_ms: producer transaction timeout
    :param lag_interval_s: how often consumer lag is measured
    :param kafka_timeout_s: the longest wait on the broker (init_transactions, metadata, a
        commit) before ``run`` gives up with an exception
    """

    group_id: str
    transactional_id: str
    source_topic: str
    delay_topics: Mapping[str, int]
    batch_size: int = 200
    poll_timeout_s: float = 0.1
    session_timeout_ms: int = 45_000
    transaction_timeout_ms: int = 60_000
    lag_interval_s: float = 1.0
    kafka_timeout_s: float = 30.0


def _position(msg: Message) -> tuple[str, int, int]:
    topic, partition, offset = msg.topic(), msg.partition(), msg.offset()
    assert topic is not None and partition is not None and offset is not None  # a record, not an error
    return topic, partition, offset


def _abort_quietly(producer: Producer) -> None:
    """Abort an open transaction on the way out, so that read_committed readers need not wait
    for the broker's transaction timeout; a fatal producer cannot, and the broker will."""
    try:
        producer.abort_transaction(5)
    except KafkaException:
        logger.debug("abort_transaction failed", exc_info=True)


def _bytes(raw: str | bytes | None) -> bytes | None:
    return raw.encode() if isinstance(raw, str) else raw


class SenderWorker:
    def __init__(
        self,
        *,
        name: str,
        client_config: Mapping[str, str],
        options: WorkerOptions,
        handler: DeliveryHandler,
        metrics: Metrics,
    ) -> None:
        self.name = name
        self.options = options
        self.handler = handler
        self.metrics = metrics
        self.ready = threading.Event()  # set once partitions are assigned
        self._client_config = dict(client_config)
        self._delay = set(options.delay_topics)
        self._holds: dict[TP, tuple[int, int]] = {}  # partition -> (offset to resume at, until ms)
        self._assigned: list[TopicPartition] = []
        self._unpause: list[TopicPartition] = []
        self._labels = {"channel": handler.channel.value, "lane": handler.lane.value}
        self._next_lag = 0.0
        #: makes the transactional producer (a test replaces it to inject broker errors)
        self.producer_factory: Callable[[dict[str, str]], Producer] = Producer

    # -- lifecycle --------------------------------------------------------------------------------

    def run(self, stop: threading.Event) -> None:
        """Consume until ``stop``; raises on a failure (broker or store unreachable, producer
        fenced), after which a new ``run`` starts over from the committed offsets."""
        o = self.options
        self._holds, self._assigned, self._unpause = {}, [], []
        consumer = Consumer(
            {
                **self._client_config,
                "group.id": o.group_id,
                "isolation.level": "read_committed",
                "enable.auto.commit": "false",
                "auto.offset.reset": "earliest",
                "session.timeout.ms": str(o.session_timeout_ms),
                "fetch.wait.max.ms": "100",
            }
        )
        producer = self.producer_factory(
            {
                **self._client_config,
                "transactional.id": o.transactional_id,
                "transaction.timeout.ms": str(o.transaction_timeout_ms),
                "linger.ms": "5",
            }
        )
        try:
            producer.init_transactions(o.kafka_timeout_s)
            self._await_topics(consumer, [o.source_topic, *o.delay_topics], o.kafka_timeout_s)
            consumer.subscribe(
                [o.source_topic, *o.delay_topics],
                on_assign=self._on_assign,
                on_revoke=self._on_revoke,
                on_lost=self._on_revoke,
            )
            logger.info("%s consuming %s (group %s)", self.name, o.source_topic, o.group_id)
            self.metrics.set("sender_worker_up", 1, **self._labels)
            while not stop.is_set():
                if self._unpause:
                    # holds end with the assignment; make sure no pause outlives it either
                    consumer.resume(self._unpause)
                    self._unpause = []
                self._resume_due(consumer)
                batch = consumer.consume(num_messages=o.batch_size, timeout=self._poll_timeout())
                if batch:
                    self._process(consumer, producer, batch)
                self._measure_lag(consumer)
                self.handler.housekeeping()
        finally:
            self.ready.clear()
            try:
                consumer.close()
            except (KafkaException, RuntimeError):
                logger.debug("%s: consumer close failed", self.name, exc_info=True)
            logger.info("%s stopped", self.name)

    def _await_topics(self, consumer: Consumer, names: list[str], timeout_s: float = 30.0) -> None:
        """Subscribe only once every topic is in the metadata: a topic that appears later would
        be picked up only at the next metadata refresh (minutes), and its retries would wait."""
        deadline = time.monotonic() + timeout_s
        while True:
            topics = consumer.list_topics(timeout=max(1.0, min(10.0, timeout_s))).topics
            missing = [
                n for n in names if n not in topics or topics[n].error is not None or not topics[n].partitions
            ]
            if not missing:
                return
            if time.monotonic() > deadline:
                raise SenderError(
                    f"{self.name}: no such topic(s) {missing}; `dedupctl senders topics` creates them"
                )
            time.sleep(0.2)

    def _on_assign(self, consumer: Consumer, partitions: list[TopicPartition]) -> None:
        self._assigned = list(partitions)
        self._unpause = list(partitions)
        self._holds = {
            tp: h for tp, h in self._holds.items() if any((p.topic, p.partition) == tp for p in partitions)
        }
        logger.info("%s assigned %d partitions", self.name, len(partitions))
        self.ready.set()

    def _on_revoke(self, consumer: Consumer, partitions: list[TopicPartition]) -> None:
        gone = {(p.topic, p.partition) for p in partitions}
        self._holds = {tp: h for tp, h in self._holds.items() if tp not in gone}
        self._assigned = [p for p in self._assigned if (p.topic, p.partition) not in gone]

    # -- holds ------------------------------------------------------------------------------------

    def _hold(self, consumer: Consumer, topic: str, partition: int, offset: int, until_ms: int) -> None:
        tp = TopicPartition(topic, partition, offset)
        consumer.pause([tp])
        consumer.seek(tp)
        self._holds[(topic, partition)] = (offset, until_ms)

    def _resume_due(self, consumer: Consumer) -> None:
        now = time.time() * 1000
        due = [tp for tp, (_, until) in self._holds.items() if until <= now]
        for topic, partition in due:
            offset, _ = self._holds.pop((topic, partition))
            consumer.resume([TopicPartition(topic, partition, offset)])

    def _poll_timeout(self) -> float:
        if not self._holds:
            return self.options.poll_timeout_s
        soonest = min(until for _, until in self._holds.values()) / 1000 - time.time()
        return max(0.0, min(self.options.poll_timeout_s, soonest))

    # -- one batch --------------------------------------------------------------------------------

    def _process(self, consumer: Consumer, producer: Producer, batch: list[Message]) -> None:
        outputs: list[Output] = []
        published: list[tuple[str, int]] = []
        positions: dict[TP, int] = {}
        oldest: dict[TP, int] = {}
        for msg in batch:
            err = msg.error()
            if err is not None:
                if err.fatal():
                    raise KafkaException(err)
                if err.code() != KafkaError._PARTITION_EOF:
                    logger.warning("%s consumer error: %s", self.name, err)
                continue
            topic, partition, offset = _position(msg)
            tp = (topic, partition)
            if tp in self._holds:
                continue  # fetched before the partition was held: it comes again on resume
            if topic not in self._delay:
                oldest.setdefault(tp, msg.timestamp()[1])
            handled = self.handler.handle(
                topic=topic,
                partition=partition,
                offset=offset,
                key=_bytes(msg.key()),
                value=_bytes(msg.value()),
                delay_step_ms=self.options.delay_topics.get(topic),
                written_ms=msg.timestamp()[1],
            )
            if handled.hold_until_ms is not None:
                self._hold(consumer, topic, partition, offset, handled.hold_until_ms)
                continue
            outputs += handled.outputs
            published += handled.published
            positions[tp] = offset + 1
        now_ms = time.time() * 1000
        age = max((now_ms - ts for ts in oldest.values() if ts > 0), default=0.0)
        self.metrics.set("sender_oldest_waiting_age_seconds", age / 1000, **self._labels)
        if positions and self._commit(consumer, producer, outputs, positions):
            # only now: after an abort the rows must still say "unpublished", so that the
            # redelivered records produce these outcomes again instead of being skipped
            try:
                self.handler.store.mark_published(published)
            except StoreUnavailableError as exc:
                # committed in Kafka all the same; a replay of these records would republish them
                logger.warning("%s: could not mark %d outcomes published: %s", self.name, len(published), exc)

    def _commit(
        self, consumer: Consumer, producer: Producer, outputs: list[Output], positions: dict[TP, int]
    ) -> bool:
        """Records and offsets in one transaction; on an abortable error, rewind and redo the batch
        (the status store then says which outcomes to publish again). True when committed."""
        try:
            producer.begin_transaction()
            for out in outputs:
                while True:
                    try:
                        producer.produce(out.topic, key=out.key, value=out.value)
                        break
                    except BufferError:
                        producer.poll(0.05)
            offsets = [TopicPartition(t, p, o) for (t, p), o in positions.items()]
            timeout = self.options.kafka_timeout_s
            producer.send_offsets_to_transaction(offsets, consumer.consumer_group_metadata(), timeout)
            self._commit_transaction(producer, timeout)
            return True
        except KafkaException as exc:
            error = exc.args[0]
            if not isinstance(error, KafkaError) or error.fatal() or not error.txn_requires_abort():
                _abort_quietly(producer)
                raise
            logger.warning(
                "%s transaction aborted (%s): rewinding to the committed offsets", self.name, error
            )
            producer.abort_transaction(self.options.kafka_timeout_s)
            self._rewind(consumer)
            return False

    @staticmethod
    def _commit_transaction(producer: Producer, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                producer.commit_transaction(max(0.1, deadline - time.monotonic()))
                return
            except KafkaException as exc:
                error = exc.args[0]
                if isinstance(error, KafkaError) and error.retriable() and time.monotonic() < deadline:
                    continue
                raise

    def _rewind(self, consumer: Consumer) -> None:
        self._holds.clear()
        committed = consumer.committed(consumer.assignment(), timeout=self.options.kafka_timeout_s)
        for tp in committed:
            consumer.resume([tp])
            consumer.seek(TopicPartition(tp.topic, tp.partition, tp.offset if tp.offset >= 0 else -2))

    # -- metrics ----------------------------------------------------------------------------------

    def _measure_lag(self, consumer: Consumer) -> None:
        now = time.monotonic()
        if now < self._next_lag or not self._assigned:
            return
        self._next_lag = now + self.options.lag_interval_s
        lag = {"source": 0, "delay": 0}
        try:
            for tp in consumer.position(self._assigned):
                if tp.offset < 0:
                    continue  # nothing fetched yet
                _, high = consumer.get_watermark_offsets(tp, cached=True)  # updated by every fetch
                lag["delay" if tp.topic in self._delay else "source"] += max(0, high - tp.offset)
        except KafkaException as exc:
            logger.debug("%s lag unknown: %s", self.name, exc)
            return
        for kind, value in lag.items():
            self.metrics.set("sender_consumer_lag", value, topics=kind, **self._labels)
        if lag["source"] == 0:
            self.metrics.set("sender_oldest_waiting_age_seconds", 0.0, **self._labels)
