"""The dedup rule in process memory: a map plus an expiry queue per shard, one lock per shard.

>>> dedup = MemoryDedup()
>>> dedup.should_send("order-7:shipped", now_ms=1_000)
True
>>> dedup.should_send("order-7:shipped", now_ms=2_000)
False

``now_ms`` is the time the rule is measured in: the request's event time, or the wall clock
where the caller has none. Memory is bounded by the window: a key is forgotten once the newest
time seen by its shard (or given to :meth:`MemoryDedup.advance`) passes the end of the window of
its latest accepted request; a request older than that is judged against what is left (the
job's best-effort policy for late requests). With ``hashed=True`` a key is held as its 64-bit hash
(Python's ``hash``, stable within the process) instead of the string: less memory, and a false
"repeat" for two keys with the same hash, about one in 2^64 per pair; the original's id is then
not kept either.
"""

from __future__ import annotations

import heapq
import threading
from collections import deque
from dataclasses import dataclass

from operators.window import WindowConfig, window_ms

#: the latest accepted request of a key: (notification id or None, t0, W0, occurrences); a tuple
#: of atomic values, so the garbage collector stops tracking it (a million lists slow every
#: collection down)
_Entry = tuple[str | None, int, int, int]
_NEVER = 2**63


@dataclass(frozen=True, slots=True)
class Check:
    """What the rule said about one request.

    :param new: send it (False: a repeat within the window of ``original_notification_id``)
    :param original_notification_id: for a repeat, the accepted request it repeats (None when
        keys are hashed)
    :param first_seen_ms: for a repeat, that request's time
    :param occurrence: for a repeat, 2 for the first repeat, 3 for the next, ...
    """

    new: bool
    original_notification_id: str | None = None
    first_seen_ms: int | None = None
    occurrence: int | None = None


_NEW = Check(True)


class _Shard:
    """One map and its expiry queues: a FIFO per window length, in which an acceptance costs an
    append while times rise (each FIFO then stays in expiry order), and a heap for the
    acceptances that come out of order, so none is forgotten late or early."""

    __slots__ = ("entries", "queues", "unordered", "next_end", "horizon", "lock")

    def __init__(self) -> None:
        self.entries: dict[object, _Entry] = {}
        self.queues: dict[int, deque[tuple[int, object]]] = {}
        self.unordered: list[tuple[int, object]] = []
        self.next_end = _NEVER
        self.horizon = -(2**63)
        self.lock = threading.Lock()

    def remember(self, key: object, entry: _Entry) -> None:
        self.entries[key] = entry
        end = entry[1] + entry[2]
        queue = self.queues.get(entry[2])
        if queue is None:
            queue = self.queues[entry[2]] = deque()
        if queue and queue[-1][0] > end:
            heapq.heappush(self.unordered, (end, key))
        else:
            queue.append((end, key))
        if end < self.next_end:
            self.next_end = end

    def evict(self, horizon: int) -> int:
        """Forget every key whose latest acceptance's window ended by ``horizon``."""
        entries, n, next_end = self.entries, 0, _NEVER
        for queue in (*self.queues.values(), None):
            while True:
                if queue is None:
                    if not self.unordered or self.unordered[0][0] > horizon:
                        break
                    end, key = heapq.heappop(self.unordered)
                else:
                    if not queue or queue[0][0] > horizon:
                        break
                    end, key = queue.popleft()
                entry = entries.get(key)
                if entry is not None and entry[1] + entry[2] == end:  # still that acceptance
                    del entries[key]
                    n += 1
            front = self.unordered[0][0] if queue is None and self.unordered else queue[0][0] if queue else _NEVER
            next_end = min(next_end, front)
        self.next_end = next_end
        return n


class MemoryDedup:
    """The job's window rule in memory, safe to share between threads.

    :param window: the windows (a request's ``ttl_sec`` clamped as the job clamps ``dedup_ttl_sec``)
    :param shards: independent maps, each behind its own lock (a power of two)
    :param hashed: hold each key as its 64-bit hash instead of the string
    """

    def __init__(self, window: WindowConfig | None = None, *, shards: int = 16, hashed: bool = False) -> None:
        if shards < 1 or shards & (shards - 1):
            raise ValueError("shards must be a power of two")
        self.window = window or WindowConfig()
        self.hashed = hashed
        self._mask = shards - 1
        self._shards = [_Shard() for _ in range(shards)]
        self._default_ms = self.window.default_window_ms

    def should_send(self, dedup_key: str, now_ms: int, *, notification_id: str | None = None,
                    ttl_sec: int | None = None) -> bool:
        """True for a new request (send it), False for a repeat within the window."""
        return self._repeat(dedup_key, notification_id or dedup_key, now_ms, ttl_sec) is None

    def check(self, dedup_key: str, notification_id: str, event_time_ms: int, *,
              ttl_sec: int | None = None) -> Check:
        """The rule's verdict on one request, with the original it repeats."""
        entry = self._repeat(dedup_key, notification_id, event_time_ms, ttl_sec)
        return _NEW if entry is None else Check(False, entry[0], entry[1], entry[3])

    def _repeat(self, dedup_key: str, notification_id: str, t: int, ttl_sec: int | None) -> _Entry | None:
        """The original this request repeats (with the repeat counted), or None: it is new, and
        now the key's latest accepted request."""
        h = hash(dedup_key)
        shard = self._shards[h & self._mask]
        key: object = h if self.hashed else dedup_key
        with shard.lock:
            if t > shard.horizon:
                shard.horizon = t
            if shard.next_end <= shard.horizon:
                shard.evict(shard.horizon)
            entry = shard.entries.get(key)
            if entry is not None and -entry[2] < t - entry[1] < entry[2]:  # |t - t0| < W0
                shard.entries[key] = entry = (entry[0], entry[1], entry[2], entry[3] + 1)
                return entry
            w = self._default_ms if ttl_sec is None else window_ms(ttl_sec, self.window)
            shard.remember(key, (None if self.hashed else notification_id, t, w, 1))
            return None

    def advance(self, now_ms: int) -> int:
        """Forget, in every shard, each key whose window ended by ``now_ms``; returns how many."""
        n = 0
        for shard in self._shards:
            with shard.lock:
                shard.horizon = max(shard.horizon, now_ms)
                n += shard.evict(shard.horizon)
        return n

    def __len__(self) -> int:
        """Keys held."""
        return sum(len(s.entries) for s in self._shards)
