"""The demo's scenario through the real job, broker and mini-cluster, at parallelism 1 and 2.

Asserts the exact records in every output topic, read with read_committed.
"""

from __future__ import annotations

import hashlib
import json
import time

import pytest

from harness import scenario
from tests.jobs.helpers import channel_message, produce, read_outputs, wait_for_total

pytestmark = pytest.mark.integration


def derived(user: str, template: str, params: dict[str, str]) -> str:
    canonical = json.dumps(params, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return hashlib.sha256(f"{user}|{template}|{canonical}".encode()).hexdigest()[:32]


@pytest.mark.parametrize("parallelism", [1, 2])
def test_scenario_exact_outputs(parallelism, kafka_bootstrap, topic_factory, settings_factory, job_factory):
    topics = topic_factory(partitions=2)
    cfg = settings_factory(topics, parallelism=parallelism)
    job_factory(cfg)
    steps = scenario.steps()
    by_id = {s.request.notification_id: s.request for s in steps if s.request}
    barrier = next(i for i, s in enumerate(steps) if s.barrier)

    produce(kafka_bootstrap, topics.requests, [(s.key(), s.value(), s.partition) for s in steps[:barrier]])
    wait_for_total(kafka_bootstrap, topics, total=sum(scenario.EXPECTED_COUNTS.values()) - 1, timeout_s=180)
    time.sleep(1.5)  # the watermark of the two "ten minutes later" requests reaches the operator
    produce(kafka_bootstrap, topics.requests, [(s.key(), s.value(), s.partition) for s in steps[barrier:]])
    wait_for_total(kafka_bootstrap, topics, total=sum(scenario.EXPECTED_COUNTS.values()))
    time.sleep(3)  # anything extra would be committed by now (checkpoints every second)
    out = read_outputs(kafka_bootstrap, topics)

    def msgs(topic, ids, channel):
        return sorted(
            (
                (by_id[i].user_id.encode(), channel_message(by_id[i], key_of(by_id[i]), channel))
                for i in ids
            ),
            key=repr,
        )

    def key_of(req):
        return req.dedup_key or derived(req.user_id, req.template_id, req.params)

    assert sorted(out[topics.push], key=repr) == msgs(topics.push, ["n-001", "n-006"], "push")
    assert sorted(out[topics.sms], key=repr) == msgs(topics.sms, ["n-002"], "sms")
    assert sorted(out[topics.email], key=repr) == msgs(topics.email, ["n-001", "n-004", "n-011", "n-012"], "email")
    assert out[topics.sms_priority] == msgs(topics.sms_priority, ["n-008"], "sms")
    assert out[topics.push_priority] == []
    assert out[topics.email_priority] == []

    dups = sorted((v for _, v in out[topics.duplicates]), key=lambda v: v["notification_id"])
    base = scenario.BASE
    assert dups == [
        {"notification_id": "n-003", "dedup_key": derived("u-alice", "order_shipped", {"order": "1001"}),
         "original_notification_id": "n-001", "first_seen_event_time": base,
         "event_time": base + 5000, "occurrence": 2},
        {"notification_id": "n-005", "dedup_key": "campaign-2026-11:carol",
         "original_notification_id": "n-004", "first_seen_event_time": base + 2000,
         "event_time": base + 3000, "occurrence": 2},
        {"notification_id": "n-007", "dedup_key": derived("u-bob", "payment_update", {"amount": "12.50"}),
         "original_notification_id": "n-002", "first_seen_event_time": base + 1000,
         "event_time": base - 20000, "occurrence": 2},
    ]

    [(late_key, late)] = out[topics.late]
    assert late_key == b"u-heidi"
    assert late["request"]["notification_id"] == "n-013"
    assert late["request"]["event_time"] == base
    # the watermark Flink's bounded out-of-orderness gives: max event time - 60 s - 1 ms
    assert late["watermark"] == base + 10 * 60_000 - 60_000 - 1
    assert "behind the watermark" in late["reason"]

    invalid = sorted((v for _, v in out[topics.invalid]), key=lambda v: v["error"])
    assert [(v["topic"], v["raw"]) for v in invalid] == [
        (topics.requests, steps[9].raw),
        (topics.requests, b"\x00\x01not-avro"),
    ]
    assert invalid[0]["error"] == "notification_id is missing or empty"
    assert invalid[1]["error"].startswith("undecodable NotificationRequest")
    assert {(v["partition"]) for v in invalid} == {0, 1}
