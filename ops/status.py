"""``dedupctl status``: the running job at a glance, read from Flink's REST API.

What the people who run the job watch: its state and uptime; each operator's watermark and how
far it lags behind the newest event time and behind the wall clock; the last checkpoint; the
state's size and keys; the dedup outcomes per second; the Bloom prefilter's skip rate and its
false-positive rate against the configured one. docs/operations.md explains every figure.

Rates come from two readings of the counters (ops/status_probe.py): the counter delta
between two refreshes of the JobManager's metric store over the job's uptime between them.
"""

from __future__ import annotations

import dataclasses
import re
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from operators.metric_names import (
    BACK_PRESSURED,
    BLOOM_FALSE_POSITIVES,
    BLOOM_FILL_RATIO_PCT,
    BLOOM_KEYS_ESTIMATE,
    CURRENT_INPUT_WATERMARK,
    CURRENT_OUTPUT_WATERMARK,
    DEDUP_COUNTERS,
    DEDUP_OPERATOR,
    EMITTED,
    ENTRIES_STATE,
    ESTIMATE_LIVE_DATA_SIZE,
    ESTIMATE_NUM_KEYS,
    KEYS_HELD,
    NEWEST_EVENT_TIME,
    OUTCOMES,
    ROUTE_COUNTERS,
    ROUTE_OPERATOR,
    STATE_READS,
    STATE_READS_SKIPPED,
    TOPIC_GROUP,
    TOTAL_SST_FILES_SIZE,
    rocksdb_metric,
)
from ops.status_probe import Agg, Probe, Reading, Sample, Vertex, rest_name
from settings import Settings

#: PyFlink's own operators of key_by() (jobs built before the JVM sharded): noise in the table
_INTERNAL_OPERATOR = re.compile(r"^(_.*|Map)$")
#: Long.MIN_VALUE and Long.MAX_VALUE reach us as floats
_NO_WATERMARK_BELOW = -(2**62)
_END_OF_INPUT_ABOVE = 2**62


# -- the report ------------------------------------------------------------------------------


@dataclass(frozen=True)
class OperatorRow:
    """One operator's watermark (min over subtasks) and lags, in milliseconds."""

    operator: str
    vertex: str
    parallelism: int
    watermark: int | None
    lag_event_ms: int | None
    lag_wall_ms: int | None
    backpressured_ms_per_s: float | None
    end_of_input: bool = False


@dataclass(frozen=True)
class CheckpointSummary:
    completed: int
    failed: int
    in_progress: int
    last_id: int | None = None
    size_bytes: int | None = None
    full_size_bytes: int | None = None
    duration_ms: int | None = None
    completed_at: int | None = None
    age_ms: int | None = None
    last_failure_at: int | None = None
    last_failure: str | None = None


@dataclass(frozen=True)
class StateSummary:
    keys_held: int
    rocksdb_estimated_keys: int | None
    rocksdb_live_data_bytes: int | None
    rocksdb_sst_bytes: int | None
    bloom_keys_estimate: int
    bloom_fill_ratio_pct: float | None


@dataclass(frozen=True)
class BloomSummary:
    """skip rate = reads skipped / lookups; fp rate = false positives / lookups of absent keys."""

    skip_rate: float | None
    fp_rate: float | None
    fp_rate_configured: float


@dataclass(frozen=True)
class StatusReport:
    rest: str
    job_id: str
    job_name: str
    state: str
    start_time: int | None
    uptime_ms: int | None
    restarts: int | None
    now: int
    operators: tuple[OperatorRow, ...]
    checkpoint: CheckpointSummary | None
    state_size: StateSummary
    totals: Mapping[str, int]
    rates_per_s: Mapping[str, float] | None
    rate_window_s: float | None
    bloom: BloomSummary
    emitted: Mapping[str, int]

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def _watermark(agg: Agg | None) -> tuple[int | None, bool]:
    if agg is None or agg.min <= _NO_WATERMARK_BELOW:
        return None, False
    if agg.min >= _END_OF_INPUT_ABOVE:
        return None, True
    return int(agg.min), False


