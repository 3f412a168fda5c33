"""What the SLOs are computed from (deploy/prometheus/slos.yml, ``dedupctl slo``): each provider
answer's delivery outcome, the time from accept to that answer, and its cost.

Recorded where an answer's outcome is recorded (``DeliveryHandler.finish_batch``), once per
answer whose claim was still the worker's. The time is taken from the channel message's
``event_time``: the API writes its accept time there (unless the caller gave an ``event_time``
of its own), and a request written straight to Kafka carries its producer's event time.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping
from enum import StrEnum

from senders.policy.transitions import AttemptResult, OutcomePlan
from senders.records import Delivery
from senders.runtime.metrics import Metrics
from senders.statuses import DeadLetterReason, DeliveryStatus, Lane

#: seconds; resolves the one-time codes' 5 s and the transactional minute, then hours of retries
ACCEPT_TO_PROVIDER_BUCKETS = (0.1, 0.25, 0.5, 1.0, 2.0, 3.0, 5.0, 10.0, 20.0, 30.0, 60.0, 120.0, 300.0,
                              900.0, 3600.0, 14400.0)


class DeliveryOutcome(StrEnum):
    """What a provider's answer came to (``sender_deliveries_total{outcome}``)."""

    SENT = "sent"
    RETRIED = "retried"  # a transient failure, another attempt scheduled
    PERMANENT_FAILURE = "permanent_failure"  # refused for good: dead-lettered at once
    DEAD_LETTERED = "dead_lettered"  # transient failures until the last attempt


def delivery_outcome(plan: OutcomePlan) -> DeliveryOutcome:
    if plan.status is DeliveryStatus.SENT:
        return DeliveryOutcome.SENT
    if plan.retry_at_ms is not None:
        return DeliveryOutcome.RETRIED
    if plan.dead_letter is DeadLetterReason.PERMANENT_FAILURE:
        return DeliveryOutcome.PERMANENT_FAILURE
    return DeliveryOutcome.DEAD_LETTERED


def accept_to_provider_s(event_time_ms: int, answered_ms: int) -> float:
    """Seconds from the accept (the message's event time) to the provider's answer; never below
    zero (a producer's clock ahead of ours)."""
    return max(0.0, (answered_ms - event_time_ms) / 1000)


def record_answers(
    metrics: Metrics,
    lane: Lane,
    answers: Iterable[tuple[Delivery, OutcomePlan, AttemptResult]],
    *,
    answered_ms: int,
    prices: Mapping[str, float],
) -> None:
    """Count a batch's provider answers: each one's outcome; when the provider took the message,
    its time from accept and its price (``prices``: per provider name, missing ones cost 0).
    The counts of a label set are added once per batch."""
    outcomes: Counter[tuple[str, str, str]] = Counter()
    waits: dict[tuple[str, str], list[float]] = {}
    sent: Counter[tuple[str, str]] = Counter()
    for d, plan, result in answers:
        if result.provider is None:
            continue  # no provider was called (no time left in the lease): nothing answered
        channel = d.channel.value
        outcome = delivery_outcome(plan)
        outcomes[(channel, result.provider, outcome.value)] += 1
        if outcome is DeliveryOutcome.SENT:
            waits.setdefault((channel, d.category), []).append(accept_to_provider_s(d.event_time_ms, answered_ms))
            sent[(channel, result.provider)] += 1
    for (channel, provider, outcome_value), n in outcomes.items():
        metrics.inc("sender_deliveries_total", n, channel=channel, lane=lane.value, provider=provider,
                    outcome=outcome_value)
    for (channel, category), values in waits.items():
        metrics.observe_many(
            "sender_accept_to_provider_seconds", values, ACCEPT_TO_PROVIDER_BUCKETS,
            channel=channel, lane=lane.value, category=category,
        )
    # counted at a price of 0 too: the series is there before anyone sets a price
    for (channel, provider), n in sent.items():
        metrics.inc("sender_cost_units_total", prices.get(provider, 0.0) * n, channel=channel, provider=provider)
