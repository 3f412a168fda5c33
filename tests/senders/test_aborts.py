"""A batch whose Kafka transaction aborts is redone: its retries and dead letters are produced."""

from __future__ import annotations

from collections import Counter
from typing import Any

import pytest
from confluent_kafka import KafkaError, KafkaException, Producer

from operators import codec
from operators.records import Channel
from ops import kafka_io
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


class AbortsOnce:
    """A real transactional producer whose commit fails once, with an abortable error (as a
    missing delay topic or a rebalance gives), for the first transaction that writes to each of
    ``topics``. The worker then aborts the transaction for real."""

    def __init__(self, conf: dict[str, str], topics: set[str]) -> None:
        self._producer = Producer(conf)
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

    def __getattr__(self, name: str) -> Any:
        return getattr(self._producer, name)


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
