"""The dedup operator: a thin Flink adapter over ``operators.dedup``.

``DedupShard`` is keyed by shard (the JVM resolved each request's dedup key and shard where it was
read, see connector/.../RequestDeserializer.java) and called once per mini-batch with the columns
the decision needs (``boundary.batch`` of schemas/contract.json); it answers with one row of
verdict columns (``boundary.verdicts``). It never sees a request's bytes: the JVM parsed them,
and routes and encodes every output record. Per shard it keeps, in RocksDB keyed state:

- ``entries``: dedup key -> its latest accepted request (notification id, t0, W0, occurrences);
- ``log_new`` / ``log_old``: ``(expiry, key, fresh)`` of every accepted key, newest first in
  ``log_new``; the eviction index and the Bloom filter's delta in one append-only list;
- ``bloom_segments``: the shard's Bloom filter (one entry) as of the last fold of ``log_new`` into
  ``log_old``, so a restored or rescaled job rebuilds it exactly on first touch; the filter is
  rebuilt for the keys that stay at each eviction, and at once when it outgrows its size;
- ``meta`` and ``watermark_floor``: the segment size, keys held, and the highest watermark seen.

Eviction is driven by event time: a timer per shard and eviction grain compacts the log once the
watermark passes it, removing every entry whose ``t0 + W0 + lateness`` is behind it.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator
from typing import Any

from pyflink.common import Row
from pyflink.common.typeinfo import RowTypeInfo, TypeInformation, Types
from pyflink.datastream import KeyedProcessFunction, RuntimeContext
from pyflink.datastream.state import ListStateDescriptor, MapStateDescriptor, ValueStateDescriptor

from operators.bloom import ShardFilter
from operators.contract import Column, contract
from operators.dedup import DedupOptions, ShardMemory, Verdicts, decide_batch, evict, rebuild_memory
from operators.metric_names import (
    BLOOM_BITS,
    BLOOM_FILL_RATIO_PCT,
    BLOOM_KEYS_ESTIMATE,
    BLOOM_SEGMENTS_STATE,
    DEDUP_COUNTERS,
    DEDUP_LEVELS,
    ENTRIES_STATE,
    EVICTED,
    KEYS_HELD,
    NEWEST_EVENT_TIME,
)
from operators.tracing import DECISION, DECISION_SPAN, NOTIFICATION_ID, OFF, Tracing, start_tracing
from operators.window import NO_WATERMARK, Accepted
from settings.telemetry import TelemetrySettings

logger = logging.getLogger(__name__)

_COLUMN_TYPES = {"string": Types.STRING(), "long": Types.LONG(), "int": Types.INT()}


def columns_type(columns: tuple[Column, ...]) -> RowTypeInfo:
    """``Row(seq, column...)``: a column (an array) per entry of the contract's boundary."""
    return Types.ROW_NAMED(
        ["seq", *(c.name for c in columns)],
        [Types.LONG(), *(Types.BASIC_ARRAY(_COLUMN_TYPES[c.type]) for c in columns)],
    )


#: what the operator receives: one shard's mini-batch (io.notifydedup.flink.ShardBatcher)
BATCH_TYPE: TypeInformation = columns_type(contract().batch_columns)
#: what it answers: the batch's verdicts, in order (io.notifydedup.flink.RouteOutcomes reads them)
VERDICTS_TYPE: TypeInformation = columns_type(contract().verdict_columns)
_BATCH = {c.name: i + 1 for i, c in enumerate(contract().batch_columns)}

#: In thread mode PyFlink pickles tuple and row state values anyway (and its array converter
#: cannot read a missing map entry), so composite state values are declared as pickled bytes.
_PICKLED = Types.PICKLED_BYTE_ARRAY()
#: version of the filter snapshot layout; another version is rebuilt from the entries
BLOOM_FORMAT = 3
#: the one key of the bloom_segments map (the state name is kept from the segmented filter)
_FILTER = 0
#: records, and seconds, between two refreshes of the Bloom level metrics (a refresh counts the
#: set bits of every filter of the subtask)
LEVELS_EVERY = 1_000
LEVELS_MIN_INTERVAL_S = 1.0
#: how far a shard's watermark advances before the new value is written to state
WATERMARK_PERSIST_STEP_MS = 1_000


class _Level:
    """A value shown through a Flink counter: ``set`` moves the counter to it.

    Levels are reported through counters set to the current value: in thread mode Flink reads a
    Python gauge from its metrics thread, and calling into the embedded interpreter from there
    crashed the JVM (SIGSEGV in _PyEval_EvalFrameDefault, seen under the chaos run).
    """

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


class _Shard:
    """A shard's memory plus how far its watermark floor was persisted."""

    __slots__ = ("memory", "floor", "floor_persisted")

    def __init__(self, memory: ShardMemory, floor: int) -> None:
        self.memory = memory
        self.floor = floor
        self.floor_persisted = floor


