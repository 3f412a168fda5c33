"""A provider's Retry-After is bounded, and no far-due retry holds its partition's due ones."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator

import pytest

from operators import codec
from operators.records import Channel
from ops import kafka_io
from senders.errors import ProviderRetryableError
from senders.policy.breaker import BreakerOptions
from senders.policy.bucket import RateLimit
from senders.policy.retry import RetryPolicy
from senders.providers import FakeProvider, HttpProvider
from senders.records import from_channel_record
from senders.runtime.dispatch import Dispatcher
from senders.runtime.metrics import Metrics
from senders.runtime.pool import build_pool, open_status_store
from senders.statuses import AttemptOutcome, DeliveryStatus, Lane
from tests.senders.conftest import (
    SettingsFactory,
    address_of,
    channel_message,
    produce_messages,
    read_records,
    sample_message,
    send_now,
    wait_until,
)
from tests.senders.fake_http import FakeHttpProvider

SMS, EMAIL, NORMAL = Channel.SMS, Channel.EMAIL, Lane.NORMAL


@pytest.fixture
def http() -> Iterator[FakeHttpProvider]:
    server = FakeHttpProvider().start()
    yield server
    server.stop()


# -- pure bounds -----------------------------------------------------------------------------------


def test_a_retry_after_beyond_the_longest_backoff_is_cut_to_it() -> None:
    policy = RetryPolicy(base_ms=1000, max_attempts=4, jitter_ratio=0.0, max_backoff_ms=4000)
    assert policy.next_attempt_at(1, 0, 0.0, retry_after_ms=10**12) == 4000  # 1e9 s: not 2057
    assert policy.next_attempt_at(1, 0, 0.0, retry_after_ms=3000) == 3000  # honoured below the bound
    assert policy.next_attempt_at(1, 0, 0.0, retry_after_ms=10) == 1000  # the backoff when longer


class _Raises(FakeProvider):
    def __init__(self, retry_after_s: float) -> None:
        super().__init__(name="odd")
        self.retry_after_s = retry_after_s

    async def _try_send(self, **kwargs: object) -> str | None:
        raise ProviderRetryableError(self.name, "HTTP 503", status_code=503, retry_after_s=self.retry_after_s)


@pytest.mark.parametrize("hint", [float("inf"), float("nan"), -5.0])
def test_a_nonsense_hint_from_any_provider_is_treated_as_absent(hint: float) -> None:
    dispatcher = Dispatcher(
        channel=SMS,
        primary=_Raises(hint),
        secondary=None,
        limit=RateLimit(1000, 10),
        breaker=BreakerOptions(),
        metrics=Metrics(),
    )
    raw = codec.encode("channel_message", channel_message(1))
    delivery = from_channel_record(raw, key=None, lane=NORMAL, source_topic="sms")
    result = asyncio.run(dispatcher.send(delivery, "+1", sample_message(SMS)))
    assert (result.outcome, result.retry_after_ms) == (AttemptOutcome.TRANSIENT, None)


@pytest.mark.parametrize(
    ("header", "expected"),
    [("7", 7.0), ("inf", None), ("nan", None), ("-3", None), ("soon", None), ("1e9", 1e9)],
)
def test_http_retry_after_values(http: FakeHttpProvider, header: str, expected: float | None) -> None:
    http.replies["+1"] = (503, {"Retry-After": header})
    provider = HttpProvider(name="sms-a", url=http.url, timeout_s=1.0)
    with pytest.raises(ProviderRetryableError) as err:
        send_now(provider, to="+1", message_key="k:sms", message=sample_message(SMS))
    assert err.value.retry_after_s == expected


def test_an_http_date_retry_after_is_honoured(http: FakeHttpProvider) -> None:
    from email.utils import formatdate

    http.replies["+1"] = (429, {"Retry-After": formatdate(time.time() + 30, usegmt=True)})
    provider = HttpProvider(name="sms-a", url=http.url, timeout_s=1.0)
    with pytest.raises(ProviderRetryableError) as err:
        send_now(provider, to="+1", message_key="k:sms", message=sample_message(SMS))
    assert err.value.retry_after_s is not None and 28 <= err.value.retry_after_s <= 31


# -- against the broker ----------------------------------------------------------------------------


@pytest.mark.integration
def test_retry_after_inf_neither_stops_the_process_nor_the_other_channels(
    senders_settings: SettingsFactory, kafka_bootstrap: str, http: FakeHttpProvider
) -> None:
    cfg = senders_settings(sms_primary=http.url, http_timeout_ms=1000)
    http.script[address_of("user-1", SMS)] = [(503, {"Retry-After": "inf"}), (202, {})]
    email = FakeProvider(name="mail")
    store = open_status_store(cfg)
    with build_pool(cfg, channels=[SMS, EMAIL], lanes=[NORMAL], providers={EMAIL: (email, None)}) as pool:
        produce_messages(kafka_bootstrap, cfg.topics.sms, [channel_message(1)])
        wait_until(lambda: len(http.to(address_of("user-1", SMS))) >= 1, 15, "the first SMS attempt")
        produce_messages(kafka_bootstrap, cfg.topics.email, [channel_message(2, channel=EMAIL)])
        wait_until(
            lambda: all(
                (r := store.get(k)) is not None and r.status is DeliveryStatus.SENT for k in ("k1:sms", "k2:email")
            ),
            15,
            lambda: f"both sent: {[(r.message_key, r.status.value) for r in store.rows()]}; {pool.errors}",
        )
    assert not pool.errors
    assert [r.idempotency_key for r in http.to(address_of("user-1", SMS))] == ["k1:sms", "k1:sms"]
    gap = http.to(address_of("user-1", SMS))[1].at - http.to(address_of("user-1", SMS))[0].at
    assert 1.0 <= gap <= 3.0, gap  # the backoff (1 s), the hint ignored


@pytest.mark.integration
def test_a_huge_retry_after_does_not_hold_the_retries_behind_it(
    senders_settings: SettingsFactory, kafka_bootstrap: str, http: FakeHttpProvider
) -> None:
    # steps 1, 2, 4 s; a hint is honoured up to 5 s
    cfg = senders_settings(partitions=1, sms_primary=http.url, http_timeout_ms=1000, max_backoff_ms=5000)
    http.script[address_of("user-1", SMS)] = [(503, {"Retry-After": "1e9"}), (202, {})]  # 2057
    for n in (2, 3):
        http.script[address_of(f"user-{n}", SMS)] = [(503, {"Retry-After": "4.2"}), (202, {})]  # the same delay topic (4s)
    store = open_status_store(cfg)
    with build_pool(cfg, channels=[SMS], lanes=[NORMAL]) as pool:
        produce_messages(kafka_bootstrap, cfg.topics.sms, [channel_message(n) for n in (1, 2, 3)])
        wait_until(
            lambda: sum(r.status is DeliveryStatus.SENT for r in store.rows()) == 3,
            20,
            lambda: f"all three sent: {[(r.message_key, r.status.value, r.retry_at_ms) for r in store.rows()]}",
        )
    assert not pool.errors
    first, second = http.to(address_of("user-1", SMS))
    assert 4.95 <= second.at - first.at <= 7.0  # max_backoff_ms, not 1e9 s
    for n in (2, 3):
        a, b = http.to(address_of(f"user-{n}", SMS))
        assert 4.15 <= b.at - a.at <= 6.5  # its own hint, not held behind user-1


@pytest.mark.integration
def test_a_far_due_record_in_a_delay_topic_moves_on_and_lets_the_due_ones_pass(
    senders_settings: SettingsFactory, kafka_bootstrap: str
) -> None:
    """A retry record due in 2057 (written by an older version, or a wrong clock) at the head of
    a delay partition: it is moved on, bounded, instead of holding the records behind it."""
    cfg = senders_settings(partitions=1, max_backoff_ms=4000)
    fake = FakeProvider()
    retry_1s = f"{cfg.topics.sms}.retry.1s"
    now = int(time.time() * 1000)

    def retry(n: int, not_before: int) -> bytes:
        payload = codec.encode("channel_message", channel_message(n))
        return codec.encode(
            "delayed_delivery",
            {"message_key": f"k{n}:sms", "attempt": 2, "not_before": not_before, "last_error": "503",
             "source_topic": cfg.topics.sms, "payload": payload},
        )

    prod = kafka_io.producer(cfg.kafka.client_config())
    kafka_io.produce_all(prod, retry_1s, [(b"user-1", retry(1, now + 10**12)), (b"user-2", retry(2, now + 500))])
    store = open_status_store(cfg)
    with build_pool(cfg, channels=[SMS], lanes=[NORMAL], providers={SMS: (fake, None)}) as pool:
        wait_until(lambda: any(r.message_key == "k2:sms" for r in fake.received()), 10, "the due retry is sent")
        sent_at = next(r.at for r in fake.received() if r.message_key == "k2:sms")
        wait_until(lambda: any(r.message_key == "k1:sms" for r in fake.received()), 15, "the far one, bounded")
        far_at = next(r.at for r in fake.received() if r.message_key == "k1:sms")
    assert not pool.errors
    assert sent_at - now / 1000 < 3.0  # not held behind the 2057 record
    assert 4.0 <= far_at - now / 1000 <= 9.0  # held at most its topic's step, then max_backoff_ms
    moved = [
        codec.decode("delayed_delivery", m.value)
        for m in kafka_io.read_committed(cfg.kafka.client_config(), [f"{cfg.topics.sms}.retry.4s"], idle_timeout_s=1)
        if m.value is not None
    ]
    assert [(m["message_key"], m["attempt"]) for m in moved] == [("k1:sms", 2)]
    assert now + 4000 <= moved[0]["not_before"] <= now + 4000 + 3000
    assert {r.message_key: r.status for r in store.rows()} == {"k1:sms": DeliveryStatus.SENT, "k2:sms": DeliveryStatus.SENT}
    trail = [(s["message_key"], s["status"]) for s in read_records(kafka_bootstrap, cfg.senders.status_topic, "delivery_status")]
    assert sorted(trail) == [("k1:sms", "sending"), ("k1:sms", "sent"), ("k2:sms", "sending"), ("k2:sms", "sent")]
