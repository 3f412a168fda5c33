"""The demo's story through the real job, broker and mini-cluster, at parallelism 1 and 2.

Asserts the exact records in every output topic, read with read_committed.
"""

from __future__ import annotations

import time

import pytest

from harness import scenario
from operators.dedup_key import resolve_dedup_key
from tests.jobs.helpers import channel_message, produce, read_outputs, wait_for_total

pytestmark = pytest.mark.integration


@pytest.mark.parametrize("parallelism", [1, 2])
def test_scenario_exact_outputs(parallelism, kafka_bootstrap, topic_factory, settings_factory, job_factory):
    topics = topic_factory(partitions=2)
    cfg = settings_factory(topics, parallelism=parallelism)
    job_factory(cfg)
    base = scenario.base_ms()
    steps = scenario.steps(base)
    by_id = {s.request.notification_id: s.request for s in steps if s.request}
    barrier = next(i for i, s in enumerate(steps) if s.barrier)

    produce(kafka_bootstrap, topics.requests, [(s.key(), s.value(), s.partition) for s in steps[:barrier]])
    wait_for_total(kafka_bootstrap, topics, total=sum(scenario.EXPECTED_BEFORE_BARRIER.values()), timeout_s=180)
    produce(kafka_bootstrap, topics.requests, [(s.key(), s.value(), s.partition) for s in steps[barrier:]])
    wait_for_total(kafka_bootstrap, topics, total=sum(scenario.EXPECTED_COUNTS.values()))
    time.sleep(3)  # anything extra would be committed by now (checkpoints every second)
    out = read_outputs(kafka_bootstrap, topics)

    def expected(channel: str) -> list[tuple[bytes, dict[str, object]]]:
        return sorted(
            (
                (by_id[i].user_id.encode(), channel_message(by_id[i], resolve_dedup_key(by_id[i]), channel))
                for i in scenario.ACCEPTED
                if channel in {c.value for c in by_id[i].channels}
            ),
            key=repr,
        )

    for channel in ("push", "sms", "email"):
        assert sorted(out[getattr(topics, channel)], key=repr) == expected(channel)
        assert out[getattr(topics, f"{channel}_priority")] == []

    [(_, dup)] = out[topics.duplicates]
    assert dup == {
        "notification_id": "n-2", "dedup_key": resolve_dedup_key(by_id["n-1"]),
        "original_notification_id": "n-1", "first_seen_event_time": base,
        "event_time": base + 5000, "occurrence": 2,
    }
    assert out[topics.late] == []
    [(_, invalid)] = out[topics.invalid]
    assert (invalid["topic"], invalid["raw"]) == (topics.requests, b"\x00\x01not-avro")
    assert invalid["error"].startswith("undecodable NotificationRequest")
