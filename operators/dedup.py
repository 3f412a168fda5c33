"""One shard's mini-batch, decided: the per-batch loop of the dedup operator as a pure function.

The Flink adapter (jobs/dedup_function.py) gives :func:`decide_batch` the batch's columns, the
shard's memory (:class:`ShardMemory`: its Bloom prefilter and what it holds) and a
:class:`ShardStore` over the shard's keyed state; it gets back one verdict per request and the
writes to make. Lateness against the watermark, the Bloom prefilter, the window rule
(``operators.window``) and the eviction log are decided here, so they are tested without Flink
against the reference model (tests/operators/test_dedup.py).

State per shard (kept by the adapter in RocksDB keyed state):

- entries: dedup key -> its latest accepted request (:class:`~operators.window.Accepted`);
- the eviction log: ``(expiry, key, fresh)`` of every acceptance, the Bloom filter's delta too;
- the Bloom filter as of its last snapshot, and how many keys the shard holds.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Protocol

from operators.bloom import BloomConfig, ShardFilter
from operators.contract import contract
from operators.dedup_key import key_hash
from operators.metric_names import DECISION_COUNTERS
from operators.window import Accepted, LatePolicy, Verdict, WindowConfig, decide, expiry, is_late, window_ms

ACCEPTED = contract().outcome("accepted")
DUPLICATE = contract().outcome("duplicate")
LATE = contract().outcome("late")

#: one acceptance in the eviction log: (expiry, dedup key, 1 when the key was not held before)
LogItem = tuple[int, str, int]


@dataclass(frozen=True, slots=True)
class DedupOptions:
    """Everything the decision needs (picklable: the operator is shipped to the TaskManagers).

    :param window: the dedup rule
    :param bloom: sizing of each shard's prefilter
    :param eviction_grain_ms: state is evicted at most this long after its end (a timer per
        shard and grain, not per key)
    :param fold_every: acceptances per shard between two snapshots of its Bloom filter (the log
        holds those since, to replay into the filter on restore)
    """

    window: WindowConfig
    bloom: BloomConfig
    eviction_grain_ms: int
    fold_every: int

    def timer_for(self, exp: int) -> int:
        """The eviction timer that covers an entry expiring at ``exp``."""
        grain = self.eviction_grain_ms
        return -(-exp // grain) * grain


class ShardStore(Protocol):
    """One shard's keyed state, as the decision reads it."""

    def get(self, key: str) -> Accepted | None:
        """The key's latest accepted request (one state read), or None."""


@dataclass(slots=True)
class ShardMemory:
    """What the operator holds in memory for one shard (rebuilt from state after a restore).

    :param bloom: the prefilter
    :param held: keys the shard holds in state
    :param pending: acceptances logged since the filter's last snapshot
    :param dirty: the filter changed since its last snapshot
    """

    bloom: ShardFilter
    held: int = 0
    pending: int = 0
    dirty: bool = False

    @classmethod
    def empty(cls, cfg: BloomConfig) -> ShardMemory:
        return cls(ShardFilter(cfg))

    def remember(self, key: str, fresh: bool) -> None:
        self.bloom.add(key_hash(key))
        self.dirty = True
        self.held += fresh

    def refilter(self, keys: Iterable[str], cfg: BloomConfig) -> None:
        """A new filter of exactly these keys (the shard's live ones), sized for them."""
        distinct = set(keys)
        self.bloom = ShardFilter.build(cfg, (key_hash(k) for k in distinct), len(distinct))
        self.dirty = True


@dataclass(slots=True)
class Verdicts:
    """One verdict per request of a batch, as the columns of the contract's ``boundary.verdicts``."""

    outcome: list[int] = field(default_factory=list)
    original_notification_id: list[str | None] = field(default_factory=list)
    first_seen_event_time: list[int | None] = field(default_factory=list)
    occurrence: list[int | None] = field(default_factory=list)
    watermark: list[int | None] = field(default_factory=list)

    def add(
        self,
        outcome: int,
        original: Accepted | None = None,
        watermark: int | None = None,
    ) -> None:
        self.outcome.append(outcome)
        self.original_notification_id.append(original.notification_id if original else None)
        self.first_seen_event_time.append(original.event_time if original else None)
        self.occurrence.append(original.occurrences if original else None)
        self.watermark.append(watermark)

    def columns(self) -> list[list[object]]:
        """The columns in the contract's order."""
        return [list(getattr(self, c.name)) for c in contract().verdict_columns]


