"""The JVM writes the output records (RouteOutcomes.java, Outputs.java); every byte of them must
be what the Python encoders (tests/encoders.py, fastavro) write for the same outcome."""

from __future__ import annotations

from collections import Counter

import pytest

from operators import codec
from operators.dedup_key import resolve_dedup_key
from operators.records import Category, Channel, NotificationRequest, Priority
from operators.window import Accepted
from ops import kafka_io
from tests import encoders as routing
from tests.jobs.helpers import produce, wait_for_total

pytestmark = pytest.mark.integration

BASE = 1_796_115_600_000
PUSH, SMS, EMAIL = Channel.PUSH, Channel.SMS, Channel.EMAIL


def requests() -> list[NotificationRequest]:
    def req(n: int, **kw: object) -> NotificationRequest:
        fields: dict[str, object] = {
            "notification_id": f"n-{n}", "user_id": f"ü-{n}", "template_id": "t", "params": {"k": str(n)},
            "channels": (EMAIL,), "event_time": BASE + n,
        }
        return NotificationRequest(**(fields | kw))  # type: ignore[arg-type]

    return [
        req(1, channels=(PUSH, EMAIL, PUSH, SMS, EMAIL)),  # repeated channels: each once, in order
        req(2, channels=(SMS,), priority=Priority.HIGH, category=Category.MARKETING, dedup_ttl_sec=3600),
        req(3, channels=(PUSH, SMS), priority=Priority.HIGH),
        req(4, dedup_key="", params={"ünï": "cödé", "😀": "\x00\n", "": ""}),  # empty key: derived
        req(5, dedup_key="explicit:ключ", priority=Priority.LOW, dedup_ttl_sec=-5),
        req(6, dedup_key="explicit:ключ", channels=(PUSH,)),  # a repeat of n-5
        req(7, dedup_key="explicit:ключ", channels=(SMS,), dedup_ttl_sec=86_400),  # and another
        req(8, params={}, channels=(SMS, PUSH, EMAIL)),
    ]


def test_output_records_are_byte_identical_to_the_python_encoders(
    kafka_bootstrap, topic_factory, settings_factory, job_factory
):
    topics = topic_factory(partitions=1)
    job_factory(settings_factory(topics))
    reqs = requests()
    produce(kafka_bootstrap, topics.requests, [(None, codec.encode_request(r), 0) for r in reqs])

    expected: Counter[tuple[str, bytes | None, bytes]] = Counter()
    accepted: dict[str, Accepted] = {}
    for r in reqs:
        decoded = codec.decode_request(codec.encode_request(r))  # as the job reads it
        key = resolve_dedup_key(decoded)
        if key in accepted:
            original = accepted[key]
            accepted[key] = Accepted(original.notification_id, original.event_time, original.window_ms,
                                     original.occurrences + 1)
            routed = [routing.duplicate_notice(decoded, key, accepted[key], topics)]
        else:
            accepted[key] = Accepted(decoded.notification_id, decoded.event_time, 0, 1)
            routed = routing.channel_messages(decoded, key, topics)
        expected.update((x.topic, x.key, x.value) for x in routed)
    wait_for_total(kafka_bootstrap, topics, sum(expected.values()))

    got = Counter(
        (m.topic, m.key, m.value)
        for m in kafka_io.read_committed({"bootstrap.servers": kafka_bootstrap}, topics.outputs(), idle_timeout_s=3)
    )
    assert got == expected
