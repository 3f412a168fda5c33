"""The JVM resolves dedup keys for routing; they must equal operators/dedup_key.py byte for byte."""

from __future__ import annotations

import pytest

from operators import codec
from operators.dedup_key import resolve_dedup_key
from operators.records import Channel, NotificationRequest
from tests.jobs.helpers import produce, read_outputs, wait_for_total

pytestmark = pytest.mark.integration

TRICKY = [
    {},
    {"a": "1", "b": "2"},
    {"b": "2", "a": "1"},
    {"quote": 'say "hi"', "back\\slash": "c:\\temp"},
    {"ctl": "line1\nline2\r\t\b\f\x01\x1f\x7f"},
    {"ünï": "cödé", "日本": "語"},
    {"😀": "emoji key", "\uffff": "last BMP", "\ue000": "private use"},  # code point vs UTF-16 order
    {"": "empty key", " ": "space"},
]


def test_jvm_dedup_keys_match_python(kafka_bootstrap, topic_factory, settings_factory, job_factory):
    topics = topic_factory(partitions=1)
    cfg = settings_factory(topics)
    job_factory(cfg)
    reqs = [
        NotificationRequest(notification_id=f"n-{i}", user_id=f"ü-{i}", template_id="t|x",
                            params=params, channels=(Channel.EMAIL,), event_time=1_796_115_600_000 + i)
        for i, params in enumerate(TRICKY)
    ]
    reqs.append(NotificationRequest(notification_id="n-explicit", user_id="u", template_id="t",
                                    channels=(Channel.EMAIL,), event_time=1_796_115_600_100,
                                    dedup_key="explicit:ключ"))
    produce(kafka_bootstrap, topics.requests, [(None, codec.encode_request(r), 0) for r in reqs])
    wait_for_total(kafka_bootstrap, topics, len(reqs))
    out = read_outputs(kafka_bootstrap, topics)
    got = {v["notification_id"]: v["dedup_key"] for _, v in out[topics.email]}
    assert got == {r.notification_id: resolve_dedup_key(r) for r in reqs}
