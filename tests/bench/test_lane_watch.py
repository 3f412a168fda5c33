"""bench.lane_watch against a real broker: a message is seen once its transaction commits, not
before, and never from an aborted one."""

from __future__ import annotations

import time
import uuid

from confluent_kafka import Producer

from bench.lane_watch import LaneWatch
from operators import codec
from ops import kafka_io
from settings import KafkaSettings


def message(key: str) -> bytes:
    return codec.encode("channel_message", {
        "message_key": key, "channel": "sms", "notification_id": key, "user_id": "u-1", "template_id": "otp",
        "params": {}, "channels": ["sms"], "priority": "high", "category": "transactional", "event_time": 1,
        "dedup_key": key, "dedup_ttl_sec": 60, "traceparent": None,
    })


def test_a_message_is_seen_when_its_transaction_commits_and_an_aborted_one_never(kafka_bootstrap: str) -> None:
    topic = f"lane-watch-{uuid.uuid4().hex[:8]}"
    kafka_io.ensure_topics(KafkaSettings(bootstrap_servers=kafka_bootstrap), [topic], 2)
    watch = LaneWatch({"bootstrap.servers": kafka_bootstrap}, [topic])
    watch.start()
    producer = Producer({"bootstrap.servers": kafka_bootstrap, "transactional.id": f"lw-{uuid.uuid4().hex[:8]}"})
    producer.init_transactions(30)
    try:
        producer.begin_transaction()
        producer.produce(topic, message("aborted"))
        producer.abort_transaction(30)
        producer.begin_transaction()
        producer.produce(topic, message("k1"), partition=0)
        producer.produce(topic, b"not avro", partition=1)
        producer.flush(30)
        time.sleep(1.0)  # written, not committed: a read_committed reader does not see it yet
        assert "k1" not in watch.seen
        committed = time.time()
        producer.commit_transaction(30)
        deadline = time.monotonic() + 30
        while (len(watch.seen) < 1 or watch.undecodable < 1) and time.monotonic() < deadline:
            time.sleep(0.05)
    finally:
        seen = watch.stop()
    assert list(seen) == ["k1"]
    assert committed <= seen["k1"] < committed + 5
    assert watch.undecodable == 1
