"""The benchmark's input: one seeded stream, its expected output, and loading it into Kafka.

The stream comes from ``dedupctl.streamgen`` (the generator the chaos driver uses) and the
expected verdicts from its reference model (``operators.reference``), so every system is judged
against the same answer. One stream of ``backlog + live_pool`` records is generated: the first
``backlog`` records are loaded before a system starts (the throughput phase), the next ones are
produced live at a fixed rate (the latency phase). A verdict depends only on the records before
it, so the expected output of any prefix is the prefix of the expected output.

By default every request gets the default window (7 days, ``ttl_choices=(None,)``): over a
stream that spans minutes of event time the rule then reduces to "the first request of a key
wins", which every peer can express (Flink SQL's deduplication keeps the first row for as long as
its processing-time state TTL, so it cannot express per-request windows of seconds in event
time). ``ttl_mix=True`` uses the generator's mix of 2 s .. 1 h windows instead; the SQL peer is
then expected to differ.
"""

from __future__ import annotations

import dataclasses
import json
import time
from collections import Counter
from collections.abc import Iterable
from dataclasses import asdict, dataclass, field

from confluent_kafka import Producer

from harness.reference import DUPLICATE, NEW
from harness.streamgen import StreamSpec, generate
from operators.dedup_key import canonical_json
from settings import Settings

#: an expected (or seen) output item: ("a", notification_id, channel, lane) for an accepted
#: request on one channel, ("d", notification_id, original_notification_id) for a duplicate
Item = tuple[str, ...]
#: a record to produce: (value, Kafka key, partition)
Record = tuple[bytes, bytes | None, int]


