"""Sender workers against the real broker: retries through the delay topics, dead letters,
permanent failures, several workers on one channel, replays, rate limits under retries."""

from __future__ import annotations

import time
from collections import Counter

import pytest

from operators import codec
from operators.records import Channel
from ops import kafka_io
from senders.profiles.model import parse_profile
from senders.providers import FakeProvider
from senders.runtime.pool import build_pool, open_profile_store, open_status_store
from senders.statuses import FINAL_STATUSES, DeliveryStatus, Lane
from tests.senders.conftest import (
    SettingsFactory,
    address_of,
    channel_message,
    produce_messages,
    read_records,
    wait_until,
)

pytestmark = pytest.mark.integration
SMS, EMAIL, NORMAL = Channel.SMS, Channel.EMAIL, Lane.NORMAL


def _statuses(cfg_store: object) -> dict[str, DeliveryStatus]:
    return {r.message_key: r.status for r in cfg_store.rows()}  # type: ignore[attr-defined]


def test_backoff_1_2_4_seconds_then_dead_letter(
    senders_settings: SettingsFactory, kafka_bootstrap: str
) -> None:
    cfg = senders_settings()
    fake = FakeProvider(script={address_of("user-1", SMS): ["transient"]})
    produce_messages(kafka_bootstrap, cfg.topics.sms, [channel_message(1)])
    pool = build_pool(cfg, channels=[SMS], lanes=[NORMAL], providers={SMS: (fake, None)})
    store = open_status_store(cfg)
    with pool:
        wait_until(
            lambda: (r := store.get("k1:sms")) is not None and r.status is DeliveryStatus.FAILED,
            20,
            "the message is dead-lettered",
        )
    assert not pool.errors
    calls = [r.at for r in fake.received()]
    assert len(calls) == 4
    gaps = [b - a for a, b in zip(calls, calls[1:], strict=False)]
    for gap, nominal in zip(gaps, (1.0, 2.0, 4.0), strict=True):
        # never early; late by at most the jitter (10 %) and a little scheduling
        assert nominal - 0.02 <= gap <= nominal * 1.1 + 0.6, gaps
    [letter] = read_records(kafka_bootstrap, cfg.senders.dlq_topic, "dead_letter")
    assert (letter["message_key"], letter["reason_kind"], letter["attempts"]) == ("k1:sms", "max_attempts", 4)
    assert "503" in letter["reason"]
    trail = [
        (s["status"], s["attempt"])
        for s in read_records(kafka_bootstrap, cfg.senders.status_topic, "delivery_status")
    ]
    assert trail == [
        ("sending", 1),
        ("queued", 1),
        ("sending", 2),
        ("queued", 2),
        ("sending", 3),
        ("queued", 3),
        ("sending", 4),
        ("failed", 4),
    ]
    delay_topics = [f"{cfg.topics.sms}.retry.{step}" for step in ("1s", "2s", "4s")]
    delayed = sorted(
        (codec.decode("delayed_delivery", m.value)["attempt"], m.topic)
        for m in kafka_io.read_committed(cfg.kafka.client_config(), delay_topics, idle_timeout_s=1)
        if m.value is not None
    )
    assert delayed == list(zip((2, 3, 4), delay_topics, strict=True))  # one delay topic per step
    assert pool.metrics.value("sender_retries_total") == 3
    assert pool.metrics.value("sender_dead_letters_total", reason="max_attempts") == 1


def test_a_permanent_failure_is_never_retried_and_the_address_is_dropped(
    senders_settings: SettingsFactory, kafka_bootstrap: str
) -> None:
    cfg = senders_settings()
    fake = FakeProvider(script={"bad@example.invalid": ["permanent", "ok"]})
    profiles = open_profile_store(cfg)
    profiles.put("u-bad", parse_profile({"contacts": {"email": ["bad@example.invalid"]}}))
    profiles.put("u-ok", parse_profile({"contacts": {"email": ["ok@example.com"]}}))
    first = channel_message(1, channel=EMAIL, user="u-bad")
    pool = build_pool(cfg, channels=[EMAIL], lanes=[NORMAL], providers={EMAIL: (fake, None)})
    store = open_status_store(cfg)
    with pool:
        produce_messages(kafka_bootstrap, cfg.topics.email, [first])
        wait_until(
            lambda: (r := store.get("k1:email")) is not None and r.status is DeliveryStatus.FAILED,
            20,
            "the first message fails",
        )
        # a later message to the same address is not tried at all (skipped: no address left); another is
        produce_messages(
            kafka_bootstrap,
            cfg.topics.email,
            [channel_message(2, channel=EMAIL, user="u-bad"), channel_message(3, channel=EMAIL, user="u-ok")],
        )
        wait_until(
            lambda: (
                len(_statuses(store)) == 3
                and all(s in FINAL_STATUSES for s in _statuses(store).values())
            ),
            20,
            "all settled",
        )
        time.sleep(2.5)  # longer than the first two retries would wait
    assert not pool.errors
    assert [(r.message_key, r.to) for r in fake.received()] == [
        ("k1:email", "bad@example.invalid"),
        ("k3:email", "ok@example.com"),
    ]
    letters = {
        d["message_key"]: d for d in read_records(kafka_bootstrap, cfg.senders.dlq_topic, "dead_letter")
    }
    assert (letters["k1:email"]["reason_kind"], letters["k1:email"]["attempts"]) == ("permanent_failure", 1)
    assert set(letters) == {"k1:email"}  # a rule's outcome is a status, never a dead letter
    later = store.get("k2:email")
    assert later is not None and (later.status, later.reason, later.attempts) == (DeliveryStatus.SKIPPED, "no_address", 1)
    assert pool.metrics.value("sender_retries_total") == 0


