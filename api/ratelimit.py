"""Each caller's rates, per API process, as token buckets (senders.policy.bucket): one for new
notifications (its ``--rate``, or ``api.default_rate_per_sec``) and one for every other ``/v1``
call (``api.calls_rate_per_sec``). Past one: 429 with Retry-After."""

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
        self._buckets: dict[tuple[str, str, float], TokenBucket] = {}
        self._lock = threading.Lock()

    def admit(self, caller: str, rate: float | None, bucket_name: str = "send") -> int | None:
        """None: admitted (a token taken from the caller's bucket of that name); else the seconds
        to wait (Retry-After, at least 1)."""
        per_second = rate or self._default
        now = self._clock()
        key = (caller, bucket_name, per_second)
        with self._lock:
            bucket = self._buckets.get(key)
            if bucket is None:
                limit = RateLimit(per_second=per_second, burst=max(1, math.ceil(per_second)))
                bucket = self._buckets[key] = TokenBucket(limit, now)
            if bucket.reserve_within(now, 0.0) is not None:
                return None
            missing = 1.0 - bucket.available(now)
        return max(1, math.ceil(missing / per_second))
