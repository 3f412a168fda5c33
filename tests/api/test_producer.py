"""The API producer's view of whether Kafka answers (api.producer.RequestProducer.probe), with
librdkafka's clients replaced by ones whose metadata requests answer or not as the test says."""

from __future__ import annotations

import time
from typing import Any

import pytest
from confluent_kafka import KafkaError, KafkaException

from api import producer as producer_module
from api.producer import PROBES_TO_DOWN, RequestProducer


class FakeProducer:
    """As much of confluent_kafka.Producer as RequestProducer uses: its metadata requests time
    out while ``answers`` is False; nothing is ever produced."""

    def __init__(self, config: dict[str, Any]) -> None:
        self.answers = True

    def list_topics(self, topic: str, timeout: float) -> Any:
        if not self.answers:
            raise KafkaException(KafkaError(KafkaError._TIMED_OUT))

        class Topic:
            error = None

        class Metadata:
            topics = {topic: Topic()}

        return Metadata()

    def poll(self, timeout: float) -> int:
        time.sleep(min(timeout, 0.01))
        return 0

    def flush(self, timeout: float) -> int:
        return 0


@pytest.fixture
def producer(monkeypatch: pytest.MonkeyPatch) -> Any:
    monkeypatch.setattr(producer_module, "Producer", FakeProducer)
    monkeypatch.setattr(producer_module, "AdminClient", FakeProducer)
    made = RequestProducer({}, ack_timeout_ms=1000, linger_ms=1, topic="requests", probe_interval_s=3600)
    yield made
    made.close(1.0)


def test_probes_unanswered_mark_kafka_down_only_in_a_row_and_with_no_acknowledgement(producer: Any) -> None:
    fake: FakeProducer = producer._prober_client
    assert producer.probe() and producer.unavailable() is None
    fake.answers = False
    for _ in range(PROBES_TO_DOWN - 1):  # a busy machine, a broker of three killed: not yet an outage
        assert producer.probe() and producer.unavailable() is None
    assert not producer.probe() and producer.unavailable() == "Kafka is unreachable"
    fake.answers = True
    assert producer.probe() and producer.unavailable() is None  # answered: up again at once
    # unanswered in a row, but a record was acknowledged meanwhile: the brokers answer
    fake.answers = False
    producer.probe()
    producer._acked_at = time.monotonic()
    for _ in range(PROBES_TO_DOWN):
        assert producer.probe() and producer.unavailable() is None
    # and the streak starts again with no acknowledgement since its first probe
    fake.answers = True
    producer.probe()
    fake.answers = False
    for _ in range(PROBES_TO_DOWN - 1):
        producer.probe()
    assert not producer.probe()


def test_a_missing_topic_is_down_at_once(producer: Any) -> None:
    fake: FakeProducer = producer._prober_client
    fake.list_topics = lambda topic, timeout: type("Metadata", (), {"topics": {}})()  # type: ignore[method-assign]
    assert not producer.probe() and producer.unavailable() == "the topic requests is missing"
