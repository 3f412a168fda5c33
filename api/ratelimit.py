"""Each caller's rate (its token's ``--rate``, or ``api.default_rate_per_sec``): a token bucket
per caller (senders.policy.bucket), per API process. Past it: 429 with Retry-After."""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Callable

from senders.policy.bucket import RateLimit, TokenBucket


class CallerLimits:
    def __init__(self, default_rate: float, clock: Callable[[], float] = time.monotonic) -> None:
        self._default = default_rate
        self._clock = clock
        self._buckets: dict[tuple[str, float], TokenBucket] = {}
        self._lock = threading.Lock()

    def admit(self, caller: str, rate: float | None) -> int | None:
        """None: admitted (a token taken); else the seconds to wait (Retry-After, at least 1)."""
        per_second = rate or self._default
        now = self._clock()
        with self._lock:
            bucket = self._buckets.get((caller, per_second))
            if bucket is None:
                limit = RateLimit(per_second=per_second, burst=max(1, math.ceil(per_second)))
                bucket = self._buckets[(caller, per_second)] = TokenBucket(limit, now)
            if bucket.reserve_within(now, 0.0) is not None:
                return None
            missing = 1.0 - bucket.available(now)
        return max(1, math.ceil(missing / per_second))
