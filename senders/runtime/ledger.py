"""A worker's records between its consumer and its Kafka commit (pure: no I/O, no clock).

Each record is an entry, kept twice over:

* per partition, in offset order: the offset a worker may commit is the end of the partition's
  contiguous prefix of finished entries, however many finished after it (their records may be
  produced, but a crash makes them come again: the status store then says what was published);
* per user (the worker serves one channel and lane), in arrival order: only the first entry of
  a user is claimed and called, so at most one message of a user is in flight on a channel, and
  a user's later messages wait behind it while other users' go on.

An entry dropped (its partition revoked, or every partition rewound after an aborted
transaction) leaves the partition at once; one whose call is open stays first in its user's
queue until the call has finished, so that the user's next message still waits for it.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass, field
from enum import Enum

from senders.records import Delivery
from senders.runtime.handler import Output, SendJob

TP = tuple[str, int]


class Stage(Enum):
    PENDING = "pending"  # waiting for its turn (its user's earlier message, a free call)
    CLAIMING = "claiming"  # in a claim batch
    WAITING = "waiting"  # claimed by another worker: tried again later
    SENDING = "sending"  # claimed; its call is open or its outcome being recorded
    DONE = "done"  # its records are known


@dataclass(eq=False, slots=True)
class Entry:
    tp: TP
    offset: int
    written_ms: int
    delivery: Delivery | None = None
    stage: Stage = Stage.PENDING
    outputs: list[Output] = field(default_factory=list)
    published: list[tuple[str, int]] = field(default_factory=list)
    produced: bool = False  # its records are in a committed transaction
    dropped: bool = False
    job: SendJob | None = None

    @property
    def user(self) -> str | None:
        return self.delivery.user_id if self.delivery is not None else None


@dataclass(frozen=True, slots=True)
class CommitPlan:
    """What one Kafka transaction carries: the finished entries' records, and per partition the
    offset to commit (only where it moved)."""

    entries: list[Entry]
    offsets: dict[TP, int]

    @property
    def outputs(self) -> list[Output]:
        return [o for e in self.entries for o in e.outputs]

    def __bool__(self) -> bool:
        return bool(self.entries or self.offsets)


class Ledger:
    def __init__(self) -> None:
        self._parts: dict[TP, deque[Entry]] = {}
        self._users: dict[str, deque[Entry]] = {}
        self._ready: deque[Entry] = deque()
        self._committed: dict[TP, int] = {}

    def __len__(self) -> int:
        """Entries held (not yet committed past)."""
        return sum(len(q) for q in self._parts.values())

    @property
    def ready(self) -> int:
        """Entries that could be claimed now (an upper bound: dropped ones leave lazily)."""
        return len(self._ready)

    def add(self, entry: Entry) -> None:
        """A record, in the consumer's order; a DONE one (undecodable, moved on) only waits for
        the commit."""
        self._parts.setdefault(entry.tp, deque()).append(entry)
        if entry.stage is Stage.DONE or entry.user is None:
            entry.stage = Stage.DONE
            return
        queue = self._users.setdefault(entry.user, deque())
        queue.append(entry)
        if len(queue) == 1:
            self._ready.append(entry)

    def take(self, n: int) -> list[Entry]:
        """Up to ``n`` entries to claim, in arrival order (each the first of its user's)."""
        out: list[Entry] = []
        while self._ready and len(out) < n:
            entry = self._ready.popleft()
            if entry.dropped or entry.stage is not Stage.PENDING:
                continue
            entry.stage = Stage.CLAIMING
            out.append(entry)
        return out

    def give_back(self, entries: Iterable[Entry]) -> None:
        """Claimed entries not claimed after all (the batch failed): first in line again."""
        for entry in reversed(list(entries)):
            if not entry.dropped and entry.stage is Stage.CLAIMING:
                entry.stage = Stage.PENDING
                self._ready.appendleft(entry)

    def wait(self, entry: Entry) -> None:
        entry.stage = Stage.WAITING

    def wake(self, entry: Entry) -> None:
        """A waiting entry may be claimed again."""
        if not entry.dropped and entry.stage is Stage.WAITING:
            entry.stage = Stage.PENDING
            self._ready.append(entry)

    def finish(self, entry: Entry, outputs: list[Output], published: list[tuple[str, int]]) -> None:
        """The entry's records are known; its user's next entry may go."""
        entry.stage = Stage.DONE
        entry.outputs, entry.published = outputs, published
        user = entry.user
        queue = self._users.get(user) if user is not None else None
        if queue is None or not queue or queue[0] is not entry:
            return
        queue.popleft()
        while queue and queue[0].dropped and queue[0].stage is not Stage.SENDING:
            queue.popleft()
        if not queue:
            del self._users[user]  # type: ignore[arg-type]
        elif queue[0].stage is Stage.PENDING:
            self._ready.append(queue[0])

    def drop(self, tps: Iterable[TP] | None = None) -> list[Entry]:
        """Forget the entries of these partitions (None: all), as a revoke or a rewind does; their
        committed positions too. Returns them."""
        chosen = list(self._parts) if tps is None else [tp for tp in tps if tp in self._parts]
        gone: list[Entry] = []
        for tp in chosen:
            gone += self._parts.pop(tp)
            self._committed.pop(tp, None)
        if tps is not None:
            for tp in tps:
                self._committed.pop(tp, None)
        else:
            self._committed.clear()
        for entry in gone:
            entry.dropped = True
        for user in {e.user for e in gone if e.user is not None}:
            queue = self._users.get(user)
            if queue is None:
                continue  # the user's entries had all finished
            kept = deque(e for e in queue if not e.dropped or e.stage in (Stage.CLAIMING, Stage.SENDING))
            if not kept:
                del self._users[user]
                continue
            self._users[user] = kept
            if kept[0].stage is Stage.PENDING and kept[0] not in self._ready:
                self._ready.append(kept[0])
        return gone

    def commit_plan(self) -> CommitPlan:
        entries: list[Entry] = []
        offsets: dict[TP, int] = {}
        for tp, queue in self._parts.items():
            end: int | None = None
            prefix = True
            for entry in queue:
                if entry.stage is not Stage.DONE:
                    prefix = False
                    continue
                if not entry.produced:
                    entries.append(entry)
                if prefix:
                    end = entry.offset + 1
            if end is not None and end > self._committed.get(tp, -1):
                offsets[tp] = end
        return CommitPlan(entries, offsets)

    def committed(self, plan: CommitPlan) -> list[tuple[str, int]]:
        """The plan's transaction committed: its entries are produced, the prefixes left behind.
        Returns the (message key, attempt) outcomes now published."""
        published: list[tuple[str, int]] = []
        for entry in plan.entries:
            entry.produced = True
            published += entry.published
        for tp, end in plan.offsets.items():
            self._committed[tp] = end
            queue = self._parts.get(tp)
            while queue and queue[0].offset < end and queue[0].produced:
                queue.popleft()
        return published

    def oldest_waiting_ms(self, topics: Iterable[str]) -> int | None:
        """The timestamp of the oldest record of these topics not finished yet."""
        wanted = set(topics)
        oldest: int | None = None
        for (topic, _), queue in self._parts.items():
            if topic not in wanted:
                continue
            for entry in queue:
                if entry.stage is not Stage.DONE and entry.written_ms > 0:
                    oldest = entry.written_ms if oldest is None else min(oldest, entry.written_ms)
                    break
        return oldest