@dataclass(slots=True)
class BatchResult:
    """The verdicts of a batch and the writes they imply.

    :param written: entries to put (the latest of each key in the batch)
    :param logged: acceptances to append to the eviction log, in order
    :param timers: eviction timers to register
    :param counts: per outcome and prefilter result, for the metrics
    """

    verdicts: Verdicts
    written: dict[str, Accepted]
    logged: list[LogItem]
    timers: set[int]
    counts: dict[str, int]


#: what a batch counts: the decision's metrics (operators/metric_names.py), and the keys new to state
COUNTS = (*DECISION_COUNTERS, "fresh")


def decide_batch(
    *,
    dedup_keys: Sequence[str],
    event_times: Sequence[int],
    notification_ids: Sequence[str],
    ttls: Sequence[int | None],
    watermark: int,
    memory: ShardMemory,
    store: ShardStore,
    opts: DedupOptions,
) -> BatchResult:
    """Decide every request of one shard's batch, in order, against one watermark.

    A request behind the watermark (less the allowed lateness) is late, and with the side-output
    policy leaves state alone. Otherwise the prefilter says whether the key may be in state; only
    a "maybe" reads it (a key written earlier in the same batch is read from the batch). The
    window rule decides new or duplicate; a new request is remembered (entry, log, filter, timer).
    """
    window = opts.window
    verdicts = Verdicts()
    written: dict[str, Accepted] = {}
    logged: list[LogItem] = []
    timers: set[int] = set()
    counts = dict.fromkeys(COUNTS, 0)
    side_output = window.late_policy == LatePolicy.SIDE_OUTPUT
    for i, key in enumerate(dedup_keys):
        event_time = event_times[i]
        if side_output and is_late(event_time, watermark, window):
            counts["late"] += 1
            verdicts.add(LATE, watermark=watermark)
            continue
        hashed = key_hash(key)
        entry: Accepted | None = None
        if memory.bloom.might_contain(hashed):
            counts["state_reads"] += 1
            entry = written.get(key) or store.get(key)
            if entry is None:
                counts["bloom_false_positives"] += 1
        else:
            counts["state_reads_skipped"] += 1
        decision = decide(
            entry, notification_id=notification_ids[i], event_time=event_time, window=window_ms(ttls[i], window)
        )
        written[key] = decision.state
        if decision.verdict is Verdict.DUPLICATE:
            counts["duplicates"] += 1
            verdicts.add(DUPLICATE, original=decision.state)
            continue
        counts["accepted"] += 1
        exp = expiry(decision.state, window)
        fresh = entry is None
        memory.bloom.add(hashed)
        memory.dirty = True
        memory.held += fresh
        counts["fresh"] += fresh
        logged.append((exp, key, int(fresh)))
        timers.add(opts.timer_for(exp))
        verdicts.add(ACCEPTED)
    memory.pending += len(logged)
    return BatchResult(verdicts, written, logged, timers, counts)


@dataclass(slots=True)
class Eviction:
    """What an eviction timer leaves: the log's survivors and the keys to remove from state."""

    survivors: list[LogItem]
    evicted: list[str]


def evict(log: Iterable[LogItem], store: ShardStore, timestamp: int, window: WindowConfig) -> Eviction:
    """The watermark passed ``timestamp``: every key whose latest acceptance expired by then goes.

    The log holds every acceptance still inside its window. A key accepted again keeps its entry
    of the latest acceptance in processing order, whose expiry can be earlier than an older one's
    (an out-of-order repeat far behind): so every unexpired item survives, and a key is evicted
    when its entry itself has expired, whichever item brought the timer.
    """
    survivors: dict[LogItem, None] = {}
    evicted: dict[str, None] = {}
    for item in log:
        exp, key = item[0], item[1]
        if exp > timestamp:
            survivors[item] = None
            continue
        if key in evicted:
            continue
        stored = store.get(key)
        if stored is not None and expiry(stored, window) <= timestamp:
            evicted[key] = None
    return Eviction(list(survivors), list(evicted))


def rebuild_memory(entries: Iterable[tuple[str, Accepted]], opts: DedupOptions) -> tuple[ShardMemory, list[LogItem]]:
    """A shard's memory and eviction log rebuilt from its entries alone (no usable filter snapshot)."""
    log = [(expiry(stored, opts.window), key, 1) for key, stored in entries]
    memory = ShardMemory.empty(opts.bloom)
    memory.refilter((key for _, key, _ in log), opts.bloom)
    memory.held = len(log)
    return memory, log
