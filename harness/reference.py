"""A deliberately simple reference model of the dedup rule, and the output it implies.

Tests, the fault-injection driver and the benchmark use it to compute the exact expected
output of a stream of requests. It is written independently of ``operators.window`` and ``operators.dedup`` (only the
configuration types are shared) and of the JVM's encoders (the expected Avro dicts are built here
from the request fields, ``schemas/*.avsc`` and ``schemas/contract.json``), so a bug there shows
up as a difference.

The rule: every accepted request opens a window for its dedup key of
``W = clamp(dedup_ttl_sec * 1000, 1000 ms, max_window_ms)`` (``default_window_ms`` when
``dedup_ttl_sec`` is None). A request with key k and event time t is a duplicate when the latest
accepted request for k (latest in processing order) has event time t0 with ``|t - t0| < W0``, W0
being that accepted request's window. A request is late when ``t < watermark - allowed lateness``
(never without a watermark); with the side-output policy a late request only produces a late
notice and leaves state alone, with best-effort it is deduplicated like an on-time request
against whatever state remains. State for a key is forgotten once the watermark reaches
``t0 + W0 + allowed lateness``.
"""

from __future__ import annotations

import heapq
from collections import Counter
from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from operators import codec
from operators.contract import Topics, TopicSpec, contract
from operators.dedup_key import message_key, resolve_dedup_key
from operators.records import Category, Channel, NotificationRequest, Priority
from operators.window import NO_WATERMARK, LatePolicy, WindowConfig

NEW = "new"
DUPLICATE = "duplicate"
LATE = "late"

_ONE_SECOND_MS = 1_000


@dataclass(frozen=True)
class Outcome:
    """What happened to one request.

    :param verdict: ``"new"``, ``"duplicate"`` or ``"late"``
    :param dedup_key: the resolved dedup key
    :param original_notification_id: for a duplicate, the accepted request it repeats
    :param first_seen_event_time: for a duplicate, that accepted request's event time
    :param occurrence: for a duplicate, 2 for the first repeat of the accepted request, 3 ...
    :param watermark: for a late request, the watermark it was behind (None otherwise)
    """

    verdict: str
    request: NotificationRequest
    dedup_key: str
    original_notification_id: str | None = None
    first_seen_event_time: int | None = None
    occurrence: int | None = None
    watermark: int | None = None


@dataclass
class _Open:
    """The latest accepted request of one key: its window and how often it was repeated."""

    notification_id: str
    event_time: int
    window_ms: int
    seen: int = 1

    def forget_at(self, cfg: WindowConfig) -> int:
        return self.event_time + self.window_ms + cfg.allowed_lateness_ms


def request_window_ms(dedup_ttl_sec: int | None, cfg: WindowConfig) -> int:
    """The window a request opens, in milliseconds."""
    if dedup_ttl_sec is None:
        return cfg.default_window_ms
    ms = dedup_ttl_sec * 1000
    if ms < _ONE_SECOND_MS:
        ms = _ONE_SECOND_MS
    if ms > cfg.max_window_ms:
        ms = cfg.max_window_ms
    return ms