def operator_rows(reading: Reading, newest_event_time: int | None, now: int) -> list[OperatorRow]:
    """Sources by their output watermark, every other operator by its input watermark."""
    rows = []
    s = reading.sample
    for v in reading.vertices:
        bp = s.values.get((v.id, BACK_PRESSURED))
        for op_id, display in v.operators.items():
            if _INTERNAL_OPERATOR.match(display):
                continue
            agg = s.values.get((v.id, f"{op_id}.{CURRENT_INPUT_WATERMARK}"))
            if agg is None:
                agg = s.values.get((v.id, f"{op_id}.{CURRENT_OUTPUT_WATERMARK}"))
                if agg is None:
                    continue
            wm, ended = _watermark(agg)
            rows.append(OperatorRow(
                operator=display, vertex=v.name, parallelism=v.parallelism, watermark=wm,
                lag_event_ms=newest_event_time - wm if wm is not None and newest_event_time else None,
                lag_wall_ms=now - wm if wm is not None else None,
                backpressured_ms_per_s=bp.max if bp else None, end_of_input=ended,
            ))
    return rows


def checkpoint_summary(raw: Mapping[str, Any] | None, now: int) -> CheckpointSummary | None:
    if not raw or "counts" not in raw:
        return None
    counts = raw["counts"]
    latest = raw.get("latest") or {}
    done = latest.get("completed") or {}
    failed = latest.get("failed") or {}
    completed_at = done.get("latest_ack_timestamp")
    failure_at = failed.get("failure_timestamp")
    return CheckpointSummary(
        completed=int(counts.get("completed", 0)),
        failed=int(counts.get("failed", 0)),
        in_progress=int(counts.get("in_progress", 0)),
        last_id=done.get("id"),
        size_bytes=done.get("checkpointed_size"),
        full_size_bytes=done.get("state_size"),
        duration_ms=done.get("end_to_end_duration"),
        completed_at=completed_at,
        age_ms=now - completed_at if completed_at else None,
        last_failure_at=failure_at,
        last_failure=failed.get("failure_message") if failure_at else None,
    )


def _rocksdb_sum(reading: Reading, prop: str, state: str | None = None) -> int | None:
    """A RocksDB property of the dedup operator's column families (or of one), summed."""
    found = [
        agg.sum for (_, mid), agg in reading.sample.values.items()
        if mid.startswith(f"{DEDUP_OPERATOR}.") and mid.endswith(f".rocksdb_{prop}")
        and (state is None or mid == f"{DEDUP_OPERATOR}.{rocksdb_metric(state, prop)}")
    ]
    return int(sum(found)) if found else None


def _ratio(part: int, whole: int) -> float | None:
    return part / whole if whole > 0 else None


def counter_totals(sample: Sample, vertices: Sequence[Vertex]) -> dict[str, int]:
    totals = {n: sample.total(vertices, f"{DEDUP_OPERATOR}.{n}") for n in DEDUP_COUNTERS}
    totals |= {n: sample.total(vertices, f"{ROUTE_OPERATOR}.{n}") for n in ROUTE_COUNTERS}
    return totals


def emitted_per_topic(sample: Sample, cfg: Settings) -> dict[str, int]:
    """Records the job wrote, per topic: under the configured names where they match
    the metric's (in their order), under the metric's own name otherwise."""
    found = {
        mid.split(".")[2]: int(agg.sum) for (_, mid), agg in sample.values.items()
        if mid.startswith(f"{ROUTE_OPERATOR}.{TOPIC_GROUP}.") and mid.endswith(f".{EMITTED}")
    }
    out = {t: found.pop(rest_name(t)) for t in cfg.topics.outputs() if rest_name(t) in found}
    return out | dict(sorted(found.items()))


class RateTracker:
    """Outcome rates from successive samples; the window is the uptime between two refreshes."""

    def __init__(self, vertices: Sequence[Vertex], min_window_ms: float = 2_000) -> None:
        self.vertices = tuple(vertices)
        self.min_window_ms = min_window_ms
        self.rates: dict[str, float] | None = None
        self.window_s: float | None = None
        self._base: Sample | None = None

    def update(self, sample: Sample) -> bool:
        """Take a sample; True when it gave new rates."""
        base = self._base
        if base is None:
            self._base = sample
            return False
        if sample.uptime_ms is not None and base.uptime_ms is not None:
            window_ms = sample.uptime_ms - base.uptime_ms
        else:  # no uptime metric: the local clock, coarser by up to one store refresh
            window_ms = (sample.read_at - base.read_at) * 1000 if sample.values != base.values else 0
        if sample.restarts != base.restarts or window_ms < 0:  # counters started again from 0
            self._base, self.rates, self.window_s = sample, None, None
            return False
        if window_ms < self.min_window_ms:
            return False
        now_totals, then_totals = counter_totals(sample, self.vertices), counter_totals(base, self.vertices)
        self.rates = {n: max(0, now_totals[n] - then_totals[n]) * 1000 / window_ms for n in OUTCOMES}
        self.window_s = window_ms / 1000
        self._base = sample
        return True


