"""The dispatcher under concurrency, without Kafka: the token bucket paces starts however many
calls wait, the breaker takes outcomes as they come, a half-open probe is exactly one call, and a
provider that fails everything costs ``min_calls`` messages, not every call in flight."""

from __future__ import annotations

import asyncio
import time

from operators import codec
from operators.records import Channel
from senders.policy.breaker import BreakerOptions
from senders.policy.bucket import RateLimit
from senders.providers import FakeProvider
from senders.records import Delivery, from_channel_record
from senders.runtime.dispatch import Dispatcher
from senders.runtime.metrics import Metrics
from senders.statuses import AttemptOutcome, CircuitState, Lane
from tests.senders.conftest import channel_message, sample_message

SMS = Channel.SMS
BREAKER = BreakerOptions(window=10, min_calls=4, failure_rate=0.5, open_ms=1000)


def _delivery(n: int) -> Delivery:
    raw = codec.encode("channel_message", channel_message(n))
    return from_channel_record(raw, key=None, lane=Lane.NORMAL, source_topic="sms")


def _dispatcher(primary: FakeProvider, secondary: FakeProvider | None, now: list[int], rate: float = 1e6) -> Dispatcher:
    return Dispatcher(
        channel=SMS,
        primary=primary,
        secondary=secondary,
        limit=RateLimit(rate, 5 if rate < 1e6 else 1000),
        breaker=BREAKER,
        metrics=Metrics(),
        clock_ms=lambda: now[0],
    )


async def _send_all(d: Dispatcher, keys: range) -> list[AttemptOutcome]:
    results = await asyncio.gather(
        *(d.send(_delivery(i), f"+1555{i:07d}", sample_message(SMS), budget_s=10) for i in keys)
    )
    return [r.outcome for r in results]


def test_a_failing_primary_costs_min_calls_messages_and_the_rest_fail_over() -> None:
    primary = FakeProvider(name="primary", default="transient", latency_s=0.05)
    secondary = FakeProvider(name="secondary", latency_s=0.05)
    now = [0]
    d = _dispatcher(primary, secondary, now)
    outcomes = asyncio.run(_send_all(d, range(100)))
    assert len(primary.received()) == BREAKER.min_calls  # 100 at once, but 4 were enough to know
    assert d.circuit is CircuitState.OPEN
    assert outcomes.count(AttemptOutcome.TRANSIENT) == BREAKER.min_calls
    assert {r.message_key for r in secondary.received()} == {f"k{i}:sms" for i in range(100)} - {
        r.message_key for r in primary.received()
    }
    assert secondary.peak_in_flight > 50  # the secondary takes them all at once


def test_a_half_open_probe_is_exactly_one_call_and_the_others_wait_without_a_secondary() -> None:
    primary = FakeProvider(name="primary", default="transient", latency_s=0.05)
    now = [0]
    d = _dispatcher(primary, None, now)
    asyncio.run(_send_all(d, range(4)))
    assert d.circuit is CircuitState.OPEN
    now[0] = 1000  # past open_ms: the next call probes
    primary._default = primary._default.__class__("ok")  # the primary has recovered

    async def probe_while_others_wait() -> list[AttemptOutcome]:
        return await _send_all(d, range(10, 40))

    outcomes = asyncio.run(probe_while_others_wait())
    assert outcomes == [AttemptOutcome.SENT] * 30
    calls = [r.at for r in primary.received()][4:]
    assert d.circuit is CircuitState.CLOSED
    first, rest = calls[0], calls[1:]
    assert all(at >= first + 0.045 for at in rest)  # nobody went before the probe's outcome
    # closed again, the breaker knows nothing yet: min_calls calls first, the rest after an outcome
    slow_start, after = rest[: BREAKER.min_calls], rest[BREAKER.min_calls :]
    assert all(at >= min(slow_start) + 0.045 for at in after)


def test_the_bucket_paces_starts_of_concurrent_calls() -> None:
    primary = FakeProvider(name="primary", latency_s=0.2)
    d = _dispatcher(primary, None, [0], rate=50.0)
    start = time.monotonic()
    outcomes = asyncio.run(_send_all(d, range(60)))
    assert outcomes == [AttemptOutcome.SENT] * 60
    starts = sorted(r.at for r in primary.received())
    for i in range(len(starts)):
        for j in range(i, len(starts)):
            assert j - i + 1 <= 5 + 50.0 * (starts[j] - starts[i]) + 0.5
    assert time.monotonic() - start >= (60 - 5) / 50.0
    assert primary.peak_in_flight >= 8  # 50/s x 200 ms: about 10 open at once


def test_a_provider_with_a_capacity_is_promised_no_more_calls_than_it_carries_and_the_priority_lane_first() -> None:
    """An SMTP relay's sessions: promises stop at the provider's capacity, counting the calls
    whose ``send`` has not returned; a call's end frees its seat, and the priority lane's unmet
    claim takes the next free seat before the normal lane."""
    primary = FakeProvider(name="relay", latency_s=0.05)
    primary.capacity = 3
    d = _dispatcher(primary, None, [0])

    async def go() -> None:
        assert d.promise(10, 1.0) == 3
        assert d.promise(10, 1.0) == 0  # every seat promised
        d.release(1)  # a message the rules did not send gives its seat back
        assert d.promise(10, 1.0) == 1
        calls = [asyncio.create_task(d.send(_delivery(i), f"+1555{i:07d}", sample_message(SMS), budget_s=5,
                                            promised=True)) for i in range(3)]
        assert d.promise(5, 1.0, first=True) == 0  # the priority lane waits for a seat ...
        await d.room(1.0)  # ... which a call's end frees (long before the second)
        assert calls[0].done() or calls[1].done() or calls[2].done()
        assert d.promise(5, 1.0) == 0  # not the normal lane's: the priority lane asked first
        assert d.promise(5, 1.0, first=True) >= 1
        await asyncio.gather(*calls)
        assert primary.peak_in_flight == 3

    asyncio.run(go())
