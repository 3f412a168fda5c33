"""The status state machine, the claim decision and the outcome plan (pure)."""

from __future__ import annotations

import json

import pytest

from operators import codec
from senders.errors import InvalidTransitionError
from senders.policy.retry import RetryPolicy
from senders.policy.transitions import (
    ALLOWED,
    AttemptResult,
    StoredState,
    check_transition,
    decide_claim,
    plan_outcome,
)
from senders.statuses import (
    FINAL_STATUSES,
    AttemptOutcome,
    ClaimAction,
    DeadLetterReason,
    DeliveryStatus,
    Lane,
)

S = DeliveryStatus
POLICY = RetryPolicy(base_ms=1000, max_attempts=3, jitter_ratio=0.0)


@pytest.mark.parametrize(
    ("old", "new"),
    [
        (None, S.QUEUED),
        (S.QUEUED, S.SENDING),
        (S.SENDING, S.SENT),
        (S.SENDING, S.QUEUED),
        (S.SENDING, S.FAILED),
        (S.SENDING, S.SENDING),
        (S.SENT, S.DELIVERED),
        (S.SENT, S.FAILED),
        (S.FAILED, S.QUEUED),  # a redrive
    ],
)
def test_allowed(old: DeliveryStatus | None, new: DeliveryStatus) -> None:
    check_transition(old, new)


@pytest.mark.parametrize(
    ("old", "new"),
    [
        (S.QUEUED, S.SENT),
        (S.QUEUED, S.FAILED),
        (S.SENT, S.SENDING),
        (S.SENT, S.QUEUED),
        (S.FAILED, S.SENDING),
        (S.DELIVERED, S.SENT),
        (None, S.SENT),
    ],
)
def test_forbidden(old: DeliveryStatus | None, new: DeliveryStatus) -> None:
    with pytest.raises(InvalidTransitionError):
        check_transition(old, new)


def test_final_statuses_lead_nowhere_that_sends() -> None:
    for status in FINAL_STATUSES:
        assert S.SENDING not in ALLOWED[status]


def claim(state: StoredState | None, attempt: int = 1, now: int = 1000) -> ClaimAction:
    return decide_claim(state, attempt, now).action


def test_a_new_key_is_claimed() -> None:
    assert claim(None) is ClaimAction.CLAIM
    assert claim(StoredState(S.QUEUED, 0)) is ClaimAction.CLAIM


@pytest.mark.parametrize("status", sorted(FINAL_STATUSES))
def test_a_replayed_key_that_is_done_is_skipped(status: DeliveryStatus) -> None:
    assert claim(StoredState(status, 1)) is ClaimAction.SKIP
    assert claim(StoredState(status, 3), attempt=1) is ClaimAction.SKIP  # a replay of the first attempt


def test_an_unpublished_outcome_of_this_attempt_is_republished() -> None:
    assert claim(StoredState(S.SENT, 2, unpublished=True), attempt=2) is ClaimAction.REPUBLISH
    assert claim(StoredState(S.QUEUED, 2, unpublished=True), attempt=2) is ClaimAction.REPUBLISH
    assert claim(StoredState(S.SENT, 2, unpublished=True), attempt=1) is ClaimAction.SKIP


def test_the_next_attempt_claims_a_queued_key_and_a_stale_one_is_skipped() -> None:
    assert claim(StoredState(S.QUEUED, 1), attempt=2) is ClaimAction.CLAIM
    assert claim(StoredState(S.QUEUED, 2), attempt=2) is ClaimAction.SKIP  # duplicate retry record
    assert claim(StoredState(S.QUEUED, 2), attempt=1) is ClaimAction.SKIP  # replay of the first


def test_a_live_claim_is_waited_for_and_an_expired_one_taken_over() -> None:
    live = decide_claim(StoredState(S.SENDING, 1, lease_until_ms=5000), 1, 1000)
    assert live.action is ClaimAction.WAIT and live.until_ms == 5000
    assert claim(StoredState(S.SENDING, 1, lease_until_ms=1000), now=1000) is ClaimAction.CLAIM
    assert claim(StoredState(S.SENDING, 2, lease_until_ms=0), attempt=1) is ClaimAction.SKIP