def build_report(
    reading: Reading, cfg: Settings, rest_url: str, tracker: RateTracker | None = None
) -> StatusReport:
    job, s, vs = reading.job, reading.sample, reading.vertices
    now = int(job.get("now") or time.time() * 1000)
    newest = s.find(vs, f"{DEDUP_OPERATOR}.{NEWEST_EVENT_TIME}")
    newest_event_time = int(newest.max) if newest and newest.max > 0 else None
    totals = counter_totals(s, vs)
    lookups = totals[STATE_READS] + totals[STATE_READS_SKIPPED]
    absent = totals[BLOOM_FALSE_POSITIVES] + totals[STATE_READS_SKIPPED]
    fill = s.find(vs, f"{DEDUP_OPERATOR}.{BLOOM_FILL_RATIO_PCT}")
    emitted = emitted_per_topic(s, cfg)
    start = job.get("start-time")
    return StatusReport(
        rest=rest_url,
        job_id=str(job.get("jid")),
        job_name=str(job.get("name")),
        state=str(job.get("state")),
        start_time=int(start) if start and start > 0 else None,
        uptime_ms=int(job["duration"]) if job.get("duration", -1) >= 0 else None,
        restarts=s.restarts,
        now=now,
        operators=tuple(operator_rows(reading, newest_event_time, now)),
        checkpoint=checkpoint_summary(reading.checkpoints, now),
        state_size=StateSummary(
            keys_held=s.total(vs, f"{DEDUP_OPERATOR}.{KEYS_HELD}"),
            rocksdb_estimated_keys=_rocksdb_sum(reading, ESTIMATE_NUM_KEYS, ENTRIES_STATE),
            rocksdb_live_data_bytes=_rocksdb_sum(reading, ESTIMATE_LIVE_DATA_SIZE),
            rocksdb_sst_bytes=_rocksdb_sum(reading, TOTAL_SST_FILES_SIZE),
            bloom_keys_estimate=s.total(vs, f"{DEDUP_OPERATOR}.{BLOOM_KEYS_ESTIMATE}"),
            bloom_fill_ratio_pct=fill.max if fill else None,
        ),
        totals=totals,
        rates_per_s=dict(tracker.rates) if tracker and tracker.rates is not None else None,
        rate_window_s=tracker.window_s if tracker else None,
        bloom=BloomSummary(
            skip_rate=_ratio(totals[STATE_READS_SKIPPED], lookups),
            fp_rate=_ratio(totals[BLOOM_FALSE_POSITIVES], absent),
            fp_rate_configured=cfg.dedup.bloom_fp_rate,
        ),
        emitted=emitted,
    )


def collect(
    probe: Probe,
    cfg: Settings,
    sample_s: float,
    *,
    poll_s: float = 1.0,
    sleep: Callable[[float], None] = time.sleep,
) -> StatusReport:
    """One report; waits up to ``sample_s`` for a second store refresh to give rates.

    When it waited, the report shows the job as it is at the end of the wait: the gauges (the
    RocksDB ones are refreshed every 5 s) and the checkpoint are the newest there are.
    """
    reading = probe.read()
    tracker = RateTracker(reading.vertices)
    tracker.update(reading.sample)
    if sample_s > 0 and reading.job.get("state") == "RUNNING":
        deadline = time.monotonic() + sample_s
        while time.monotonic() < deadline:
            sleep(poll_s)
            if tracker.update(probe.sample(reading.vertices)):
                break
        reading = probe.read()
        tracker.update(reading.sample)
    return build_report(reading, cfg, probe.rest.base, tracker)


def watch(
    probe: Probe,
    cfg: Settings,
    interval_s: float,
    count: int | None,
    emit: Callable[[StatusReport], None],
    sleep: Callable[[float], None] = time.sleep,
) -> None:
    """A report every ``interval_s``; rates over the last two store refreshes seen."""
    tracker: RateTracker | None = None
    shown = 0
    while count is None or shown < count:
        reading = probe.read()
        if tracker is None or [v.id for v in tracker.vertices] != [v.id for v in reading.vertices]:
            tracker = RateTracker(reading.vertices)
        tracker.update(reading.sample)
        emit(build_report(reading, cfg, probe.rest.base, tracker))
        shown += 1
        if count is None or shown < count:
            sleep(interval_s)
