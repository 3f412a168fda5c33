"""The send-time rules through the real workers, broker and status store: a deferral that meets an
opt-out, and the limits counted once across a retry and a replay of the channel topic."""

from __future__ import annotations

import time
import uuid
from datetime import UTC, datetime

import pytest

from operators.records import Channel
from senders.providers import FakeProvider
from senders.runtime.pool import build_pool, open_profile_store, open_status_store
from senders.statuses import DeliveryStatus, Lane
from settings import Settings
from tests.senders.conftest import (
    CIPHER,
    SettingsFactory,
    address_of,
    channel_message,
    produce_messages,
    profile_of,
    read_records,
    wait_until,
)

pytestmark = pytest.mark.integration
SMS, NORMAL = Channel.SMS, Lane.NORMAL
MINUTE_MS = 60_000


def _campaign(n: int, user: str) -> dict[str, object]:
    return {
        **channel_message(n, user=user, template="eid_sale", params={"pct": "20"}),
        "category": "marketing",
    }


def _settled(cfg: Settings, keys: set[str], statuses: set[DeliveryStatus]) -> bool:
    store = open_status_store(cfg)
    try:
        rows = {r.message_key: r.status for r in store.rows()}
    finally:
        store.close()
    return all(rows.get(k) in statuses for k in keys)


def test_a_deferred_message_whose_user_opted_out_while_it_waited_is_skipped(
    senders_settings: SettingsFactory, kafka_bootstrap: str
) -> None:
    now = int(time.time() * 1000)
    end = now - now % MINUTE_MS + MINUTE_MS
    if end - now < 5_000:
        end += MINUTE_MS  # quiet hours that end at a minute, in UTC, at least 5 s from now
    hhmm = lambda ms: datetime.fromtimestamp(ms / 1000, UTC).strftime("%H:%M")  # noqa: E731
    cfg = senders_settings(profile_cache_ttl_ms=100)
    profiles = open_profile_store(cfg)
    profiles.put("u-q", profile_of("u-q", (SMS,), tz="UTC", quiet_hours={"from": hhmm(end - 30 * MINUTE_MS), "to": hhmm(end)}))
    fake = FakeProvider()
    store = open_status_store(cfg)
    with build_pool(cfg, channels=[SMS], lanes=[NORMAL], providers={SMS: (fake, None)}) as pool:
        produce_messages(kafka_bootstrap, cfg.topics.sms, [_campaign(1, "u-q")])
        wait_until(lambda: (r := store.get("k1:sms")) is not None and r.status is DeliveryStatus.DEFERRED, 20, "deferred")
        row = store.get("k1:sms")
        assert row is not None and (row.reason, row.not_before_ms) == ("quiet_hours", end)
        profiles.apply_preferences("u-q", {"marketing": {"sms": False}})  # while the campaign waits
        wait_until(
            lambda: (r := store.get("k1:sms")) is not None and r.status is DeliveryStatus.SKIPPED,
            (end - time.time() * 1000) / 1000 + 20,
            "decided again when due",
        )
    assert not pool.errors
    row = store.get("k1:sms")
    assert row is not None and (row.status, row.reason, row.attempts) == (DeliveryStatus.SKIPPED, "opted_out", 1)
    assert fake.received() == []
    trail = [
        (s["status"], s["reason"], s["not_before"])
        for s in read_records(kafka_bootstrap, cfg.senders.status_topic, "delivery_status")
    ]
    assert trail == [("deferred", "quiet_hours", end), ("skipped", "opted_out", None)]
    assert read_records(kafka_bootstrap, cfg.senders.dlq_topic, "dead_letter") == []


def test_the_one_time_code_limit_counts_once_across_a_retry_and_a_replay(
    senders_settings: SettingsFactory, kafka_bootstrap: str
) -> None:
    into_hour = time.time() % 3600
    if into_hour > 3540:
        time.sleep(3601 - into_hour)  # the codes' hour must not change under the test
    cfg = senders_settings(one_time_codes_per_hour=2)
    phone = address_of("user-1", SMS)
    fake = FakeProvider(script={phone: ["transient", "ok"]})  # the first code needs a retry
    codes = [channel_message(n, user="user-1", template="otp", params={"code": f"{n:06d}"}) for n in (1, 2, 3)]
    store = open_status_store(cfg)
    with build_pool(cfg, channels=[SMS], lanes=[NORMAL], providers={SMS: (fake, None)}) as pool:
        produce_messages(kafka_bootstrap, cfg.topics.sms, codes[:1])
        wait_until(lambda: (r := store.get("k1:sms")) is not None and r.status is DeliveryStatus.SENT, 20, "sent")
        produce_messages(kafka_bootstrap, cfg.topics.sms, codes[1:])
        wait_until(lambda: _settled(cfg, {"k2:sms", "k3:sms"}, {DeliveryStatus.SENT, DeliveryStatus.REJECTED}), 20, "settled")
    assert not pool.errors
    got = {k: (r.status, r.reason, r.attempts) for k in ("k1:sms", "k2:sms", "k3:sms") if (r := store.get(k))}
    assert got == {
        "k1:sms": (DeliveryStatus.SENT, None, 2),  # retried: its unit was recorded once
        "k2:sms": (DeliveryStatus.SENT, None, 1),
        "k3:sms": (DeliveryStatus.REJECTED, "recipient_limit", 1),
    }
    [counter] = [f"otp:{CIPHER.lookup_hash(SMS, phone)}:{(time.time_ns() // 10**6) // 3_600_000 * 3_600_000}"]
    assert store.limit_units(counter) == ["k1:sms", "k2:sms"]
    calls = len(fake.received())
    assert calls == 3

    # the channel topic replayed from the start (a new consumer group): nothing is counted or sent again
    replay = cfg.with_overrides(senders={"group_prefix": f"replay-{uuid.uuid4().hex[:6]}"})
    with build_pool(replay, channels=[SMS], lanes=[NORMAL], providers={SMS: (fake, None)}) as again:
        again.wait_ready()
        time.sleep(3)
    assert not again.errors
    assert store.limit_units(counter) == ["k1:sms", "k2:sms"]
    assert {k: (r.status, r.reason) for k in got if (r := store.get(k))} == {k: v[:2] for k, v in got.items()}
    assert len(fake.received()) == calls