@dataclass(frozen=True)
class DatasetSpec:
    """Shape of the benchmark's stream.

    :param backlog: records loaded before a system starts (the throughput phase)
    :param live_pool: records generated for the latency phase (each system uses a prefix)
    :param param_bytes: filler in params; 240 gives Avro requests of about 300 bytes
    :param ttl_mix: per-request windows of 2 s .. 1 h (the generator's mix) instead of 7 days
    :param start_ms: event time of the first record; None: early enough that the whole stream
        (``step_ms`` apart on average) is in the past, an hour boundary. A record more than
        ``dedup.max_future_ms`` (5 min) ahead of the wall clock is invalid to the job, so a fixed
        start breaks a long stream, or any stream on a clock behind that start
    """

    backlog: int
    live_pool: int
    partitions: int = 4
    seed: int = 7
    repeat_share: float = 0.2
    disorder_share: float = 0.1
    param_bytes: int = 240
    step_ms: int = 10
    ttl_mix: bool = False
    start_ms: int | None = None

    def __post_init__(self) -> None:
        if self.start_ms is None:
            span = 2 * self.step_ms * (self.backlog + self.live_pool)  # the most it can span
            object.__setattr__(self, "start_ms", (int(time.time() * 1000) - span) // 3_600_000 * 3_600_000)

    def stream_spec(self) -> StreamSpec:
        spec = StreamSpec(
            requests=self.backlog + self.live_pool, partitions=self.partitions, seed=self.seed,
            repeat_share=self.repeat_share, late_share=0.0, invalid_share=0.0,
            disorder_share=self.disorder_share, step_ms=self.step_ms, param_bytes=self.param_bytes,
            start_ms=int(self.start_ms or 0),
        )
        return spec if self.ttl_mix else dataclasses.replace(spec, ttl_choices=(None,))


@dataclass
class Dataset:
    spec: DatasetSpec
    partitions: list[int] = field(default_factory=list)
    keys: list[bytes | None] = field(default_factory=list)
    avro: list[bytes] = field(default_factory=list)
    json: list[bytes] = field(default_factory=list)
    nids: list[str] = field(default_factory=list)
    #: per record: the output items it must produce
    expected: list[tuple[Item, ...]] = field(default_factory=list)
    #: prefix sums: outputs_cum[n] = output records expected from the first n records
    outputs_cum: list[int] = field(default_factory=lambda: [0])
    #: prefix sums of accepted requests (keys held: nothing expires within a 7-day window)
    new_cum: list[int] = field(default_factory=lambda: [0])
    generate_s: float = 0.0

    def __len__(self) -> int:
        return len(self.avro)

    def expected_counter(self, n: int) -> Counter[Item]:
        out: Counter[Item] = Counter()
        for items in self.expected[:n]:
            out.update(items)
        return out

    def summary(self) -> dict[str, object]:
        n = self.spec.backlog
        dup = sum(1 for items in self.expected[:n] if items and items[0][0] == "d")
        return {
            "spec": asdict(self.spec),
            "records": len(self),
            "backlog_records": n,
            "backlog_duplicates": dup,
            "backlog_accepted": n - dup,
            "backlog_outputs": self.outputs_cum[n],
            "mean_avro_bytes": round(sum(map(len, self.avro[:n])) / max(1, n), 1),
            "mean_json_bytes": round(sum(map(len, self.json[:n])) / max(1, n), 1),
            "generate_s": round(self.generate_s, 2),
        }


def lane_of(priority: str) -> str:
    return "priority" if priority == "high" else "normal"


def build(spec: DatasetSpec) -> Dataset:
    t0 = time.monotonic()
    stream = generate(spec.stream_spec())
    outcomes = stream.outcomes(Settings().dedup.window_config())
    ds = Dataset(spec)
    requests = [r for r in stream.records if r.request is not None]
    if len(requests) != len(outcomes) or len(requests) != len(stream.records):
        raise AssertionError("the benchmark stream must hold only valid requests")
    for rec, outcome in zip(stream.records, outcomes, strict=True):
        req = rec.request
        assert req is not None
        ds.partitions.append(rec.partition)
        ds.keys.append(rec.key)
        ds.avro.append(rec.value)
        ds.nids.append(req.notification_id)
        channels = list(dict.fromkeys(str(c) for c in req.channels))
        ds.json.append(json.dumps({
            "notification_id": req.notification_id, "user_id": req.user_id,
            "template_id": req.template_id, "params": canonical_json(req.params).decode("utf-8"),
            "channels": channels, "priority": str(req.priority), "category": str(req.category),
            "event_time": req.event_time, "dedup_key": req.dedup_key,
            "dedup_ttl_sec": req.dedup_ttl_sec,
        }, separators=(",", ":"), ensure_ascii=False).encode("utf-8"))
        if outcome.verdict == NEW:
            items: tuple[Item, ...] = tuple(
                ("a", req.notification_id, c, lane_of(str(req.priority))) for c in channels
            )
            ds.new_cum.append(ds.new_cum[-1] + 1)
        elif outcome.verdict == DUPLICATE:
            assert outcome.original_notification_id is not None
            items = (("d", req.notification_id, outcome.original_notification_id),)
            ds.new_cum.append(ds.new_cum[-1])
        else:
            raise AssertionError(f"unexpected verdict {outcome.verdict} in the benchmark stream")
        ds.expected.append(items)
        ds.outputs_cum.append(ds.outputs_cum[-1] + len(items))
    ds.generate_s = time.monotonic() - t0
    return ds


def bulk_producer(bootstrap: str, **extra: str) -> Producer:
    return Producer({
        "bootstrap.servers": bootstrap, "enable.idempotence": "true", "linger.ms": "20",
        "batch.size": "1000000", "queue.buffering.max.messages": "1000000",
        "queue.buffering.max.kbytes": "1048576", **extra,
    })


def load(bootstrap: str, topic: str, records: Iterable[Record]) -> int:
    """Produce ``records`` (value, key, partition) in order, batched; returns the count."""
    prod = bulk_producer(bootstrap)
    errors: list[str] = []

    def on_delivery(err: object, _msg: object) -> None:
        if err is not None:
            errors.append(str(err))

    n = 0
    for value, key, partition in records:
        while True:
            try:
                prod.produce(topic, value=value, key=key, partition=partition, on_delivery=on_delivery)
                break
            except BufferError:
                prod.poll(0.05)
        n += 1
        if n % 1000 == 0:
            prod.poll(0)
    left = prod.flush(120)
    if left or errors:
        raise RuntimeError(f"loading {topic}: {left} unsent, {len(errors)} failed: {errors[:1]}")
    return n
