"""Users' profiles as the accept path reads them (for 404 and queued/skipped, ``api.accept.Reach``):
a read kept for a short time (``senders.profile_cache_ttl_ms``, what the senders allow themselves), dropped at once
when this API changes or erases the profile. A user without a profile is never kept: one just
created is found at once."""

from __future__ import annotations

import time
from collections.abc import Callable

from api.accept import Reach
from api.expiring import Expiring


class ProfileReads:
    def __init__(self, ttl_ms: int, clock: Callable[[], float] = time.monotonic, max_entries: int = 50_000) -> None:
        self._reads: Expiring[str, Reach] = Expiring(ttl_ms / 1000, clock, max_entries)

    def get(self, user_id: str) -> Reach | None:
        return self._reads.get(user_id)

    def put(self, user_id: str, read: Reach) -> None:
        if read.exists:
            self._reads.put(user_id, read)

    def drop(self, user_id: str) -> None:
        self._reads.drop(user_id)
