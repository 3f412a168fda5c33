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
from operators.routing import Routed, Topics
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

#: what the sink receives: topic, Kafka key, Avro value
ROUTED_TYPE = Types.ROW_NAMED(
    ["topic", "key", "value"],
    [Types.STRING(), Types.PRIMITIVE_ARRAY(Types.BYTE()), Types.PRIMITIVE_ARRAY(Types.BYTE())],
)
#: what the source emits (io.notifydedup.flink.RawKafkaRecordDeserializer)
RAW_TYPE = Types.ROW_NAMED(
    ["topic", "partition", "offset", "value"],
    [Types.STRING(), Types.INT(), Types.LONG(), Types.PRIMITIVE_ARRAY(Types.BYTE())],
)
#: what reaches a shard (io.notifydedup.flink.ShardedRequests.payloadType)
SHARDED_TYPE = Types.ROW_NAMED(
    ["dedup_key", "topic", "partition", "offset", "value"],
    [Types.STRING(), Types.STRING(), Types.INT(), Types.LONG(), Types.PRIMITIVE_ARRAY(Types.BYTE())],
)

#: In thread mode PyFlink pickles tuple and row state values anyway (and its array converter
#: cannot read a missing map entry), so composite state values are declared as pickled bytes.
_PICKLED = Types.PICKLED_BYTE_ARRAY()
#: version of the filter snapshot layout; another version is rebuilt from the entries
BLOOM_FORMAT = 2
#: records between two refreshes of the level metrics
LEVELS_EVERY = 1_000
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


def _row(routed: Routed) -> Row:
    return Row(routed.topic, routed.key, routed.value)


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
        self._emitted = {t: group.add_group("topic", t).counter("emitted") for t in self._o.topics.outputs()}
        self._levels = {name: _Level(group.counter(name)) for name in LEVELS}
        self._since_levels = 0

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

    def process_element(self, value: Row, ctx: KeyedProcessFunction.Context) -> Iterator[Row]:
        dedup_key, raw = value[0], bytes(value[4])
        opts = self._o
        try:
            if not dedup_key:
                codec.decode_request(raw)  # raises with the reason
                raise InvalidRecordError("not a well-formed NotificationRequest")
            req = codec.decode_request(raw)
            check_not_future(req.event_time, int(time.time() * 1000), opts.max_future_ms)
        except InvalidRecordError as exc:
            self._c["invalid"].inc()
            logger.warning("invalid record", extra={"partition": value[2], "offset": value[3]})
            pos = SourcePosition(value[1], value[2], value[3])
            yield self._emit(routing.invalid_record(raw, exc.reason, pos, opts.topics))
            return
        shard = _current_shard(ctx)
        state = self._shard(shard, ctx)
        self._since_levels += 1
        if self._since_levels >= LEVELS_EVERY:
            self._report_levels()
        watermark = self._watermark(state, ctx.timer_service().current_watermark())
        if req.event_time > self._newest_event_time:
            self._newest_event_time = req.event_time
            self._levels["newest_event_time"].set(req.event_time)
        if is_late(req.event_time, watermark, opts.window) and opts.window.late_policy == LatePolicy.SIDE_OUTPUT:
            self._c["late"].inc()
            reason = (
                f"event_time {req.event_time} is behind the watermark {watermark}"
                f" minus allowed lateness {opts.window.allowed_lateness_ms} ms"
            )
            yield self._emit(routing.late_notice(req, watermark, reason, opts.topics))
            return
        hashed = key_hash(dedup_key)
        entry: Accepted | None = None
        if state.bloom.might_contain(hashed):
            self._c["state_reads"].inc()
            stored = self._entries.get(dedup_key)
            if stored is None:
                self._c["bloom_false_positives"].inc()
            else:
                entry = Accepted(*stored)
        else:
            self._c["state_reads_skipped"].inc()
        decision = decide(
            entry,
            notification_id=req.notification_id,
            event_time=req.event_time,
            window=window_ms(req.dedup_ttl_sec, opts.window),
            watermark=watermark,
            cfg=opts.window,
        )
        new = decision.state
        assert new is not None
        self._entries.put(dedup_key, (new.notification_id, new.event_time, new.window_ms, new.occurrences))
        if decision.verdict is Verdict.DUPLICATE:
            assert decision.original is not None
            self._c["duplicates"].inc()
            yield self._emit(routing.duplicate_notice(req, dedup_key, decision.original, opts.topics))
            return
        self._c["accepted"].inc()
        self._remember(ctx, shard, state, dedup_key, hashed, expiry(new, opts.window), fresh=entry is None)
        for routed in routing.channel_messages(req, dedup_key, opts.topics):
            yield self._emit(routed)

    def _remember(
        self, ctx: KeyedProcessFunction.Context, shard: int, state: _Shard, key: str, hashed: int,
        exp: int, fresh: bool,
    ) -> None:
        """File a newly accepted key: Bloom filter, log, eviction timer."""
        state.dirty.add(state.bloom.add(hashed, exp))
        self._log_new.add((exp, key, int(fresh)))
        if fresh:
            state.held += 1
            self._levels["keys_held"].add(1)
        state.pending += 1
        self._schedule(ctx, shard, exp)
        if state.pending >= self._o.fold_every:
            self._fold(state)

    def _schedule(self, ctx: Any, shard: int, exp: int) -> None:
        """One eviction timer per shard and grain (registering it again is a no-op in Flink)."""
        grain = self._o.eviction_grain_ms
        fire_at = -(-exp // grain) * grain
        if (shard, fire_at) not in self._timers:
            self._timers.add((shard, fire_at))
            ctx.timer_service().register_event_time_timer(fire_at)

    def _emit(self, routed: Routed) -> Row:
        self._emitted[routed.topic].inc()
        return _row(routed)

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
