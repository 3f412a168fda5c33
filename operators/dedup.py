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

from array import array
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Protocol

from operators.bloom import BloomConfig, ShardFilter
from operators.contract import contract
from operators.dedup_key import key_hash
from operators.metric_names import DECISION_COUNTERS
from operators.window import MIN_WINDOW_MS, NO_WATERMARK, Accepted, LatePolicy, WindowConfig, expiry

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
    :param hashes: the key hashes in the filter (8 bytes each), to rebuild it larger without
        reading state; None after a restore until the shard's log is read once
    """

    bloom: ShardFilter
    held: int = 0
    pending: int = 0
    dirty: bool = False
    hashes: array[int] | None = field(default_factory=lambda: array("q"))

    @classmethod
    def empty(cls, cfg: BloomConfig) -> ShardMemory:
        return cls(ShardFilter(cfg))

    def remember(self, key: str, fresh: bool) -> None:
        self.add(key_hash(key), fresh)

    def add(self, hashed: int, fresh: bool) -> None:
        self.bloom.add(hashed)
        if self.hashes is not None:
            self.hashes.append(hashed)
        self.dirty = True
        self.held += fresh

    def refilter(self, keys: Iterable[str], cfg: BloomConfig) -> None:
        """A new filter of exactly these keys (the shard's live ones), sized for them."""
        self.rehash(array("q", {key_hash(k) for k in keys}), cfg)

    def rehash(self, hashes: array[int], cfg: BloomConfig) -> None:
        """A new filter of these distinct key hashes, sized for them."""
        self.bloom = ShardFilter.build(cfg, hashes, len(hashes))
        self.hashes = hashes
        self.dirty = True

    def grow(self, cfg: BloomConfig) -> bool:
        """The filter outgrew its size: rebuild it from the hashes in memory (False: not in memory)."""
        if self.hashes is None:
            return False
        self.rehash(array("q", set(self.hashes)), cfg)
        return True


@dataclass(slots=True)
class Verdicts:
    """One verdict per request of a batch, as the columns of the contract's ``boundary.verdicts``."""

    outcome: list[int] = field(default_factory=list)
    original_notification_id: list[str | None] = field(default_factory=list)
    first_seen_event_time: list[int | None] = field(default_factory=list)
    occurrence: list[int | None] = field(default_factory=list)
    watermark: list[int | None] = field(default_factory=list)
    #: the decision's span of a traced request (the channel messages continue it), else None
    traceparent: list[str | None] = field(default_factory=list)

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
        self.traceparent.append(None)

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
    key_hashes: Sequence[int],
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
    window rule (``operators.window``'s docstring; ``is_late``, ``window_ms`` and ``expiry`` are
    spelled out here, on plain tuples, because this loop runs for every request) decides new or
    duplicate; a new request is remembered (entry, log, filter, timer).
    """
    window = opts.window
    default_w, max_w, lateness = window.default_window_ms, window.max_window_ms, window.allowed_lateness_ms
    late_before = watermark - lateness if window.late_policy == LatePolicy.SIDE_OUTPUT else NO_WATERMARK
    if watermark == NO_WATERMARK:
        late_before = NO_WATERMARK
    grain = opts.eviction_grain_ms
    outcome: list[int] = []
    original_id: list[str | None] = []
    first_seen: list[int | None] = []
    occurrence: list[int | None] = []
    late_at: list[int | None] = []
    written: dict[str, Accepted] = {}
    logged: list[LogItem] = []
    timers: set[int] = set()
    late = reads = skipped = false_positives = duplicates = fresh_keys = 0
    contains = memory.bloom.might_contain
    read = store.get
    for i, key in enumerate(dedup_keys):
        t = event_times[i]
        if t < late_before:
            late += 1
            outcome.append(LATE)
            original_id.append(None)
            first_seen.append(None)
            occurrence.append(None)
            late_at.append(watermark)
            continue
        hashed = key_hashes[i]
        entry = None
        if contains(hashed):
            reads += 1
            entry = written.get(key) or read(key)
            if entry is None:
                false_positives += 1
        else:
            skipped += 1
        if entry is not None and -entry[2] < t - entry[1] < entry[2]:  # |t - t0| < W0
            duplicates += 1
            written[key] = entry = Accepted(entry[0], entry[1], entry[2], entry[3] + 1)
            outcome.append(DUPLICATE)
            original_id.append(entry[0])
            first_seen.append(entry[1])
            occurrence.append(entry[3])
            late_at.append(None)
            continue
        ttl = ttls[i]
        w = default_w if ttl is None else min(max(ttl * 1000, MIN_WINDOW_MS), max_w)
        written[key] = Accepted(notification_ids[i], t, w)
        exp = t + w + lateness
        fresh = entry is None
        memory.add(hashed, fresh)
        fresh_keys += fresh
        logged.append((exp, key, int(fresh)))
        timers.add(-(-exp // grain) * grain)
        outcome.append(ACCEPTED)
        original_id.append(None)
        first_seen.append(None)
        occurrence.append(None)
        late_at.append(None)
    memory.pending += len(logged)
    # in the order of DECISION_COUNTERS (operators/metric_names.py), then the keys new to state
    values = (len(logged), duplicates, late, reads, skipped, false_positives, fresh_keys)
    counts = dict(zip(COUNTS, values, strict=True))
    verdicts = Verdicts(outcome, original_id, first_seen, occurrence, late_at, [None] * len(outcome))
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
