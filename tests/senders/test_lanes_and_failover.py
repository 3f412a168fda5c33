"""The priority lane beside a backlog, and failover between a channel's two providers."""

from __future__ import annotations

import time

import pytest
from confluent_kafka import Producer

from operators import codec
from operators.records import Channel
from ops import kafka_io
from senders.providers import FakeProvider
from senders.runtime.pool import build_pool, open_status_store
from senders.statuses import CircuitState, DeliveryStatus, Lane
from tests.senders.conftest import (
    SettingsFactory,
    channel_message,
    produce_messages,
    read_records,
    register_users,
    wait_until,
)

pytestmark = pytest.mark.integration
SMS = Channel.SMS


def _warm_producer(bootstrap: str, topic: str) -> Producer:
    """A producer whose start-up is over, so that a second counts from the write: an idempotent
    producer's first write waits for its producer id (librdkafka asks again every 500 ms while
    the broker is slow to answer, which is what the test once measured on a busy machine); one
    acknowledged write to a topic of its own gets it, and ``list_topics`` the topic's leader."""
    scratch = f"{topic}.warm-up"
    kafka_io.create_topics({"bootstrap.servers": bootstrap}, [scratch], 1)
    prod = kafka_io.producer({"bootstrap.servers": bootstrap})
    kafka_io.produce_all(prod, scratch, [(None, b"warm-up")])
    prod.list_topics(topic, timeout=10)
    return prod


def test_the_priority_lane_delivers_a_code_within_a_second_while_10000_messages_wait(
    senders_settings: SettingsFactory, kafka_bootstrap: str
) -> None:
    backlog = 10_000
    # both lanes share the provider and its rate limit (500/s): the backlog takes 20 s to drain
    cfg = senders_settings(sms_rate_per_sec=500.0, rate_burst=10)
    fake = FakeProvider()
    register_users(cfg, ["u-otp"], [SMS])
    produce_messages(kafka_bootstrap, cfg.topics.sms, (channel_message(i, user=f"user-{i % 200}") for i in range(backlog)))
    with build_pool(
        cfg, channels=[SMS], lanes=[Lane.NORMAL, Lane.PRIORITY], providers={SMS: (fake, None)}
    ) as pool:
        pool.wait_ready(30)
        wait_until(lambda: len(fake.received()) >= 100, 30, "the backlog is being worked on")
        code = channel_message(
            "otp", user="u-otp", params={"code": "493817"}, priority="high", template="otp"
        )
        prod = _warm_producer(kafka_bootstrap, cfg.topics.sms_priority)
        start = time.time()
        kafka_io.produce_all(prod, cfg.topics.sms_priority, [(b"u-otp", codec.encode("channel_message", code))])
        wait_until(lambda: any(r.message_key == "kotp:sms" for r in fake.received()), 5, "the code is sent")
        sent_at = next(r.at for r in fake.received() if r.message_key == "kotp:sms")
        normal_done = sum(1 for r in fake.received() if r.at <= sent_at) - 1
    assert not pool.errors
    assert sent_at - start < 1.0, f"the code took {sent_at - start:.2f} s"
    assert normal_done < backlog - 1000, "the backlog was not waiting"


def test_failover_to_the_secondary_and_back(senders_settings: SettingsFactory, kafka_bootstrap: str) -> None:
    cfg = senders_settings(
        breaker_window=10, breaker_min_calls=4, breaker_failure_rate=0.5, breaker_open_ms=1000
    )
    primary, secondary = FakeProvider(name="primary"), FakeProvider(name="secondary")
    primary.set_down(True)
    store = open_status_store(cfg)

    def all_sent(keys: set[str]) -> bool:
        rows = {r.message_key: r.status for r in store.rows()}
        return all(rows.get(k) is DeliveryStatus.SENT for k in keys)

    first = {f"k{i}:sms" for i in range(20)}
    second = {f"k{i}:sms" for i in range(100, 120)}
    with build_pool(cfg, channels=[SMS], lanes=[Lane.NORMAL], providers={SMS: (primary, secondary)}) as pool:
        produce_messages(kafka_bootstrap, cfg.topics.sms, [channel_message(i) for i in range(20)])
        wait_until(
            lambda: all_sent(first),
            20,
            lambda: (
                "the first batch is sent despite the outage: "
                + repr(
                    [
                        (r.message_key, r.status.value, r.attempts, r.retry_at_ms)
                        for r in store.rows()
                        if r.status is not DeliveryStatus.SENT
                    ]
                )
            ),
        )
        assert pool.dispatchers[SMS].circuit is CircuitState.OPEN
        primary.set_down(False)  # the primary recovers
        time.sleep(1.2)  # past breaker_open_ms: the next call probes it
        produce_messages(kafka_bootstrap, cfg.topics.sms, [channel_message(i) for i in range(100, 120)])
        wait_until(lambda: all_sent(second), 20, "the second batch is sent")
    assert not pool.errors
    by_primary = [r for r in primary.received() if r.message_key in first]
    assert 4 <= len(by_primary) <= 8 and all(r.behaviour == "transient" for r in by_primary)
    assert {r.message_key for r in secondary.received()} == first  # every one, after the circuit opened
    assert {r.message_key for r in primary.received() if r.message_key in second} == second
    assert not any(r.message_key in second for r in secondary.received())
    assert pool.dispatchers[SMS].circuit is CircuitState.CLOSED
    assert pool.metrics.value("sender_circuit_changes_total", to="open") >= 1
    assert pool.metrics.value("sender_circuit_changes_total", to="closed") == 1
    assert pool.metrics.value("sender_circuit_state", channel="sms") == 0
    providers = {
        s["message_key"]: s["provider"]
        for s in read_records(kafka_bootstrap, cfg.senders.status_topic, "delivery_status")
        if s["status"] == "sent"
    }
    assert {providers[k] for k in first} == {"secondary"} and {providers[k] for k in second} == {"primary"}
