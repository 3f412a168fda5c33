"""Where a retry record read from a delay topic goes: sent now, held, or moved on.

A delay topic's partition is read in order, and the worker pauses it while its head is not due
(``senders.runtime.worker``). Records of one topic are written with about the same wait (its step,
plus jitter), so holding the head costs the records behind it at most the jitter. A record that
is due much later than its topic's step (a Retry-After that fits no step, a record of an older
version, a clock that jumped) would hold them far longer: it is held only until its topic's step
has passed since it was written, then moved on to the delay topic that fits the wait it still
has, so it never holds back another record past that record's own step.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

from senders.policy.retry import RetryPolicy


class DelayAction(StrEnum):
    DUE = "due"  # attempt it now
    HOLD = "hold"  # pause the partition until ``until_ms``
    MOVE = "move"  # produce it again to the delay topic of ``step_ms``, due at ``not_before_ms``


@dataclass(frozen=True, slots=True)
class DelayDecision:
    action: DelayAction
    until_ms: int = 0
    step_ms: int = 0
    not_before_ms: int = 0


def place_delayed(
    *, not_before_ms: int, written_ms: int, step_ms: int, now_ms: int, policy: RetryPolicy
) -> DelayDecision:
    """The fate of a retry record due at ``not_before_ms``, written at ``written_ms`` to the delay
    topic of ``step_ms``. A due time beyond ``now + max_backoff_ms`` is cut to it when moved."""
    if not_before_ms <= now_ms:
        return DelayDecision(DelayAction.DUE)
    release = written_ms + int(step_ms * (1 + policy.jitter_ratio))  # the topic's own records are due by then
    if not_before_ms <= release:
        return DelayDecision(DelayAction.HOLD, until_ms=not_before_ms)
    if now_ms < release:
        return DelayDecision(DelayAction.HOLD, until_ms=release)
    due = min(not_before_ms, now_ms + policy.max_backoff_ms)
    return DelayDecision(DelayAction.MOVE, step_ms=policy.step_for(due - now_ms), not_before_ms=due)