def test_outcomes() -> None:
    sent = plan_outcome(AttemptResult(AttemptOutcome.SENT), attempt=1, policy=POLICY, now_ms=0, rand=0.0)
    assert sent.status is S.SENT and sent.retry_at_ms is None and sent.dead_letter is None
    retry = plan_outcome(
        AttemptResult(AttemptOutcome.TRANSIENT, "503"), attempt=2, policy=POLICY, now_ms=0, rand=0.0
    )
    assert retry.status is S.QUEUED and retry.retry_at_ms == 2000
    last = plan_outcome(
        AttemptResult(AttemptOutcome.TRANSIENT, "503"), attempt=3, policy=POLICY, now_ms=0, rand=0.0
    )
    assert last.status is S.FAILED and last.dead_letter is DeadLetterReason.MAX_ATTEMPTS
    perm = plan_outcome(
        AttemptResult(AttemptOutcome.PERMANENT, "400", deactivate_address=True),
        attempt=1,
        policy=POLICY,
        now_ms=0,
        rand=0.0,
    )
    assert perm.status is S.FAILED and perm.dead_letter is DeadLetterReason.PERMANENT_FAILURE
    assert perm.deactivate_address and perm.retry_at_ms is None


def _symbols(stem: str, enum_name: str) -> list[str]:
    text = json.loads((codec.SCHEMAS_DIR / f"{stem}.avsc").read_text())
    for f in text["fields"]:
        t = f["type"]
        if isinstance(t, dict) and t.get("name") == enum_name:
            return list(t["symbols"])
    raise AssertionError(f"no enum {enum_name} in {stem}")


def test_the_schemas_enums_are_the_statuses() -> None:
    assert _symbols("delivery_status", "Status") == [s.value for s in DeliveryStatus]
    assert _symbols("delivery_status", "Lane") == [lane.value for lane in Lane]
    assert _symbols("dead_letter", "DeadLetterReason") == [r.value for r in DeadLetterReason]


# -- the rules' statuses ---------------------------------------------------------------------------


def test_a_deferred_message_is_claimed_again_only_when_due() -> None:
    from senders.policy.transitions import StoredState, decide_claim
    from senders.statuses import ClaimAction, DeliveryStatus

    waiting = StoredState(DeliveryStatus.DEFERRED, attempts=1, not_before_ms=5_000)
    early = decide_claim(waiting, attempt=1, now_ms=4_999)  # a replayed record, or a cut wait
    assert (early.action, early.until_ms) == (ClaimAction.DEFER, 5_000)
    assert decide_claim(waiting, attempt=1, now_ms=5_000).action is ClaimAction.CLAIM
    unpublished = StoredState(DeliveryStatus.DEFERRED, attempts=1, unpublished=True, not_before_ms=5_000)
    assert decide_claim(unpublished, attempt=1, now_ms=1).action is ClaimAction.REPUBLISH
    assert decide_claim(StoredState(DeliveryStatus.DEFERRED, 2, not_before_ms=1), 1, 9).action is ClaimAction.SKIP
    for final in (DeliveryStatus.SKIPPED, DeliveryStatus.REJECTED):
        assert decide_claim(StoredState(final, 1), 1, 9).action is ClaimAction.SKIP
        assert decide_claim(StoredState(final, 1, unpublished=True), 1, 9).action is ClaimAction.REPUBLISH


def test_the_rules_statuses_in_the_state_machine() -> None:
    from senders.policy.transitions import check_transition
    from senders.statuses import DeliveryStatus as S

    for ruled in (S.SKIPPED, S.DEFERRED, S.REJECTED):
        for old in (S.QUEUED, S.SENDING, S.DEFERRED):
            check_transition(old, ruled)
    check_transition(S.DEFERRED, S.SENDING)
    for final in (S.SKIPPED, S.REJECTED):
        for new in S:
            with pytest.raises(InvalidTransitionError):
                check_transition(final, new)
    with pytest.raises(InvalidTransitionError):
        check_transition(S.SENT, S.SKIPPED)
