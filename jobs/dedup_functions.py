"""Thin Flink adapters over the pure dedup logic in ``operators``.

``PrepareRequest`` decodes each raw record once, resolves its dedup key and picks its shard, or
sends it to the invalid topic. ``DedupShard`` is keyed by shard: it holds each dedup key's latest
accepted request in a MapState, evicts it with event-time timers, and keeps the shard's Bloom
prefilter in keyed state so the filter comes back with every restore and rescale.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from pyflink.common import Row
from pyflink.common.typeinfo import Types
from pyflink.datastream import KeyedProcessFunction, OutputTag, ProcessFunction, RuntimeContext
from pyflink.datastream.state import ListStateDescriptor, MapStateDescriptor, ValueStateDescriptor

from operators import codec, routing
from operators.bloom import BloomConfig, SegmentedBloom
from operators.dedup_key import key_hash, resolve_dedup_key, shard_of
from operators.errors import InvalidRecordError
from operators.records import SourcePosition
from operators.routing import Routed, Topics
from operators.window import (
    NO_WATERMARK,
    Accepted,
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
    ["topic", "key", "value"], [Types.STRING(), Types.PRIMITIVE_ARRAY(Types.BYTE()), Types.PRIMITIVE_ARRAY(Types.BYTE())]
)
#: what the source emits (io.notifydedup.flink.RawKafkaRecordDeserializer)
RAW_TYPE = Types.ROW_NAMED(
    ["topic", "partition", "offset", "value"],
    [Types.STRING(), Types.INT(), Types.LONG(), Types.PRIMITIVE_ARRAY(Types.BYTE())],
)
#: a valid request on its way to its shard
KEYED_TYPE = Types.ROW_NAMED(
    ["shard", "dedup_key", "value"], [Types.INT(), Types.STRING(), Types.PRIMITIVE_ARRAY(Types.BYTE())]
)
INVALID_TAG = OutputTag("invalid", ROUTED_TYPE)

#: In thread mode PyFlink pickles tuple and row state values anyway (and its array converter
#: cannot read a missing map entry), so composite state values are declared as pickled bytes.
_PICKLED = Types.PICKLED_BYTE_ARRAY()
#: eviction timers are rounded up to this grain, so one timer serves many keys
EVICTION_GRAIN_MS = 1_000
#: how far a shard's watermark advances before the new value is written to state
WATERMARK_PERSIST_STEP_MS = 1_000


def _row(routed: Routed) -> Row:
    return Row(routed.topic, routed.key, routed.value)


@dataclass(frozen=True)
class DedupOptions:
    """Everything the operators need, picklable (no secrets)."""

    topics: Topics
    window: WindowConfig
    bloom: BloomConfig
    shards: int
    bloom_snapshot_every: int
    max_future_ms: int


class PrepareRequest(ProcessFunction):  # type: ignore[misc]
    """Raw record -> (shard, dedup key, bytes), or an InvalidRecord on the side output."""

    def __init__(self, options: DedupOptions) -> None:
        self._options = options
        self._invalid: Any = None

    def open(self, runtime_context: RuntimeContext) -> None:
        self._invalid = runtime_context.get_metrics_group().counter("invalid")

    def process_element(self, value: Row, ctx: ProcessFunction.Context) -> Iterator[Any]:
        raw = bytes(value[3])
        try:
            req = codec.decode_request(raw)
            check_not_future(req.event_time, int(time.time() * 1000), self._options.max_future_ms)
            dedup_key = resolve_dedup_key(req)
        except InvalidRecordError as exc:
            self._invalid.inc()
            logger.warning(
                "invalid record", extra={"topic": value[0], "partition": value[1], "offset": value[2]}
            )
            pos = SourcePosition(value[0], value[1], value[2])
            yield INVALID_TAG, _row(routing.invalid_record(raw, exc.reason, pos, self._options.topics))
            return
        yield Row(shard_of(key_hash(dedup_key), self._options.shards), dedup_key, raw)


class DedupShard(KeyedProcessFunction):  # type: ignore[misc]
    """The dedup decision for every key of one shard."""

    def __init__(self, options: DedupOptions) -> None:
        self._o = options
        self._blooms: dict[int, SegmentedBloom] = {}
        self._pending_counts: dict[int, int] = {}
        self._dirty: dict[int, set[int]] = {}
        self._counters: dict[str, Any] = {}
        #: entries in state per shard seen since start (persisted per shard in keys_held)
        self._held: dict[int, int] = {}
        self._newest_event_time = 0
        #: per shard: (highest watermark seen, the value last persisted)
        self._floors: dict[int, list[int]] = {}

    def open(self, runtime_context: RuntimeContext) -> None:
        self._entries = runtime_context.get_map_state(
            MapStateDescriptor("entries", Types.STRING(), _PICKLED)
        )
        self._evictions = runtime_context.get_map_state(
            MapStateDescriptor("evictions", Types.LONG(), _PICKLED)
        )
        self._bloom_segments = runtime_context.get_map_state(
            MapStateDescriptor("bloom_segments", Types.LONG(), _PICKLED)
        )
        self._bloom_pending = runtime_context.get_list_state(
            ListStateDescriptor("bloom_pending", _PICKLED)
        )
        self._bloom_span = runtime_context.get_state(ValueStateDescriptor("bloom_span", Types.LONG()))
        self._held_state = runtime_context.get_state(ValueStateDescriptor("keys_held", Types.LONG()))
        self._floor_state = runtime_context.get_state(ValueStateDescriptor("watermark_floor", Types.LONG()))
        group = runtime_context.get_metrics_group()
        for name in (
            "accepted", "duplicates", "late", "state_reads", "state_reads_skipped",
            "bloom_false_positives", "evicted",
        ):
            self._counters[name] = group.counter(name)
        self._emitted = {t: group.add_group("topic", t).counter("emitted") for t in self._o.topics.outputs()}
        group.gauge("bloom_keys_estimate", lambda: int(sum(b.approx_items() for b in self._blooms.values())))
        group.gauge("bloom_fill_ratio_pct", lambda: int(100 * self._fill_ratio()))
        group.gauge("bloom_bits", lambda: sum(b.size_bits() for b in self._blooms.values()))
        group.gauge("keys_held", lambda: sum(self._held.values()))
        group.gauge("newest_event_time", lambda: self._newest_event_time)

    def _fill_ratio(self) -> float:
        if not self._blooms:
            return 0.0
        return sum(b.fill_ratio() for b in self._blooms.values()) / len(self._blooms)

    # -- the Bloom prefilter, kept in keyed state --------------------------------------------

    def _bloom(self, shard: int) -> SegmentedBloom:
        bloom = self._blooms.get(shard)
        if bloom is not None:
            return bloom
        bloom = SegmentedBloom(self._o.bloom)
        pending = 0
        if self._bloom_span.value() == self._o.bloom.span_ms:
            for seg, data in self._bloom_segments.items():
                bloom.load_segment(seg, bytes(data))
            for seg, key in self._bloom_pending.get():
                bloom.add_to_segment(seg, key_hash(key))
                pending += 1
            self._dirty[shard] = set()
        else:  # no snapshot yet, or one sized differently: rebuild from the entries themselves
            for key, entry in self._entries.items():
                bloom.add(key_hash(key), expiry(Accepted(entry[0], entry[1], entry[2]), self._o.window))
            self._dirty[shard] = set(bloom.segment_ids())
            self._blooms[shard] = bloom
            self._snapshot_bloom(shard, bloom)
        self._blooms[shard] = bloom
        self._pending_counts[shard] = pending
        self._held[shard] = self._held_state.value() or 0
        floor = self._floor_state.value()
        self._floors[shard] = [NO_WATERMARK, NO_WATERMARK] if floor is None else [floor, floor]
        return bloom

    def _watermark(self, shard: int, current: int) -> int:
        """The watermark, never lower than one this shard saw before a restore.

        Flink does not checkpoint watermarks: a restored job starts from none and would take
        requests it once judged late as on time. Each shard keeps the highest watermark it saw
        (persisted every second of advance), so lateness is decided the same way after a
        crash, a restore or a rescale.
        """
        floor = self._floors[shard]
        if current > floor[0]:
            floor[0] = current
            if current - floor[1] >= WATERMARK_PERSIST_STEP_MS:
                floor[1] = current
                self._floor_state.update(current)
        return floor[0]
    def _count_held(self, shard: int, delta: int) -> None:
        self._held[shard] += delta
        self._held_state.update(self._held[shard])

    def _bloom_add(self, shard: int, bloom: SegmentedBloom, key: str, hashed: int, exp: int) -> None:
        seg = bloom.add(hashed, exp)
        self._bloom_pending.add((seg, key))
        self._dirty[shard].add(seg)
        self._pending_counts[shard] += 1
        if self._pending_counts[shard] >= self._o.bloom_snapshot_every:
            self._snapshot_bloom(shard, bloom)

    def _snapshot_bloom(self, shard: int, bloom: SegmentedBloom) -> None:
        live = set(bloom.segment_ids())
        for seg in list(self._bloom_segments.keys()):
            if seg not in live:
                self._bloom_segments.remove(seg)
        for seg in self._dirty[shard] & live:
            self._bloom_segments.put(seg, bloom.save_segment(seg))
        self._bloom_pending.clear()
        self._bloom_span.update(self._o.bloom.span_ms)
        self._dirty[shard] = set()
        self._pending_counts[shard] = 0

    # -- the decision ------------------------------------------------------------------------

    def process_element(self, value: Row, ctx: KeyedProcessFunction.Context) -> Iterator[Row]:
        shard, dedup_key, raw = value[0], value[1], bytes(value[2])
        req = codec.decode_request(raw)  # validated upstream; cannot fail here
        bloom = self._bloom(shard)
        watermark = self._watermark(shard, ctx.timer_service().current_watermark())
        opts = self._o
        if req.event_time > self._newest_event_time:
            self._newest_event_time = req.event_time
        if is_late(req.event_time, watermark, opts.window) and opts.window.late_policy == "side-output":
            self._counters["late"].inc()
            reason = (
                f"event_time {req.event_time} is behind the watermark {watermark}"
                f" minus allowed lateness {opts.window.allowed_lateness_ms} ms"
            )
            yield self._emit(routing.late_notice(req, watermark, reason, opts.topics))
            return
        hashed = key_hash(dedup_key)
        entry: Accepted | None = None
        if bloom.might_contain(hashed):
            self._counters["state_reads"].inc()
            stored = self._entries.get(dedup_key)
            if stored is None:
                self._counters["bloom_false_positives"].inc()
            else:
                entry = Accepted(stored[0], stored[1], stored[2], stored[3])
        else:
            self._counters["state_reads_skipped"].inc()
        decision = decide(
            entry,
            notification_id=req.notification_id,
            event_time=req.event_time,
            window=window_ms(req.dedup_ttl_sec, opts.window),
            watermark=watermark,
            cfg=opts.window,
        )
        state = decision.state
        assert state is not None
        self._entries.put(
            dedup_key, (state.notification_id, state.event_time, state.window_ms, state.occurrences)
        )
        if decision.verdict is Verdict.DUPLICATE:
            assert decision.original is not None
            self._counters["duplicates"].inc()
            yield self._emit(routing.duplicate_notice(req, dedup_key, decision.original, opts.topics))
            return
        self._counters["accepted"].inc()
        if entry is None:  # skipped by the filter, or read and absent: a key new to state
            self._count_held(shard, 1)
        exp = expiry(state, opts.window)
        self._bloom_add(shard, bloom, dedup_key, hashed, exp)
        self._schedule_eviction(ctx, dedup_key, exp)
        for routed in routing.channel_messages(req, dedup_key, opts.topics):
            yield self._emit(routed)

    def _emit(self, routed: Routed) -> Row:
        self._emitted[routed.topic].inc()
        return _row(routed)

    def _schedule_eviction(self, ctx: KeyedProcessFunction.Context, dedup_key: str, exp: int) -> None:
        fire_at = -(-exp // EVICTION_GRAIN_MS) * EVICTION_GRAIN_MS
        due = self._evictions.get(fire_at)
        self._evictions.put(fire_at, [*due, dedup_key] if due else [dedup_key])
        ctx.timer_service().register_event_time_timer(fire_at)

    def on_timer(self, timestamp: int, ctx: KeyedProcessFunction.OnTimerContext) -> Iterator[Row]:
        shard = ctx.get_current_key()
        bloom = self._bloom(shard)
        due = self._evictions.get(timestamp)
        if due:
            for key in due:
                stored = self._entries.get(key)
                if stored is not None and expiry(Accepted(*stored), self._o.window) <= timestamp:
                    self._entries.remove(key)
                    self._counters["evicted"].inc()
                    self._count_held(shard, -1)
            self._evictions.remove(timestamp)
        if bloom.expire(timestamp):
            self._snapshot_bloom(shard, bloom)
        return iter(())