def test_four_workers_on_one_channel_send_each_message_exactly_once(
    senders_settings: SettingsFactory, kafka_bootstrap: str, store_location: str
) -> None:
    cfg = senders_settings(partitions=4, users=400, status_store=store_location)
    fake = FakeProvider(latency_s=0.002)
    n = 400
    pool = build_pool(cfg, channels=[SMS], lanes=[NORMAL], workers_per_lane=4, providers={SMS: (fake, None)})
    store = open_status_store(cfg)
    with pool:
        pool.wait_ready(30)
        wait_until(
            lambda: sum(len(w._assigned) for w in pool.workers) == 16,
            30,  # 4 topics x 4 partitions
            "the group has settled",
        )
        produce_messages(kafka_bootstrap, cfg.topics.sms, [channel_message(i) for i in range(n)])
        wait_until(lambda: len(fake.received()) >= n, 30, f"{n} sends")
        time.sleep(1.0)  # time for a second send, if any were to happen
    assert not pool.errors
    sends = Counter(r.message_key for r in fake.received())
    assert set(sends) == {f"k{i}:sms" for i in range(n)}
    assert set(sends.values()) == {1}
    owners = Counter(r.owner.rsplit(".", 1)[-1].split("/")[0] for r in store.rows())
    assert len(owners) == 4, owners  # every worker took a share
    assert all(r.status is DeliveryStatus.SENT for r in store.rows())


def test_replaying_a_channel_topic_from_the_start_sends_nothing_twice(
    senders_settings: SettingsFactory, kafka_bootstrap: str
) -> None:
    cfg = senders_settings()
    fake = FakeProvider()
    n = 50
    produce_messages(kafka_bootstrap, cfg.topics.sms, [channel_message(i) for i in range(n)])
    with build_pool(cfg, channels=[SMS], lanes=[NORMAL], providers={SMS: (fake, None)}) as first:
        wait_until(lambda: len(fake.received()) >= n, 30, "first pass")
    # a new consumer group reads the topic from its first offset again
    replay_cfg = cfg.with_overrides(senders={"group_prefix": cfg.senders.group_prefix + "-replay"})
    with build_pool(replay_cfg, channels=[SMS], lanes=[NORMAL], providers={SMS: (fake, None)}) as replay:
        wait_until(lambda: replay.metrics.value("sender_skipped_total") >= n, 30, "the replay is read")
    assert not first.errors and not replay.errors
    assert len(fake.received()) == n
    statuses = Counter(
        s["status"] for s in read_records(kafka_bootstrap, cfg.senders.status_topic, "delivery_status")
    )
    assert statuses == {"sending": n, "sent": n}  # the replay published nothing either


def test_the_rate_limit_holds_under_retries(senders_settings: SettingsFactory, kafka_bootstrap: str) -> None:
    rate, burst, n = 10.0, 2, 15
    cfg = senders_settings(sms_rate_per_sec=rate, rate_burst=burst)
    fake = FakeProvider(script={address_of(f"user-{i}", SMS): ["transient", "ok"] for i in range(n)})
    produce_messages(kafka_bootstrap, cfg.topics.sms, [channel_message(i) for i in range(n)])
    with build_pool(cfg, channels=[SMS], lanes=[NORMAL], providers={SMS: (fake, None)}) as pool:
        wait_until(lambda: len(fake.received()) >= 2 * n, 20, "every message sent on its second attempt")
    assert not pool.errors
    calls = sorted(r.at for r in fake.received())
    assert len(calls) == 2 * n
    for i in range(len(calls)):
        for j in range(i, len(calls)):
            assert j - i + 1 <= burst + rate * (calls[j] - calls[i]) + 0.05, (i, j, calls[j] - calls[i])
