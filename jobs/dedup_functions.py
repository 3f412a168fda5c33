"""The dedup decision: a thin Flink adapter over the pure logic in ``operators``.

``DedupShard`` is keyed by shard (the JVM resolved each request's dedup key and shard, see
connector/.../ShardedRequests.java). Per shard it keeps, in RocksDB keyed state:

- ``entries``: dedup key -> its latest accepted request (notification id, t0, W0, occurrences);
- ``log_new`` / ``log_old``: ``(expiry, key, fresh)`` of every accepted key, newest first in
  ``log_new``; the eviction index and the Bloom filter's delta in one append-only list;
- ``bloom_segments``: the shard's Bloom filter as of the last fold of ``log_new`` into
  ``log_old``, so a restored or rescaled job rebuilds it exactly on first touch;
- ``meta`` and ``watermark_floor``: the segment size, keys held, and the highest watermark seen.

Eviction is driven by event time: a timer per shard and eviction bucket compacts the log once
the watermark passes the bucket, removing every entry whose ``t0 + W0 + lateness`` is behind it.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from pyflink.common import Row
from pyflink.common.typeinfo import Types
from pyflink.datastream import KeyedProcessFunction, RuntimeContext
from pyflink.datastream.state import ListStateDescriptor, MapStateDescriptor, ValueStateDescriptor

from operators import codec, routing
from operators.bloom import BloomConfig, SegmentedBloom
from operators.dedup_key import key_hash
from operators.errors import InvalidRecordError
from operators.records import SourcePosition
from operators.routing import Topics
from operators.window import (
    NO_WATERMARK,
    Accepted,
    LatePolicy,
    Verdict,
    WindowConfig,
    check_not_future,
    decide,
    expiry,
    is_late,
    window_ms,
)

logger = logging.getLogger(__name__)

#: what the source emits (io.notifydedup.flink.RawKafkaRecordDeserializer)
RAW_TYPE = Types.ROW_NAMED(
    ["topic", "partition", "offset", "value"],
    [Types.STRING(), Types.INT(), Types.LONG(), Types.PRIMITIVE_ARRAY(Types.BYTE())],
)
_BYTES_ARRAY = Types.OBJECT_ARRAY(Types.PRIMITIVE_ARRAY(Types.BYTE()))
#: what the dedup operator receives: one shard's mini-batch (io.notifydedup.flink.ShardBatcher),
#: a column per field of a request. The JVM has parsed and checked each request; its dedup_key
#: is empty when it is not a well-formed NotificationRequest.
BATCH_TYPE = Types.ROW_NAMED(
    ["dedup_key", "event_time", "notification_id", "dedup_ttl_sec", "topic", "partition", "offset", "value"],
    [
        Types.BASIC_ARRAY(Types.STRING()), Types.BASIC_ARRAY(Types.LONG()), Types.BASIC_ARRAY(Types.STRING()),
        Types.BASIC_ARRAY(Types.LONG()), Types.BASIC_ARRAY(Types.STRING()), Types.BASIC_ARRAY(Types.INT()),
        Types.BASIC_ARRAY(Types.LONG()), _BYTES_ARRAY,
    ],
)
#: what the dedup operator emits: one outcome per request of the batch, in order, as columns
#: (io.notifydedup.flink.RouteOutcomes turns each into the Avro records it means, in the JVM)
OUTCOMES_TYPE = Types.ROW_NAMED(
    ["kind", "dedup_key", "value", "text", "time", "occurrence"],
    [
        Types.BASIC_ARRAY(Types.INT()), Types.BASIC_ARRAY(Types.STRING()), _BYTES_ARRAY,
        Types.BASIC_ARRAY(Types.STRING()), Types.BASIC_ARRAY(Types.LONG()), Types.BASIC_ARRAY(Types.INT()),
    ],
)
ACCEPTED, DUPLICATE, LATE, INVALID = 0, 1, 2, 3

#: In thread mode PyFlink pickles tuple and row state values anyway (and its array converter
#: cannot read a missing map entry), so composite state values are declared as pickled bytes.
_PICKLED = Types.PICKLED_BYTE_ARRAY()
#: version of the filter snapshot layout; another version is rebuilt from the entries
BLOOM_FORMAT = 2
#: records, and seconds, between two refreshes of the Bloom level metrics (a refresh counts the
#: set bits of every filter of the subtask)
LEVELS_EVERY = 1_000
LEVELS_MIN_INTERVAL_S = 1.0
#: how far a shard's watermark advances before the new value is written to state
WATERMARK_PERSIST_STEP_MS = 1_000

#: levels, not counts. Reported through counters set to the current value: in thread mode Flink
#: reads a Python gauge from its metrics thread, and calling into the embedded interpreter from
#: there crashed the JVM (SIGSEGV in _PyEval_EvalFrameDefault, seen under the chaos run).
LEVELS = ("keys_held", "bloom_keys_estimate", "bloom_bits", "bloom_fill_ratio_pct", "newest_event_time")

COUNTERS = (
    "accepted", "duplicates", "late", "invalid", "state_reads", "state_reads_skipped",
    "bloom_false_positives", "evicted",
)


@dataclass(frozen=True)
class DedupOptions:
    """Everything the operator needs, picklable (no secrets).

    :param eviction_grain_ms: state is evicted at most this long after its end (a timer per
        shard and grain, not per key)
    :param fold_every: accepted keys per shard between two snapshots of its Bloom filter
    """

    topics: Topics
    window: WindowConfig
    bloom: BloomConfig
    eviction_grain_ms: int
    fold_every: int
    max_future_ms: int


class _Level:
    """A value shown through a Flink counter: ``set`` moves the counter to it."""

    def __init__(self, counter: Any) -> None:
        self._counter = counter
        self._value = 0

    def set(self, value: int) -> None:
        if value != self._value:
            self._counter.inc(value - self._value)
            self._value = value

    def add(self, delta: int) -> None:
        self._counter.inc(delta)
        self._value += delta


@dataclass
class _Shard:
    """What the operator holds in memory for one shard (rebuilt from state after a restore)."""

    bloom: SegmentedBloom
    held: int
    floor: int
    floor_persisted: int
    pending: int
    dirty: set[int]


class _Outcomes:
    """The outcomes of one batch, as the columns of OUTCOMES_TYPE."""

    __slots__ = ("kinds", "keys", "values", "texts", "times", "occurrences")

    def __init__(self) -> None:
        self.kinds: list[int] = []
        self.keys: list[str] = []
        self.values: list[bytes] = []
        self.texts: list[str] = []
        self.times: list[int] = []
        self.occurrences: list[int] = []

    def add(self, kind: int, key: str, value: bytes, text: str = "", at: int = 0, occurrence: int = 0) -> None:
        self.kinds.append(kind)
        self.keys.append(key)
        self.values.append(value)
        self.texts.append(text)
        self.times.append(at)
        self.occurrences.append(occurrence)

    def row(self) -> Row:
        return Row(self.kinds, self.keys, self.values, self.texts, self.times, self.occurrences)


class DedupShard(KeyedProcessFunction):  # type: ignore[misc]
    """The dedup decision for every key of one shard."""

    def __init__(self, options: DedupOptions) -> None:
        self._o = options
        self._shards: dict[int, _Shard] = {}
        self._timers: set[tuple[int, int]] = set()
        self._newest_event_time = 0

    def open(self, runtime_context: RuntimeContext) -> None:
        ctx = runtime_context
        self._entries = ctx.get_map_state(MapStateDescriptor("entries", Types.STRING(), _PICKLED))
        self._log_new = ctx.get_list_state(ListStateDescriptor("log_new", _PICKLED))
        self._log_old = ctx.get_list_state(ListStateDescriptor("log_old", _PICKLED))
        self._bloom_segments = ctx.get_map_state(MapStateDescriptor("bloom_segments", Types.LONG(), _PICKLED))
        self._meta = ctx.get_state(ValueStateDescriptor("meta", _PICKLED))
        self._floor_state = ctx.get_state(ValueStateDescriptor("watermark_floor", Types.LONG()))
        group = ctx.get_metrics_group()
        self._c = {name: group.counter(name) for name in COUNTERS}
        self._levels = {name: _Level(group.counter(name)) for name in LEVELS}
        self._since_levels = 0
        self._levels_at = time.monotonic()

    def _fill_ratio(self) -> float:
        if not self._shards:
            return 0.0
        return sum(s.bloom.fill_ratio() for s in self._shards.values()) / len(self._shards)

    def _report_levels(self) -> None:
        shards = self._shards.values()
        self._levels["bloom_keys_estimate"].set(int(sum(s.bloom.approx_items() for s in shards)))
        self._levels["bloom_bits"].set(sum(s.bloom.size_bits() for s in shards))
        self._levels["bloom_fill_ratio_pct"].set(int(100 * self._fill_ratio()))
        self._levels["newest_event_time"].set(self._newest_event_time)
        self._since_levels = 0
        self._levels_at = time.monotonic()

    # -- a shard's memory, from state ------------------------------------------------------------

    def _shard(self, shard: int, ctx: Any) -> _Shard:
        state = self._shards.get(shard)
        if state is not None:
            return state
        meta = self._meta.value() or {}
        bloom = SegmentedBloom(self._o.bloom)
        floor = self._floor_state.value()
        floor = NO_WATERMARK if floor is None else floor
        state = _Shard(bloom, int(meta.get("held", 0)), floor, floor, 0, set())
        if meta.get("span") == self._o.bloom.span_ms and meta.get("format") == BLOOM_FORMAT:
            for seg, data in self._bloom_segments.items():
                bloom.load_segment(seg, data)
            for exp, key, fresh in self._log_new.get() or ():
                state.dirty.add(bloom.add(key_hash(key), exp))
                state.pending += 1
                state.held += fresh
        else:  # no snapshot, or one with another segment size: rebuild from the entries
            log = []
            for key, stored in self._entries.items():
                exp = expiry(Accepted(*stored), self._o.window)
                bloom.add(key_hash(key), exp)
                log.append((exp, key, 1))
                self._schedule(ctx, shard, exp)
            self._log_old.update(log)
            self._log_new.clear()
            state.held = len(log)
            state.dirty = set(bloom.segment_ids())
            self._snapshot(state)
        self._shards[shard] = state
        self._levels["keys_held"].add(state.held)
        return state

    def _fold(self, state: _Shard) -> None:
        """Move log_new into log_old and write the filter's changed segments."""
        fresh = list(self._log_new.get() or ())
        if fresh:
            self._log_old.add_all(fresh)
            self._log_new.clear()
        self._snapshot(state)

    def _snapshot(self, state: _Shard) -> None:
        live = set(state.bloom.segment_ids())
        for seg in [s for s in self._bloom_segments.keys() if s not in live]:
            self._bloom_segments.remove(seg)
        for seg in state.dirty & live:
            self._bloom_segments.put(seg, state.bloom.save_segment(seg))
        state.dirty = set()
        state.pending = 0
        self._meta.update({"span": self._o.bloom.span_ms, "format": BLOOM_FORMAT, "held": state.held})

    def _watermark(self, state: _Shard, current: int) -> int:
        """The watermark, never lower than one this shard saw before a restore.

        Flink does not checkpoint watermarks: a restored job starts from none and would take
        requests it once judged late as on time. Each shard keeps the highest watermark it saw
        (persisted every second of advance), so lateness is decided the same way after a
        crash, a restore or a rescale.
        """
        if current > state.floor:
            state.floor = current
            if current - state.floor_persisted >= WATERMARK_PERSIST_STEP_MS:
                state.floor_persisted = current
                self._floor_state.update(current)
        return state.floor

    # -- the decision ----------------------------------------------------------------------------

    def process_element(self, batch: Row, ctx: KeyedProcessFunction.Context) -> Iterator[Row]:
        """Decide every request of one shard's mini-batch (io.notifydedup.flink.ShardBatcher), in
        order: one call, one output row (the batch's outcomes), state written once per batch."""
        opts = self._o
        shard = _current_shard(ctx)
        state = self._shard(shard, ctx)
        watermark = self._watermark(state, ctx.timer_service().current_watermark())
        now_ms = int(time.time() * 1000)
        counts = dict.fromkeys((*COUNTERS, "fresh"), 0)
        written: dict[str, tuple[str, int, int, int]] = {}  # entries put in this batch
        logged: list[tuple[int, str, int]] = []  # log_new entries of this batch
        out = _Outcomes()
        keys, times, ids, ttls, values = batch[0], batch[1], batch[2], batch[3], batch[7]
        for i, dedup_key in enumerate(keys):
            event_time, raw = times[i], values[i]
            try:
                if not dedup_key:  # the JVM could not parse it: decode again for the reason
                    codec.decode_request(bytes(raw))
                    raise InvalidRecordError("not a well-formed NotificationRequest")
                check_not_future(event_time, now_ms, opts.max_future_ms)
            except InvalidRecordError as exc:
                counts["invalid"] += 1
                pos = SourcePosition(batch[4][i], batch[5][i], batch[6][i])
                logger.warning("invalid record", extra={"partition": pos.partition, "offset": pos.offset})
                out.add(INVALID, "", routing.invalid_record(bytes(raw), exc.reason, pos, opts.topics).value)
                continue
            if event_time > self._newest_event_time:
                self._newest_event_time = event_time
            if is_late(event_time, watermark, opts.window) and opts.window.late_policy == LatePolicy.SIDE_OUTPUT:
                counts["late"] += 1
                reason = (
                    f"event_time {event_time} is behind the watermark {watermark}"
                    f" minus allowed lateness {opts.window.allowed_lateness_ms} ms"
                )
                out.add(LATE, dedup_key, raw, reason, watermark)
                continue
            hashed = key_hash(dedup_key)
            entry: Accepted | None = None
            if state.bloom.might_contain(hashed):
                counts["state_reads"] += 1
                stored = written.get(dedup_key)
                if stored is None:
                    stored = self._entries.get(dedup_key)
                if stored is None:
                    counts["bloom_false_positives"] += 1
                else:
                    entry = Accepted(*stored)
            else:
                counts["state_reads_skipped"] += 1
            decision = decide(
                entry,
                notification_id=ids[i],
                event_time=event_time,
                window=window_ms(ttls[i], opts.window),
                watermark=watermark,
                cfg=opts.window,
            )
            new = decision.state
            assert new is not None
            written[dedup_key] = (new.notification_id, new.event_time, new.window_ms, new.occurrences)
            if decision.verdict is Verdict.DUPLICATE:
                original = decision.original
                assert original is not None
                counts["duplicates"] += 1
                out.add(DUPLICATE, dedup_key, raw, original.notification_id, original.event_time, original.occurrences)
                continue
            counts["accepted"] += 1
            exp = expiry(new, opts.window)
            fresh = entry is None
            state.dirty.add(state.bloom.add(hashed, exp))
            logged.append((exp, dedup_key, int(fresh)))
            state.held += fresh
            counts["fresh"] += fresh
            self._schedule(ctx, shard, exp)
            out.add(ACCEPTED, dedup_key, raw)
        if written:
            self._entries.put_all(written)
        if logged:
            self._log_new.add_all(logged)
            state.pending += len(logged)
            if state.pending >= opts.fold_every:
                self._fold(state)
        self._count(counts)
        yield out.row()

    def _count(self, counts: dict[str, int]) -> None:
        fresh = counts.pop("fresh")
        for name, n in counts.items():
            if n:
                self._c[name].inc(n)
        self._levels["keys_held"].add(fresh)
        self._levels["newest_event_time"].set(self._newest_event_time)
        self._since_levels += sum(counts.values())
        if self._since_levels >= LEVELS_EVERY and time.monotonic() - self._levels_at >= LEVELS_MIN_INTERVAL_S:
            self._report_levels()

    def _schedule(self, ctx: Any, shard: int, exp: int) -> None:
        """One eviction timer per shard and grain (registering it again is a no-op in Flink)."""
        grain = self._o.eviction_grain_ms
        fire_at = -(-exp // grain) * grain
        if (shard, fire_at) not in self._timers:
            self._timers.add((shard, fire_at))
            ctx.timer_service().register_event_time_timer(fire_at)

    # -- eviction --------------------------------------------------------------------------------

    def on_timer(self, timestamp: int, ctx: KeyedProcessFunction.OnTimerContext) -> Iterator[Row]:
        """The watermark passed ``timestamp``: forget every key whose window ended by then."""
        shard = _current_shard(ctx)
        state = self._shard(shard, ctx)
        self._timers.discard((shard, timestamp))
        survivors: dict[str, tuple[int, str, int]] = {}
        for item in [*(self._log_old.get() or ()), *(self._log_new.get() or ())]:
            exp, key = item[0], item[1]
            if exp > timestamp:
                if key not in survivors or survivors[key][0] < exp:
                    survivors[key] = item
                continue
            stored = self._entries.get(key)
            if stored is not None and expiry(Accepted(*stored), self._o.window) <= timestamp:
                self._entries.remove(key)
                self._c["evicted"].inc()
                state.held -= 1
                self._levels["keys_held"].add(-1)
        self._log_old.update(list(survivors.values()))
        self._log_new.clear()
        state.bloom.expire(timestamp)
        self._snapshot(state)
        self._report_levels()
        return iter(())


def _current_shard(ctx: Any) -> int:
    key = ctx.get_current_key()
    return int(key[0]) if isinstance(key, (Row, tuple, list)) else int(key)
