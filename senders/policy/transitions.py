"""The status state machine: which changes are allowed, whether a record may be sent, what an
attempt's outcome leads to. The status store applies these decisions inside one transaction."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from senders.errors import InvalidTransitionError
from senders.policy.retry import RetryPolicy
from senders.statuses import (
    FINAL_STATUSES,
    AttemptOutcome,
    ClaimAction,
    DeadLetterReason,
    DeliveryStatus,
)

Q, SENDING, SENT, DELIVERED, FAILED, SKIPPED, DEFERRED, REJECTED = (
    DeliveryStatus.QUEUED,
    DeliveryStatus.SENDING,
    DeliveryStatus.SENT,
    DeliveryStatus.DELIVERED,
    DeliveryStatus.FAILED,
    DeliveryStatus.SKIPPED,
    DeliveryStatus.DEFERRED,
    DeliveryStatus.REJECTED,
)
#: what the send-time rules may decide instead of a provider call
RULED = frozenset({SKIPPED, DEFERRED, REJECTED})

#: old status (None: no row yet) -> the statuses it may change to
ALLOWED: Mapping[DeliveryStatus | None, frozenset[DeliveryStatus]] = {
    None: frozenset({Q, SENDING}),
    # a claimed record whose rules say skip, defer or reject goes there in the claim's transaction
    Q: frozenset({SENDING} | RULED),
    # SENDING -> SENDING: a claim whose lease ran out (its worker died) is taken over
    SENDING: frozenset({SENDING, SENT, Q, FAILED} | RULED),
    # a deferred message, due, is claimed and decided again
    DEFERRED: frozenset({SENDING} | RULED),
    SKIPPED: frozenset(),
    REJECTED: frozenset(),
    # a delivery receipt confirms or, for a bounce, fails a sent message
    SENT: frozenset({DELIVERED, FAILED}),
    DELIVERED: frozenset(),
    # `dedupctl senders redrive`: a dead-lettered message starts again with no attempt made
    FAILED: frozenset({Q}),
}


def check_transition(old: DeliveryStatus | None, new: DeliveryStatus) -> None:
    if new not in ALLOWED[old]:
        raise InvalidTransitionError(old, new)


@dataclass(frozen=True, slots=True)
class StoredState:
    """What the status store holds for one message key.

    :param status: the current status
    :param attempts: the attempt number of the latest claim (provider attempts started)
    :param lease_until_ms: a SENDING claim is its worker's until then
    :param unpublished: the latest outcome's records (status, retry or dead letter) may not be in
        Kafka yet; cleared once the transaction that wrote them has committed
    :param not_before_ms: a DEFERRED message is not decided again before this instant
    """

    status: DeliveryStatus
    attempts: int
    lease_until_ms: int = 0
    unpublished: bool = False
    not_before_ms: int = 0


@dataclass(frozen=True, slots=True)
class ClaimDecision:
    action: ClaimAction
    reason: str = ""
    until_ms: int = 0  # for WAIT and DEFER


def decide_claim(state: StoredState | None, attempt: int, now_ms: int) -> ClaimDecision:
    """May attempt ``attempt`` of a message be made now?

    The first record of a key claims it. A redelivered or replayed record whose key is already
    sent (or failed, or past this attempt) is skipped, unless the store says the outcome of
    exactly this attempt was recorded but its records may be lost (a crash, an aborted
    transaction): then they are produced again. A claim whose lease has run out belonged to a
    worker that died mid-call; it is taken over and the message is sent again with the same
    idempotency key (the one gap of at-most-once, see docs/senders.md).

    A deferred message (no provider call made: its attempt stays) is claimed again by a record
    of that attempt once its ``not_before`` has come; a record of it that comes earlier (a
    replayed channel record, a delay record whose wait was cut) is put back to wait (DEFER).
    """
    if state is None:
        return ClaimDecision(ClaimAction.CLAIM)
    if state.status is DeliveryStatus.DEFERRED:
        if state.attempts < attempt:
            return ClaimDecision(ClaimAction.CLAIM)
        if state.attempts > attempt:
            return ClaimDecision(ClaimAction.SKIP, f"attempt {attempt} superseded by attempt {state.attempts}")
        if state.unpublished:
            return ClaimDecision(ClaimAction.REPUBLISH, "deferral not yet published")
        if state.not_before_ms > now_ms:
            return ClaimDecision(ClaimAction.DEFER, "deferred", until_ms=state.not_before_ms)
        return ClaimDecision(ClaimAction.CLAIM, "deferral due: deciding again")
    if state.status in FINAL_STATUSES:
        if state.unpublished and state.attempts == attempt:
            return ClaimDecision(ClaimAction.REPUBLISH, f"{state.status} not yet published")
        return ClaimDecision(ClaimAction.SKIP, f"already {state.status}")
    if state.status is DeliveryStatus.QUEUED:
        if state.attempts < attempt:
            return ClaimDecision(ClaimAction.CLAIM)
        if state.attempts == attempt and state.unpublished:
            return ClaimDecision(ClaimAction.REPUBLISH, "retry not yet published")
        return ClaimDecision(
            ClaimAction.SKIP, f"attempt {attempt} superseded by attempt {state.attempts + 1}"
        )
    # SENDING
    if state.attempts > attempt:
        return ClaimDecision(ClaimAction.SKIP, f"attempt {attempt} superseded by attempt {state.attempts}")
    if state.lease_until_ms <= now_ms:
        return ClaimDecision(ClaimAction.CLAIM, "lease expired: taking over")
    return ClaimDecision(ClaimAction.WAIT, "claimed by another worker", until_ms=state.lease_until_ms)


@dataclass(frozen=True, slots=True)
class AttemptResult:
    """One provider call, as the state machine sees it.

    :param outcome: sent, transient or permanent
    :param reason: why it failed (fit for logs: no address, no params)
    :param retry_after_ms: the provider's own wait hint, for a transient failure
    :param deactivate_address: a permanent failure caused by the address itself
    :param provider: the provider that was called (None when none was)
    :param reference: the provider's id of an accepted message (its delivery receipts name it)
    """

    outcome: AttemptOutcome
    reason: str = ""
    retry_after_ms: int | None = None
    deactivate_address: bool = False
    provider: str | None = None
    reference: str | None = None


@dataclass(frozen=True, slots=True)
class OutcomePlan:
    """What follows an attempt: the new status, and a retry time or a dead letter."""

    status: DeliveryStatus
    retry_at_ms: int | None = None
    dead_letter: DeadLetterReason | None = None
    deactivate_address: bool = False


def plan_outcome(
    result: AttemptResult, *, attempt: int, policy: RetryPolicy, now_ms: int, rand: float
) -> OutcomePlan:
    """sent -> SENT; transient -> QUEUED with a retry time, or FAILED to the dead-letter topic
    after the last attempt; permanent -> FAILED at once (and the address deactivated if it is to
    blame)."""
    if result.outcome is AttemptOutcome.SENT:
        return OutcomePlan(DeliveryStatus.SENT)
    if result.outcome is AttemptOutcome.PERMANENT:
        return OutcomePlan(
            DeliveryStatus.FAILED,
            dead_letter=DeadLetterReason.PERMANENT_FAILURE,
            deactivate_address=result.deactivate_address,
        )
    retry_at = policy.next_attempt_at(attempt, now_ms, rand, result.retry_after_ms)
    if retry_at is None:
        return OutcomePlan(DeliveryStatus.FAILED, dead_letter=DeadLetterReason.MAX_ATTEMPTS)
    return OutcomePlan(DeliveryStatus.QUEUED, retry_at_ms=retry_at)
