"""A small map whose entries expire: kept for ``ttl_s``, at most ``max_entries`` (when full, the
expired entries go, and if it is still full, all of them). The API's caches of verified tokens
and of profile reads."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Generic, TypeVar

K = TypeVar("K")
V = TypeVar("V")


class Expiring(Generic[K, V]):
    def __init__(self, ttl_s: float, clock: Callable[[], float] = time.monotonic, max_entries: int = 10_000) -> None:
        self._ttl_s = ttl_s
        self._clock = clock
        self._max = max_entries
        self._entries: dict[K, tuple[float, V]] = {}
        self._lock = threading.Lock()

    def get(self, key: K) -> V | None:
        found = self.entry(key)
        return None if found is None else found[0]

    def entry(self, key: K) -> tuple[V, float] | None:
        """The value and the seconds it has left; None when there is none, or it expired."""
        with self._lock:
            hit = self._entries.get(key)
        if hit is None:
            return None
        left = hit[0] - self._clock()
        return None if left <= 0 else (hit[1], left)

    def put(self, key: K, value: V) -> None:
        if self._ttl_s <= 0:
            return
        now = self._clock()
        with self._lock:
            if len(self._entries) >= self._max:
                self._entries = {k: v for k, v in self._entries.items() if v[0] > now}
                if len(self._entries) >= self._max:
                    self._entries.clear()
            self._entries[key] = (now + self._ttl_s, value)

    def drop(self, key: K) -> None:
        with self._lock:
            self._entries.pop(key, None)