def run(
    stream: Iterable[tuple[NotificationRequest, int]], cfg: WindowConfig, *, evict: bool = True
) -> list[Outcome]:
    """The outcome of every request, in processing order.

    :param stream: ``(request, watermark when it is processed)``; ``NO_WATERMARK`` for none
    :param evict: forget a key's state once the watermark reaches its end (as the job does);
        ``False`` keeps everything forever, which must not change any on-time decision
    """
    state: dict[str, _Open] = {}
    # (forget_at, tie-break, key, entry): the state of a key is dropped when its entry is still
    # the one in state once the watermark reaches forget_at (a newer acceptance replaces it)
    expiries: list[tuple[int, int, str, _Open]] = []
    out: list[Outcome] = []
    for req, watermark in stream:
        key = resolve_dedup_key(req)
        t = req.event_time
        has_watermark = watermark != NO_WATERMARK
        if evict and has_watermark:
            while expiries and expiries[0][0] <= watermark:
                _, _, k, entry = heapq.heappop(expiries)
                if state.get(k) is entry:
                    del state[k]
        late = has_watermark and t < watermark - cfg.allowed_lateness_ms
        if late and cfg.late_policy == LatePolicy.SIDE_OUTPUT:
            out.append(Outcome(LATE, req, key, watermark=watermark))
            continue
        current = state.get(key)
        if current is not None and abs(t - current.event_time) < current.window_ms:
            current.seen += 1
            out.append(
                Outcome(
                    DUPLICATE,
                    req,
                    key,
                    original_notification_id=current.notification_id,
                    first_seen_event_time=current.event_time,
                    occurrence=current.seen,
                )
            )
            continue
        entry = state[key] = _Open(req.notification_id, t, request_window_ms(req.dedup_ttl_sec, cfg))
        heapq.heappush(expiries, (entry.forget_at(cfg), len(out), key, entry))
        out.append(Outcome(NEW, req, key))
    return out


def watermarks_by_partition(
    records: Iterable[tuple[NotificationRequest, int]],
    out_of_orderness_ms: int,
    partitions: Collection[int] | None = None,
) -> list[tuple[NotificationRequest, int]]:
    """Pair each ``(request, partition)`` with the watermark it would be processed under.

    The model of the job's watermarks (bounded out-of-orderness per Kafka partition, the
    minimum across partitions), emitted eagerly: the watermark seen by a record is that of the
    records before it, ``min over partitions of (max event time - out_of_orderness_ms - 1)``,
    and ``NO_WATERMARK`` until every partition in ``partitions`` (default: every partition that
    occurs in ``records``) has had a record; idleness is not modelled.

    Flink emits watermarks periodically, so a real job sees this watermark or an older one:
    a request this model calls late may be on time there. Drivers that compare a real job with
    the model should keep late requests far behind the watermark and on-time ones well ahead.
    """
    items = list(records)
    wanted = set(partitions) if partitions is not None else {p for _, p in items}
    newest: dict[int, int] = {}
    out: list[tuple[NotificationRequest, int]] = []
    for req, partition in items:
        if wanted and all(p in newest for p in wanted):
            watermark = min(newest[p] for p in wanted) - out_of_orderness_ms - 1
        else:
            watermark = NO_WATERMARK
        out.append((req, watermark))
        newest[partition] = max(newest.get(partition, req.event_time), req.event_time)
    return out


# -- the expected output ------------------------------------------------------------------------


def _channels(req: NotificationRequest) -> list[str]:
    """The request's channels as the job decodes them: once each, in first-seen order."""
    return list(dict.fromkeys(Channel(c).value for c in req.channels))


def request_record(req: NotificationRequest) -> dict[str, Any]:
    """A decoded ``NotificationRequest`` (schemas/notification_request.avsc), normalized as the job
    writes it into its outputs: each channel once in first-seen order, params in key order."""
    return {
        "notification_id": req.notification_id,
        "user_id": req.user_id,
        "template_id": req.template_id,
        "params": dict(sorted(req.params.items())),
        "channels": _channels(req),
        "priority": Priority(req.priority).value,
        "category": Category(req.category).value,
        "event_time": req.event_time,
        "dedup_key": req.dedup_key,
        "dedup_ttl_sec": req.dedup_ttl_sec,
        "traceparent": req.traceparent,
    }


def output_record(stem: str, request: Mapping[str, Any], /, **given: Any) -> dict[str, Any]:
    """An output record as the contract defines it (the JVM's rule, connector/.../Outputs.java):
    the fields the outcome gives, every other field of ``schemas/<stem>.avsc`` from the request's
    field of the same name."""
    return {name: given[name] if name in given else request[name] for name in codec.field_names(stem)}


