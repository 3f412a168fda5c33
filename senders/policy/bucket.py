"""A token bucket with reservations: each call is told how long to wait, so callers go in turn."""

from __future__ import annotations

from dataclasses import dataclass

from operators.errors import ConfigError


@dataclass(frozen=True, slots=True)
class RateLimit:
    """A provider's rate limit.

    :param per_second: sustained calls per second
    :param burst: calls allowed at once after a quiet spell (the bucket's size)
    """

    per_second: float
    burst: int = 1

    def __post_init__(self) -> None:
        if self.per_second <= 0:
            raise ConfigError("rate limit must be positive")
        if self.burst < 1:
            raise ConfigError("rate limit burst must be at least 1")


class TokenBucket:
    """Holds up to ``burst`` tokens, refilled at ``per_second``. ``reserve`` takes a token now,
    even one that does not exist yet, and returns how long the caller must wait before using it;
    later callers queue behind. So over any span T at most ``burst + per_second * T`` calls go out.
    """

    def __init__(self, limit: RateLimit, now_s: float) -> None:
        self.limit = limit
        self._tokens = float(limit.burst)
        self._updated = now_s

    def reserve(self, now_s: float, n: int = 1) -> float:
        """Take ``n`` tokens; returns the seconds to wait (0.0 when they were there)."""
        self._refill(now_s)
        self._tokens -= n
        return 0.0 if self._tokens >= 0 else -self._tokens / self.limit.per_second

    def reserve_within(self, now_s: float, max_wait_s: float, n: int = 1) -> float | None:
        """Take ``n`` tokens if the wait for them is at most ``max_wait_s``; returns the wait, or
        None (and takes nothing) when it would be longer."""
        self._refill(now_s)
        wait = 0.0 if self._tokens >= n else (n - self._tokens) / self.limit.per_second
        if wait > max_wait_s:
            return None
        self._tokens -= n
        return wait

    def _refill(self, now_s: float) -> None:
        if now_s > self._updated:
            self._tokens = min(
                float(self.limit.burst), self._tokens + (now_s - self._updated) * self.limit.per_second
            )
            self._updated = now_s

    def available(self, now_s: float) -> float:
        """Tokens there now (negative while reservations are queued)."""
        elapsed = max(0.0, now_s - self._updated)
        return min(float(self.limit.burst), self._tokens + elapsed * self.limit.per_second)