class _Entries:
    """``operators.dedup.ShardStore`` over the ``entries`` MapState."""

    __slots__ = ("_state",)

    def __init__(self, state: Any) -> None:
        self._state = state

    def get(self, key: str) -> Accepted | None:
        return self._state.get(key)  # the stored tuple (notification id, t0, W0, occurrences)


_OUTCOME_NAMES = contract().outcomes


class DedupShard(KeyedProcessFunction):  # type: ignore[misc]
    """The dedup decision for every key of one shard.

    :param options: the decision's rule and sizing
    :param telemetry: ``[telemetry]``: with an ``otlp_endpoint``, the decisions of requests that
        carry a ``traceparent`` are sent there as spans of the service ``<prefix>-job``; without,
        no spans, and nothing of OpenTelemetry is loaded
    """

    def __init__(self, options: DedupOptions, telemetry: TelemetrySettings) -> None:
        self._o = options
        self._telemetry = telemetry
        self._tracing: Tracing = OFF
        self._shards: dict[int, _Shard] = {}
        self._timers: set[tuple[int, int]] = set()
        self._newest_event_time = 0

    def open(self, runtime_context: RuntimeContext) -> None:
        ctx = runtime_context
        self._entries = ctx.get_map_state(MapStateDescriptor(ENTRIES_STATE, Types.STRING(), _PICKLED))
        self._store = _Entries(self._entries)
        self._log_new = ctx.get_list_state(ListStateDescriptor("log_new", _PICKLED))
        self._log_old = ctx.get_list_state(ListStateDescriptor("log_old", _PICKLED))
        self._bloom_segments = ctx.get_map_state(MapStateDescriptor(BLOOM_SEGMENTS_STATE, Types.LONG(), _PICKLED))
        self._meta = ctx.get_state(ValueStateDescriptor("meta", _PICKLED))
        self._floor_state = ctx.get_state(ValueStateDescriptor("watermark_floor", Types.LONG()))
        group = ctx.get_metrics_group()
        self._c = {name: group.counter(name) for name in DEDUP_COUNTERS}
        self._levels = {name: _Level(group.counter(name)) for name in DEDUP_LEVELS}
        self._since_levels = 0
        self._levels_at = time.monotonic()
        self._tracing = start_tracing(self._telemetry.otlp_endpoint, self._telemetry.service("job"),
                                      sample_ratio=self._telemetry.sample_ratio)

    def close(self) -> None:
        self._tracing.shutdown()
        self._tracing = OFF

    # -- a shard's memory, from state ------------------------------------------------------------

    def _shard(self, shard: int, ctx: Any) -> _Shard:
        state = self._shards.get(shard)
        if state is not None:
            return state
        meta = self._meta.value() or {}
        floor = self._floor_state.value()
        saved = self._bloom_segments.get(_FILTER) if meta.get("format") == BLOOM_FORMAT else None
        if saved is not None:
            memory = ShardMemory(ShardFilter.load(self._o.bloom, saved), held=int(meta.get("held", 0)), hashes=None)
            for _, key, fresh in self._log_new.get() or ():
                memory.remember(key, bool(fresh))
                memory.pending += 1
        else:  # no snapshot, or one with another segment size: rebuild from the entries
            memory, log = rebuild_memory(((k, Accepted(*v)) for k, v in self._entries.items()), self._o)
            for exp, _, _ in log:
                self._schedule(ctx, shard, self._o.timer_for(exp))
            self._log_old.update(log)
            self._log_new.clear()
            self._snapshot(memory)
        state = self._shards[shard] = _Shard(memory, NO_WATERMARK if floor is None else floor)
        self._levels[KEYS_HELD].add(memory.held)
        return state

    def _snapshot(self, memory: ShardMemory) -> None:
        """Write the filter, if it changed; the log is folded already."""
        if memory.dirty:
            self._bloom_segments.put(_FILTER, memory.bloom.save())
            memory.dirty = False
        memory.pending = 0
        self._meta.update({"format": BLOOM_FORMAT, "held": memory.held})

    def _fold(self, memory: ShardMemory) -> None:
        """Move log_new into log_old and write the filter's changed segments."""
        fresh = list(self._log_new.get() or ())
        if fresh:
            self._log_old.add_all(fresh)
            self._log_new.clear()
        self._snapshot(memory)

    def _grow(self, memory: ShardMemory) -> None:
        """The filter outgrew its size: a new one, from the key hashes in memory (after a restore,
        once, from the shard's log), written with the log folded."""
        if not memory.grow(self._o.bloom):
            log = [*(self._log_old.get() or ()), *(self._log_new.get() or ())]
            memory.refilter((key for _, key, _ in log), self._o.bloom)
        self._fold(memory)

    def _watermark(self, state: _Shard, current: int) -> int:
        """The watermark, never lower than one this shard saw before a restore (a floor kept in
        keyed state next to the carry of connector/.../WatermarkCarry.java)."""
        if current > state.floor:
            state.floor = current
            if current - state.floor_persisted >= WATERMARK_PERSIST_STEP_MS:
                state.floor_persisted = current
                self._floor_state.update(current)
        return state.floor

    # -- the decision ----------------------------------------------------------------------------

    def process_element(self, batch: Row, ctx: KeyedProcessFunction.Context) -> Iterator[Row]:
        """One call per shard and mini-batch: the verdicts as one row, state written once."""
        shard = _current_shard(ctx)
        state = self._shard(shard, ctx)
        started_ns = time.time_ns() if self._tracing.on else 0
        result = decide_batch(
            dedup_keys=batch[_BATCH["dedup_key"]],
            key_hashes=batch[_BATCH["key_hash"]],
            event_times=batch[_BATCH["event_time"]],
            notification_ids=batch[_BATCH["notification_id"]],
            ttls=batch[_BATCH["dedup_ttl_sec"]],
            watermark=self._watermark(state, ctx.timer_service().current_watermark()),
            memory=state.memory,
            store=self._store,
            opts=self._o,
        )
        if result.written:
            self._entries.put_all({k: tuple(a) for k, a in result.written.items()})
        if result.logged:
            self._log_new.add_all(result.logged)
            if state.memory.bloom.full():
                self._grow(state.memory)
            elif state.memory.pending >= self._o.fold_every:
                self._fold(state.memory)
        for fire_at in result.timers:
            self._schedule(ctx, shard, fire_at)
        times = batch[_BATCH["event_time"]]
        if times:
            self._newest_event_time = max(self._newest_event_time, max(times))
        self._count(result.counts)
        if self._tracing.on:
            self._trace(batch, result.verdicts, started_ns)
        yield Row(batch[0], *result.verdicts.columns())

    def _trace(self, batch: Row, verdicts: Verdicts, started_ns: int) -> None:
        """A span per traced request of the batch: its decision, as long as the batch's took."""
        ids = batch[_BATCH["notification_id"]]
        for i, parent in enumerate(batch[_BATCH["traceparent"]]):
            if parent is not None:
                verdicts.traceparent[i] = self._tracing.record(
                    DECISION_SPAN,
                    parent=parent,
                    start_ns=started_ns,
                    attributes={NOTIFICATION_ID: ids[i], DECISION: _OUTCOME_NAMES[verdicts.outcome[i]]},
                )

    def _count(self, counts: dict[str, int]) -> None:
        fresh = counts.pop("fresh")
        for name, n in counts.items():
            if n:
                self._c[name].inc(n)
        self._levels[KEYS_HELD].add(fresh)
        self._levels[NEWEST_EVENT_TIME].set(self._newest_event_time)
        self._since_levels += sum(counts.values())
        if self._since_levels >= LEVELS_EVERY and time.monotonic() - self._levels_at >= LEVELS_MIN_INTERVAL_S:
            self._report_levels()

    def _report_levels(self) -> None:
        blooms = [s.memory.bloom for s in self._shards.values()]
        self._levels[BLOOM_KEYS_ESTIMATE].set(int(sum(b.approx_items() for b in blooms)))
        self._levels[BLOOM_BITS].set(sum(b.size_bits() for b in blooms))
        fill = sum(b.fill_ratio() for b in blooms) / len(blooms) if blooms else 0.0
        self._levels[BLOOM_FILL_RATIO_PCT].set(int(100 * fill))
        self._levels[NEWEST_EVENT_TIME].set(self._newest_event_time)
        self._since_levels = 0
        self._levels_at = time.monotonic()

    def _schedule(self, ctx: Any, shard: int, fire_at: int) -> None:
        """One eviction timer per shard and grain (registering it again is a no-op in Flink)."""
        if (shard, fire_at) not in self._timers:
            self._timers.add((shard, fire_at))
            ctx.timer_service().register_event_time_timer(fire_at)

    # -- eviction --------------------------------------------------------------------------------

    def on_timer(self, timestamp: int, ctx: KeyedProcessFunction.OnTimerContext) -> Iterator[Row]:
        """The watermark passed ``timestamp``: forget every key whose window ended by then."""
        shard = _current_shard(ctx)
        state = self._shard(shard, ctx)
        self._timers.discard((shard, timestamp))
        log = [*(self._log_old.get() or ()), *(self._log_new.get() or ())]
        gone = evict(log, self._store, timestamp, self._o.window)
        for key in gone.evicted:
            self._entries.remove(key)
        if gone.evicted:
            self._c[EVICTED].inc(len(gone.evicted))
            state.memory.held -= len(gone.evicted)
            self._levels[KEYS_HELD].add(-len(gone.evicted))
        self._log_old.update(gone.survivors)
        self._log_new.clear()
        state.memory.refilter((key for _, key, _ in gone.survivors), self._o.bloom)
        self._snapshot(state.memory)
        self._report_levels()
        return iter(())


def _current_shard(ctx: Any) -> int:
    key = ctx.get_current_key()
    return int(key[0]) if isinstance(key, (Row, tuple, list)) else int(key)
