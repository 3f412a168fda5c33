"""The senders' SLIs (senders/runtime/slis.py): each provider answer's outcome per channel and
provider, the time from accept to the provider per channel, lane and category (a histogram), and
the cost per channel and provider; as the workers' /metrics shows them."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from operators import codec
from operators.errors import ConfigError
from operators.records import Channel
from senders.policy.breaker import BreakerOptions
from senders.policy.bucket import RateLimit
from senders.policy.prices import parse_prices
from senders.policy.retry import RetryPolicy, format_step
from senders.policy.transitions import OutcomePlan
from senders.profiles.model import parse_profile
from senders.providers import FakeProvider
from senders.runtime.dispatch import Dispatcher
from senders.runtime.handler import DeliveryHandler, HandlerTopics
from senders.runtime.metrics import Metrics
from senders.runtime.slis import DeliveryOutcome, accept_to_provider_s, delivery_outcome
from senders.statuses import DeadLetterReason, DeliveryStatus, Lane
from senders.store.status import open_store
from settings import Settings
from tests.senders.conftest import channel_message, profiles_for_tests, rules_for_tests

SMS = Channel.SMS
EVENT_TIME = 1_796_115_600_000  # the test messages' (tests/senders/conftest.py)


def test_each_plan_is_one_delivery_outcome() -> None:
    assert delivery_outcome(OutcomePlan(DeliveryStatus.SENT)) is DeliveryOutcome.SENT
    assert delivery_outcome(OutcomePlan(DeliveryStatus.QUEUED, retry_at_ms=5)) is DeliveryOutcome.RETRIED
    permanent = OutcomePlan(DeliveryStatus.FAILED, dead_letter=DeadLetterReason.PERMANENT_FAILURE)
    assert delivery_outcome(permanent) is DeliveryOutcome.PERMANENT_FAILURE
    exhausted = OutcomePlan(DeliveryStatus.FAILED, dead_letter=DeadLetterReason.MAX_ATTEMPTS)
    assert delivery_outcome(exhausted) is DeliveryOutcome.DEAD_LETTERED


def test_accept_to_provider_never_below_zero() -> None:
    assert accept_to_provider_s(1_000, 3_500) == 2.5
    assert accept_to_provider_s(5_000, 3_500) == 0.0  # the producer's clock ahead of ours


def test_prices_per_provider() -> None:
    assert parse_prices("") == {}
    assert parse_prices(" sms-a.example:443=0.0075 ; smtp=0.0001;") == {"sms-a.example:443": 0.0075, "smtp": 0.0001}
    for bad in ("fake", "=1", "fake=x", "fake=-1", "fake=nan", "fake=1;fake=2"):
        with pytest.raises(ConfigError, match="provider_prices"):
            parse_prices(bad)
    assert Settings().with_overrides(senders={"provider_prices": "fake=0.25"}).senders.prices() == {"fake": 0.25}
    with pytest.raises(ConfigError, match="provider_prices"):
        Settings().with_overrides(senders={"provider_prices": "fake=cheap"})


def test_a_histogram_renders_cumulative_buckets_sum_and_count() -> None:
    m = Metrics()
    for v in (0.5, 1.0, 3.0, 99.0):
        m.observe("h_seconds", v, (1.0, 5.0), channel="sms")
    text = m.render_prometheus()
    assert "# TYPE h_seconds histogram" in text
    for line in ('h_seconds_bucket{channel="sms",le="1.0"} 2', 'h_seconds_bucket{channel="sms",le="5.0"} 3',
                 'h_seconds_bucket{channel="sms",le="+Inf"} 4', 'h_seconds_sum{channel="sms"} 103.5',
                 'h_seconds_count{channel="sms"} 4'):
        assert line in text.splitlines(), line
    assert m.value("h_seconds_count", channel="sms") == 4


def _handler(tmp_path: Path, fake: FakeProvider, lane: Lane, now: list[int], metrics: Metrics) -> DeliveryHandler:
    store = open_store(str(tmp_path / "status.sqlite3"), synchronous="NORMAL")
    profiles = profiles_for_tests(store)
    for n, user in enumerate(("user-ok", "user-flaky", "user-gone"), start=1):
        profiles.store.put(user, parse_profile({"contacts": {"sms": [f"+1555000{n}"]}}))
    dispatcher = Dispatcher(channel=SMS, primary=fake, secondary=None, limit=RateLimit(1000, 100),
                            breaker=BreakerOptions(), metrics=metrics)
    return DeliveryHandler(
        channel=SMS, lane=lane, store=store, dispatcher=dispatcher, profiles=profiles, rules=rules_for_tests(tmp_path),
        policy=RetryPolicy(base_ms=1000, max_attempts=2, jitter_ratio=0.0),
        topics=HandlerTopics(status="status", dlq="dlq", delay=lambda t, step: f"{t}.retry.{format_step(step)}"),
        lease_ms=5000, owner="w", metrics=metrics, clock_ms=lambda: now[0], rand=lambda: 0.0,
        prices={"fake": 0.25},
    )


def test_outcomes_latency_and_cost_as_the_workers_export_them(tmp_path: Path) -> None:
    fake = FakeProvider(script={"+15550002": ["transient"], "+15550003": ["permanent"]})
    metrics = Metrics()
    now = [EVENT_TIME + 3_000]  # 3 s after the accept
    h = _handler(tmp_path, fake, Lane.PRIORITY, now, metrics)

    def handle(n: int, user: str, topic: str = "sms", value: bytes | None = None, step: int | None = None) -> list[str]:
        raw = value or codec.encode("channel_message", channel_message(n, user=user, priority="high"))
        out = asyncio.run(h.handle(topic=topic, partition=0, offset=n, key=None, value=raw, delay_step_ms=step))
        return [o.topic for o in out.outputs]

    assert handle(1, "user-ok")[-1] == "status"
    retry = asyncio.run(h.handle(topic="sms", partition=0, offset=2, key=None,
                                 value=codec.encode("channel_message", channel_message(2, user="user-flaky"))))
    assert retry.outputs[-1].topic == "sms.retry.1s"
    now[0] += 1000
    assert handle(2, "user-flaky", topic="sms.retry.1s", value=retry.outputs[-1].value, step=1000)[-1] == "dlq"
    assert handle(3, "user-gone")[-1] == "dlq"

    text = metrics.render_prometheus().splitlines()
    labels = 'channel="sms",lane="priority",outcome="{}",provider="fake"'
    for outcome in ("sent", "retried", "dead_lettered", "permanent_failure"):
        assert f"sender_deliveries_total{{{labels.format(outcome)}}} 1" in text, outcome
    # only the message the provider took: 3 s from accept (above 2, within 3 and 5)
    hist = 'sender_accept_to_provider_seconds_bucket{category="transactional",channel="sms",lane="priority",le="%s"}'
    assert f"{hist % '2.0'} 0" in text and f"{hist % '3.0'} 1" in text and f"{hist % '+Inf'} 1" in text
    assert 'sender_accept_to_provider_seconds_count{category="transactional",channel="sms",lane="priority"} 1' in text
    assert 'sender_cost_units_total{channel="sms",provider="fake"} 0.25' in text
