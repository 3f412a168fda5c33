"""Users' profiles as the accept path reads them (for 404 and queued/skipped): a read kept for a
short time (``senders.profile_cache_ttl_ms``, what the senders allow themselves), dropped at once
when this API changes or erases the profile. A user without a profile is never kept: one just
created is found at once."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

from senders.store.profiles import ProfileRead


class ProfileReads:
    def __init__(self, ttl_ms: int, clock: Callable[[], float] = time.monotonic, max_entries: int = 50_000) -> None:
        self._ttl_s = ttl_ms / 1000
        self._clock = clock
        self._max = max_entries
        self._entries: dict[str, tuple[float, ProfileRead]] = {}
        self._lock = threading.Lock()

    def get(self, user_id: str) -> ProfileRead | None:
        with self._lock:
            hit = self._entries.get(user_id)
        if hit is None or hit[0] <= self._clock():
            return None
        return hit[1]

    def put(self, user_id: str, read: ProfileRead) -> None:
        if not read.exists or self._ttl_s <= 0:
            return
        now = self._clock()
        with self._lock:
            if len(self._entries) >= self._max:
                self._entries = {k: v for k, v in self._entries.items() if v[0] > now}
                if len(self._entries) >= self._max:
                    self._entries.clear()
            self._entries[user_id] = (now + self._ttl_s, read)

    def drop(self, user_id: str) -> None:
        with self._lock:
            self._entries.pop(user_id, None)
