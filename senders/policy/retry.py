"""Exponential backoff with jitter, and the delay steps (one delay topic each) it implies."""

from __future__ import annotations

import math
from dataclasses import dataclass

from operators.errors import ConfigError


@dataclass(frozen=True, slots=True)
class RetryPolicy:
    """When to try a message again after a transient failure.

    :param base_ms: wait after the first failed attempt; it doubles after each further one
    :param max_attempts: provider attempts in all, the first included; then the dead-letter topic
    :param jitter_ratio: up to this fraction of the wait is added at random, so that retries
        of messages that failed together do not all come back at the same instant
    :param max_backoff_ms: upper bound of the doubling wait (jitter excluded)
    """

    base_ms: int = 30_000
    max_attempts: int = 5
    jitter_ratio: float = 0.2
    max_backoff_ms: int = 3_600_000

    def __post_init__(self) -> None:
        if self.base_ms <= 0:
            raise ConfigError("base backoff must be positive")
        if self.max_attempts < 1:
            raise ConfigError("max_attempts must be at least 1")
        if not 0.0 <= self.jitter_ratio <= 1.0:
            raise ConfigError("jitter_ratio must be within [0, 1]")
        if self.max_backoff_ms < self.base_ms:
            raise ConfigError("max_backoff_ms must not be below base_ms")

    def nominal_delay_ms(self, failed_attempt: int) -> int:
        """The wait after attempt ``failed_attempt`` (1-based) failed, before jitter."""
        if failed_attempt < 1:
            raise ValueError("attempts count from 1")
        exponent = min(failed_attempt - 1, 62)
        return min(self.max_backoff_ms, self.base_ms * (1 << exponent))

    def delay_ms(self, failed_attempt: int, rand: float) -> int:
        """The wait with jitter; ``rand`` is uniform in [0, 1)."""
        nominal = self.nominal_delay_ms(failed_attempt)
        return nominal + int(nominal * self.jitter_ratio * rand)

    def next_attempt_at(
        self, failed_attempt: int, now_ms: int, rand: float, retry_after_ms: int | None = None
    ) -> int | None:
        """When the next attempt is due, or None when ``failed_attempt`` was the last one allowed.

        A provider's own hint (``retry_after_ms``) is honoured when it is longer than the backoff,
        up to ``max_backoff_ms``: a hint of a year must not park the message for a year.
        """
        if failed_attempt >= self.max_attempts:
            return None
        wait = self.delay_ms(failed_attempt, rand)
        if retry_after_ms is not None:
            wait = max(wait, min(retry_after_ms, self.max_backoff_ms))
        return now_ms + wait

    def schedule_ms(self) -> int:
        """The longest a message can spend between its first and its last attempt: every wait
        at its full jitter (a Retry-After hint is bounded by ``max_backoff_ms`` too)."""
        waits = (self.nominal_delay_ms(a) for a in range(1, self.max_attempts))
        return sum(max(w + int(w * self.jitter_ratio), self.max_backoff_ms) for w in waits)

    def steps(self) -> tuple[int, ...]:
        """Distinct nominal waits, ascending: one delay topic each."""
        return tuple(sorted({self.nominal_delay_ms(a) for a in range(1, max(2, self.max_attempts))}))

    def step_for(self, wait_ms: int) -> int:
        """The delay topic a wait goes to: the longest step not longer than the wait.

        Records of one delay topic are then due in about the order they were written, so the
        head of a partition is (within jitter) the first one due.
        """
        fitting = [s for s in self.steps() if s <= wait_ms]
        return fitting[-1] if fitting else self.steps()[0]


def retry_after_ms(seconds: float | None) -> int | None:
    """A provider's Retry-After hint in ms; nonsense (negative, infinite, not a number) is no hint."""
    if seconds is None or not math.isfinite(seconds) or seconds < 0:
        return None
    return int(min(seconds, 10.0**12) * 1000)


def format_step(step_ms: int) -> str:
    """A delay step as a topic-name suffix: 1000 -> "1s", 90000 -> "90s", 1500 -> "1500ms"."""
    return f"{step_ms // 1000}s" if step_ms % 1000 == 0 else f"{step_ms}ms"
