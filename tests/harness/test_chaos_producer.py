"""The chaos run's producer: a record the broker refuses ends its thread with the reason, and the
run's wait for it ends then (it used to die silently and leave the run waiting out its timeout)."""

from __future__ import annotations

import dataclasses
import threading

import pytest

from harness.chaos import Produced, producer_thread
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
