"""What every local protocol server shares about its scripted answers: per recipient (a device
token, a phone number, an address), the answers of its first, second, ... request, the last one
repeating; a recipient not scripted gets the server's default."""

from __future__ import annotations

import threading
from collections import Counter
from typing import Generic, TypeVar

T = TypeVar("T")


class Script(dict[str, list[T]], Generic[T]):
    """``script[recipient] = [answer, ...]``; ``next(recipient)`` is the answer of its next request
    (thread-safe: the servers answer on their own threads while a test or the demo reads them)."""

    def __init__(self, default: T) -> None:
        super().__init__()
        self.default = default
        self._nth: Counter[str] = Counter()
        self._lock = threading.Lock()

    def next(self, recipient: str) -> T:
        with self._lock:
            nth = self._nth[recipient]
            self._nth[recipient] += 1
            steps = self.get(recipient)
        return steps[min(nth, len(steps) - 1)] if steps else self.default

    def requests_of(self, recipient: str) -> int:
        """How many requests ``recipient`` has had answered from the script so far."""
        with self._lock:
            return self._nth[recipient]
