"""Seeded request streams for the fault-injection driver and the benchmark.

The stream is built so that the job's answer is exact and known in advance: repeats of a key
stay on its user's partition (processing order per key is the produce order), on-time requests
are at most ``max_disorder_ms`` behind the newest event time, and late requests are hours behind
the watermark, so timing (periodic watermarks, restarts) can never change a verdict.
"""

from __future__ import annotations

import random
import zlib
from collections.abc import Iterator
from dataclasses import dataclass, field

from harness.reference import Outcome, run
from operators import codec
from operators.records import Category, Channel, NotificationRequest, Priority
from operators.window import NO_WATERMARK, WindowConfig

BASE = 1_796_115_600_000  # 2026-12-01T09:00:00Z
HOUR = 3_600_000


@dataclass(frozen=True)
class StreamSpec:
    """Shape of a generated stream.

    :param requests: records in all (valid and invalid)
    :param partitions: partitions of the requests topic
    :param seed: the same seed gives the same stream
    :param repeat_share: share of requests that repeat an earlier one
    :param late_share: share of requests far behind the watermark
    :param invalid_share: share of undecodable or schema-violating records
    :param disorder_share: share of new requests that are out of order (within the bound)
    :param step_ms: mean event-time advance per record; at ``1000 / produce rate`` event time
        moves like the wall clock, so a replay after a crash (seconds of input) covers seconds
        of event time, far less than ``late_by_ms``
    :param max_disorder_ms: how far behind the newest event time an on-time request may be
    :param late_by_ms: how far behind the newest event time a late request is
    :param late_after: no late request among the first records (the watermark is not set yet)
    :param ttl_choices: per-request windows in seconds (None: the default window)
    :param param_bytes: size of the params payload, to shape records (about 300 bytes total)
    :param id_prefix: prefixes user and notification ids, so two streams share no key
    :param start_ms: event time of the first record
    """

    requests: int
    partitions: int = 4
    seed: int = 7
    repeat_share: float = 0.2
    late_share: float = 0.01
    invalid_share: float = 0.01
    disorder_share: float = 0.1
    step_ms: int = 10
    max_disorder_ms: int = 30_000
    late_by_ms: int = 10 * 60_000
    late_after: int = 1000
    ttl_choices: tuple[int | None, ...] = (None, None, 2, 10, 60, 3600)
    param_bytes: int = 60
    id_prefix: str = ""
    start_ms: int = BASE


@dataclass(frozen=True)
class Record:
    """One record to produce, and what the reference model makes of it (None: invalid)."""

    partition: int
    key: bytes | None
    value: bytes
    request: NotificationRequest | None
    late: bool = False


@dataclass
class Stream:
    spec: StreamSpec
    records: list[Record] = field(default_factory=list)

    def outcomes(self, cfg: WindowConfig) -> list[Outcome]:
        """The reference model's verdict for every valid record, in produce order."""
        items = [
            (r.request, r.request.event_time + 1 if r.late else NO_WATERMARK)
            for r in self.records
            if r.request is not None
        ]
        return run(items, cfg)

    def invalid(self) -> list[Record]:
        return [r for r in self.records if r.request is None]


def partition_of(user_id: str, partitions: int) -> int:
    return zlib.crc32(user_id.encode()) % partitions


def generate(spec: StreamSpec) -> Stream:
    rng = random.Random(spec.seed)
    stream = Stream(spec)
    history: list[NotificationRequest] = []
    newest = spec.start_ms
    n = 0
    filler = "x" * spec.param_bytes
    while len(stream.records) < spec.requests:
        newest += rng.randint(0, 2 * spec.step_ms)
        roll = rng.random()
        n += 1
        if roll < spec.invalid_share:
            stream.records.append(_invalid(rng, n, spec))
            continue
        roll -= spec.invalid_share
        late = roll < spec.late_share and len(stream.records) >= spec.late_after
        if roll < spec.late_share and not late:
            continue
        if late:
            t = newest - spec.late_by_ms - rng.randint(0, 60_000)
        elif rng.random() < spec.disorder_share:
            t = newest - rng.randint(0, spec.max_disorder_ms)
        else:
            t = newest
        if history and rng.random() < spec.repeat_share / (1 - spec.invalid_share):
            # a repeat: a producer retry or a second source, of a recent or an older request
            original = history[-1 - min(len(history) - 1, int(rng.expovariate(1 / 50)))]
            req = NotificationRequest(
                notification_id=f"{spec.id_prefix}n{n}", user_id=original.user_id, template_id=original.template_id,
                channels=original.channels, event_time=t, params=original.params,
                priority=original.priority, category=original.category, dedup_key=original.dedup_key,
                dedup_ttl_sec=original.dedup_ttl_sec,
            )
        else:
            user = f"{spec.id_prefix}u{rng.randint(0, max(1, spec.requests // 4))}"
            explicit = rng.random() < 0.2
            high = rng.random() < 0.05
            req = NotificationRequest(
                notification_id=f"{spec.id_prefix}n{n}", user_id=user,
                template_id="otp" if high else rng.choice(("order_shipped", "payment_update", "campaign")),
                channels=tuple(rng.sample((Channel.PUSH, Channel.SMS, Channel.EMAIL), rng.randint(1, 2))),
                event_time=t,
                params={"ref": f"{n}", "body": filler},
                priority=Priority.HIGH if high else rng.choice((Priority.NORMAL, Priority.LOW)),
                category=rng.choice((Category.TRANSACTIONAL, Category.MARKETING)),
                dedup_key=f"{user}:event-{n}" if explicit else None,
                dedup_ttl_sec=rng.choice(spec.ttl_choices),
            )
            history.append(req)
        stream.records.append(
            Record(partition_of(req.user_id, spec.partitions), req.user_id.encode(),
                   codec.encode_request(req), req, late)
        )
    return stream


def _invalid(rng: random.Random, n: int, spec: StreamSpec) -> Record:
    partition = rng.randrange(spec.partitions)
    if rng.random() < 0.5:
        raw = rng.randbytes(rng.randint(1, 80))
        if raw[:1] != b"\x00":  # keep it from ever being a valid request by chance
            raw = b"\xff" + raw
    else:  # valid Avro that breaks the contract: an empty user_id
        req = NotificationRequest(
            notification_id=f"bad{n}", user_id="u-bad", template_id="t", channels=(Channel.PUSH,),
            event_time=BASE,
        )
        fields = req.to_avro()
        fields["user_id"] = ""
        raw = codec.encode("notification_request", fields)
    return Record(partition, None, raw, None)


def iter_batches(records: list[Record], size: int) -> Iterator[list[Record]]:
    for i in range(0, len(records), size):
        yield records[i:i + size]
