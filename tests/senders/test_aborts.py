"""A batch whose Kafka transaction aborts is redone: its retries and dead letters are produced."""

from __future__ import annotations

import threading
from collections import Counter
from typing import Any

import pytest
from confluent_kafka import KafkaError, KafkaException, Producer

from operators import codec
from operators.records import Channel
from ops import kafka_io
from senders.errors import TransactionStuckError
from senders.providers import FakeProvider
from senders.runtime.pool import build_pool, open_status_store
from senders.statuses import DeliveryStatus, Lane
from tests.senders.conftest import (
    SettingsFactory,
    address_of,
    channel_message,
    produce_messages,
    read_records,
    wait_until,
)

pytestmark = pytest.mark.integration
SMS = Channel.SMS


class WrappedProducer:
    """A real producer; a subclass overrides the calls it injects a failure into."""

    def __init__(self, conf: dict[str, str]) -> None:
        self._producer = Producer(conf)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._producer, name)


class AbortsOnce(WrappedProducer):
    """A real transactional producer whose commit fails once, with an abortable error (as a
    missing delay topic or a rebalance gives), for the first transaction that writes to each of
    ``topics``. The worker then aborts the transaction for real."""

    def __init__(self, conf: dict[str, str], topics: set[str]) -> None:
        super().__init__(conf)
        self._armed = set(topics)
        self._written: set[str] = set()
        self.failed: list[set[str]] = []

    def begin_transaction(self) -> None:
        self._written.clear()
        self._producer.begin_transaction()

    def produce(self, topic: str, **kwargs: Any) -> None:
        self._written.add(topic)
        self._producer.produce(topic, **kwargs)

    def commit_transaction(self, *args: Any) -> None:
        hit = self._written & self._armed
        if hit:
            self._armed -= hit
            self.failed.append(hit)
            self._producer.flush(10)
            raise KafkaException(
                KafkaError(KafkaError.UNKNOWN_TOPIC_OR_PART, "injected", txn_requires_abort=True)
            )
        self._producer.commit_transaction(*args)


def test_an_aborted_transaction_still_produces_the_retry_and_the_dead_letter(
    senders_settings: SettingsFactory, kafka_bootstrap: str
) -> None:
    cfg = senders_settings(partitions=1)
    retry_topic = f"{cfg.topics.sms}.retry.1s"
    fake = FakeProvider(script={address_of("user-1", SMS): ["transient", "ok"], address_of("user-2", SMS): ["permanent"]})
    pool = build_pool(cfg, channels=[SMS], lanes=[Lane.NORMAL], providers={SMS: (fake, None)})
    [worker] = pool.workers
    producers: list[AbortsOnce] = []

    def factory(conf: dict[str, str]) -> AbortsOnce:
        producers.append(AbortsOnce(conf, {retry_topic, cfg.senders.dlq_topic}))
        return producers[-1]

    worker.producer_factory = factory  # type: ignore[assignment]
    store = open_status_store(cfg)
    with pool:
        produce_messages(kafka_bootstrap, cfg.topics.sms, [channel_message(1), channel_message(2)])
        wait_until(
            lambda: (r := store.get("k1:sms")) is not None and r.status is DeliveryStatus.SENT,
            20,
            lambda: f"the retry after the abort is delivered: {store.rows()}",
        )
    assert sum(len(p.failed) for p in producers) >= 1  # the failure was injected
    assert not pool.errors
    assert {r.message_key: r.status for r in store.rows()} == {
        "k1:sms": DeliveryStatus.SENT,
        "k2:sms": DeliveryStatus.FAILED,
    }
    # no provider call was repeated for the aborted batch: its outcomes were republished
    assert Counter(r.message_key for r in fake.received()) == {"k1:sms": 2, "k2:sms": 1}
    retries = [
        codec.decode("delayed_delivery", m.value)
        for m in kafka_io.read_committed(cfg.kafka.client_config(), [retry_topic], idle_timeout_s=1)
        if m.value is not None
    ]
    assert [(r["message_key"], r["attempt"]) for r in retries] == [("k1:sms", 2)]
    letters = read_records(kafka_bootstrap, cfg.senders.dlq_topic, "dead_letter")
    assert [(d["message_key"], d["reason_kind"]) for d in letters] == [("k2:sms", "permanent_failure")]
    trail: dict[str, list[tuple[str, int]]] = {}
    for s in read_records(kafka_bootstrap, cfg.senders.status_topic, "delivery_status"):
        trail.setdefault(s["message_key"], []).append((s["status"], s["attempt"]))
    # the aborted "sending" records are gone; the outcomes were produced again, once
    assert trail == {
        "k1:sms": [("queued", 1), ("sending", 2), ("sent", 2)],
        "k2:sms": [("failed", 1)],
    }