def kafka_key(spec: TopicSpec, request: Mapping[str, Any], dedup_key: str) -> bytes | None:
    """The Kafka key the contract gives a topic: a request field, the resolved dedup key, or none."""
    if spec.key is None:
        return None
    return str(dedup_key if spec.key == "dedup_key" else request[spec.key]).encode("utf-8")


def expected_messages(
    outcomes: Iterable[Outcome], topics: Topics
) -> dict[str, list[tuple[bytes | None, dict[str, Any]]]]:
    """``(Kafka key, decoded Avro value)`` expected in every output topic, in processing order.

    The invalid topic is listed, empty: the model only sees valid requests.
    """
    out: dict[str, list[tuple[bytes | None, dict[str, Any]]]] = {t: [] for t in topics.outputs()}
    spec = {t.role: t for t in contract().topics}
    for o in outcomes:
        req = o.request
        base = request_record(req)
        if o.verdict == NEW:
            for channel in base["channels"]:
                topic = topics.channel_topic(Channel(channel), Priority(base["priority"]))
                msg = output_record(
                    "channel_message", base, channel=channel, dedup_key=o.dedup_key,
                    message_key=message_key(o.dedup_key, channel, base),
                )
                role = topics.spec_of(topic)
                assert role is not None
                out[topic].append((kafka_key(role, base, o.dedup_key), msg))
        elif o.verdict == DUPLICATE:
            notice = output_record(
                "duplicate_notice", base, dedup_key=o.dedup_key,
                original_notification_id=o.original_notification_id,
                first_seen_event_time=o.first_seen_event_time, occurrence=o.occurrence,
            )
            out[topics.duplicates].append((kafka_key(spec["duplicates"], base, o.dedup_key), notice))
        elif o.verdict == LATE:
            late = output_record("late_notice", base, request=base, watermark=o.watermark, reason=None)
            out[topics.late].append((kafka_key(spec["late"], base, o.dedup_key), late))
        else:
            raise ValueError(f"unknown verdict {o.verdict!r}")
    return out


def expected_records(outcomes: Iterable[Outcome], topics: Topics) -> dict[str, list[dict[str, Any]]]:
    """The decoded Avro dicts expected in every output topic, in processing order.

    A LateNotice's ``reason`` is implementation-defined, so it is None here; compare with
    :func:`diff_records`, which ignores it.
    """
    return {t: [value for _, value in msgs] for t, msgs in expected_messages(outcomes, topics).items()}


def _comparable(topic: str, record: Mapping[str, Any], topics: Topics) -> str:
    rec = dict(record)
    if topic == topics.late:
        rec["reason"] = None
    return repr(sorted((k, _frozen(v)) for k, v in rec.items()))


def _frozen(value: Any) -> Any:
    if isinstance(value, Mapping):
        return sorted((k, _frozen(v)) for k, v in value.items())
    if isinstance(value, list | tuple):
        return [_frozen(v) for v in value]
    if isinstance(value, bytes | bytearray):
        return bytes(value)
    return value


def diff_records(
    expected: Mapping[str, Sequence[Mapping[str, Any]]],
    actual: Mapping[str, Sequence[Mapping[str, Any]]],
    topics: Topics,
) -> list[str]:
    """Differences between two topic -> records maps, ignoring order and LateNotice reasons.

    Records are compared as multisets per topic (Kafka orders only within a partition); an
    empty list means identical. A topic missing from one side counts as empty.
    """
    problems: list[str] = []
    for topic in sorted(set(expected) | set(actual)):
        want = Counter(_comparable(topic, r, topics) for r in expected.get(topic, []))
        got = Counter(_comparable(topic, r, topics) for r in actual.get(topic, []))
        if want == got:
            continue
        for rec, n in sorted((want - got).items()):
            problems.append(f"{topic}: missing {n}x {rec}")
        for rec, n in sorted((got - want).items()):
            problems.append(f"{topic}: unexpected {n}x {rec}")
    return problems
