"""The chaos run's producer: a record the broker refuses ends its thread with the reason, and the
run's wait for it ends then (it used to die silently and leave the run waiting out its timeout);
after its client's fatal error a new client goes on from what the topic holds, exactly."""

from __future__ import annotations

import dataclasses
import threading
from typing import Any

import pytest
from confluent_kafka import KafkaError, KafkaException, Producer

from harness.chaos import Produced, producer_thread, records_on_topic
from harness.streamgen import StreamSpec, generate
from ops import kafka_io

pytestmark = pytest.mark.integration


def test_a_refused_record_ends_the_producer_with_its_reason(topic_factory, settings_factory):
    topics = topic_factory(partitions=4)
    cfg = settings_factory(topics)
    stream = generate(StreamSpec(requests=40, partitions=4, seed=3, late_share=0.0))
    bad = 25
    stream.records[bad] = dataclasses.replace(stream.records[bad], partition=9)  # the topic has 4
    done = threading.Event()
    produced = Produced()

    producer_thread(cfg, stream, rate=1000, done=done, produced=produced)

    assert done.wait(60), "the producer's thread neither finished nor said why"
    # refused at produce() when the client knows the topic's partitions by then, else in its
    # delivery report: either way the reason, and every record it handed over before stopping
    assert produced.failure is not None and "_UNKNOWN_PARTITION" in produced.failure, produced.failure
    assert produced.records in (bad, len(stream.records))
    read = list(kafka_io.read_committed(cfg.kafka.client_config(), [topics.requests], idle_timeout_s=3))
    handed = [r.value for i, r in enumerate(stream.records[: produced.records]) if i != bad]
    assert sorted(m.value for m in read) == sorted(handed)


class _FailsOnce:
    """A real producer whose client "fails fatally" once, on its ``at``-th record, after that
    record went out (the worst case: written, and reported lost)."""

    failed = False

    def __init__(self, real: Producer, at: int) -> None:
        self._real, self._at, self._n = real, at, 0

    def produce(self, *args: Any, **kwargs: Any) -> None:
        self._real.produce(*args, **kwargs)
        self._n += 1
        if self._n == self._at and not _FailsOnce.failed:
            _FailsOnce.failed = True
            self._real.flush(10)
            raise KafkaException(KafkaError(KafkaError._FATAL, "sequence desynchronization (test)", fatal=True))

    def __getattr__(self, name: str) -> Any:
        return getattr(self._real, name)


def test_after_a_fatal_client_error_a_new_producer_goes_on_from_what_the_topic_holds(
        topic_factory, settings_factory, monkeypatch):
    topics = topic_factory(partitions=4)
    cfg = settings_factory(topics)
    stream = generate(StreamSpec(requests=60, partitions=4, seed=5, late_share=0.0))
    real = kafka_io.producer
    _FailsOnce.failed = False
    monkeypatch.setattr(kafka_io, "producer", lambda *a, **kw: _FailsOnce(real(*a, **kw), at=23))
    done, produced = threading.Event(), Produced()

    producer_thread(cfg, stream, rate=1000, done=done, produced=produced)

    assert done.wait(60)
    assert _FailsOnce.failed and produced.failure is None and produced.records == 60
    read = list(kafka_io.read_committed(cfg.kafka.client_config(), [topics.requests], idle_timeout_s=3))
    for p in range(4):  # every record once, each partition in the stream's order
        assert [m.value for m in read if m.partition == p] == [r.value for r in stream.records if r.partition == p]
    assert records_on_topic(cfg, stream) == set(range(60))


def test_a_topic_holding_other_records_than_the_stream_s_cannot_be_gone_on_from(topic_factory, settings_factory):
    topics = topic_factory(partitions=4)
    cfg = settings_factory(topics)
    stream = generate(StreamSpec(requests=10, partitions=4, seed=5, late_share=0.0))
    prod = kafka_io.producer(cfg.kafka.client_config())
    first = stream.records[0]
    prod.produce(topics.requests, key=first.key, value=b"not the stream's", partition=first.partition)
    prod.flush(10)
    with pytest.raises(RuntimeError, match="holds other records than the stream's first ones"):
        records_on_topic(cfg, stream)