class OffsetsHangOnce(WrappedProducer):
    """A real transactional producer whose first ``send_offsets_to_transaction`` never returns
    (as librdkafka's does when the group coordinator's broker dies: issues 5456 and 5511) until
    the test lets it go; it then fails as the fenced producer it is by then."""

    def __init__(self, conf: dict[str, str], hung: list[threading.Event]) -> None:
        super().__init__(conf)
        self._hung = hung

    def send_offsets_to_transaction(self, *args: Any) -> None:
        if not self._hung:
            self._hung.append(threading.Event())
            self._hung[0].wait()
            raise KafkaException(KafkaError(KafkaError._FENCED, "let go by the test", fatal=True))
        self._producer.send_offsets_to_transaction(*args)


def test_a_transaction_stuck_past_its_bound_is_left_behind_and_the_worker_starts_over(
    senders_settings: SettingsFactory, kafka_bootstrap: str
) -> None:
    """The worker waits 2.5 x ``kafka_timeout_ms`` for a transaction, then raises, leaves the
    stuck call on its daemon thread and starts over with new clients: the new producer fences
    the old one (its open transaction is aborted), the message is sent once and its outcome
    published once."""
    cfg = senders_settings(partitions=1, kafka_timeout_ms=2000)
    fake = FakeProvider()
    pool = build_pool(cfg, channels=[SMS], lanes=[Lane.NORMAL], providers={SMS: (fake, None)})
    [worker] = pool.workers
    hung: list[threading.Event] = []
    worker.producer_factory = lambda conf: OffsetsHangOnce(conf, hung)  # type: ignore[assignment,return-value]
    store = open_status_store(cfg)
    try:
        with pool:
            produce_messages(kafka_bootstrap, cfg.topics.sms, [channel_message(1)])
            wait_until(lambda: any(isinstance(e, TransactionStuckError) for e in pool.errors), 30,
                       lambda: f"the stuck transaction given up: {pool.errors}")
            stuck = [t for t in threading.enumerate() if t.name.endswith("-txn") and t.daemon and t.is_alive()]
            assert stuck  # the call still hangs on the thread left behind
            wait_until(lambda: bool(read_records(kafka_bootstrap, cfg.senders.status_topic, "delivery_status")),
                       30, lambda: f"the outcome published after the restart: {store.rows()}")
    finally:
        for event in hung:
            event.set()
    assert [str(e) for e in pool.errors if not isinstance(e, TransactionStuckError)] == []
    assert "5456" in str(next(e for e in pool.errors if isinstance(e, TransactionStuckError)))
    assert {r.message_key: r.status for r in store.rows()} == {"k1:sms": DeliveryStatus.SENT}
    assert Counter(r.message_key for r in fake.received()) == {"k1:sms": 1}
    trail = [(s["status"], s["attempt"]) for s in read_records(kafka_bootstrap, cfg.senders.status_topic,
                                                               "delivery_status")]
    assert trail == [("sent", 1)]  # once: the stuck transaction's copy was aborted by the fence
