"""Per-request windows through the real job: the exclusive bound, reopening after W, clamping,
out-of-order repeats, at parallelism 1 and 2. Expected output: the reference model's."""

from __future__ import annotations

import time

import pytest

from harness.reference import diff_records, expected_records, run
from operators import codec
from operators.records import Channel, NotificationRequest
from operators.window import NO_WATERMARK
from tests.jobs.helpers import produce, read_outputs, wait_for_total

pytestmark = pytest.mark.integration

BASE = 1_796_115_600_000


def req(nid: str, user: str, t: int, ttl: int | None = None, key: str | None = None) -> NotificationRequest:
    return NotificationRequest(notification_id=nid, user_id=user, template_id="code", params={"n": "1"},
                               channels=(Channel.SMS,), event_time=BASE + t, dedup_ttl_sec=ttl, dedup_key=key)


STREAM = [
    # W = 10 s: t0 + W - 1 ms is a duplicate, t0 + W exactly is new (exclusive bound)
    req("a1", "ua", 0, ttl=10), req("a2", "ua", 9_999, ttl=10), req("a3", "ua", 10_000, ttl=10),
    # the window reopened at 10 s: a repeat at 15 s repeats a3, occurrence 2
    req("a4", "ua", 15_000, ttl=10),
    # W = 5 s, then a repeat 30 s later is new again, and its own repeat is a duplicate of it
    req("b1", "ub", 1_000, ttl=5), req("b2", "ub", 31_000, ttl=5), req("b3", "ub", 33_000, ttl=5),
    # dedup_ttl_sec 0 and -7 clamp to 1 s
    req("c1", "uc", 2_000, ttl=0), req("c2", "uc", 2_999, ttl=0), req("c3", "uc", 3_000, ttl=-7),
    # out of order: 8 s before the original is within its window (|t - t0| < W)
    req("d1", "ud", 20_000, ttl=10), req("d2", "ud", 12_001, ttl=10), req("d3", "ud", 10_000, ttl=10),
    # an explicit key shared by two users, default 7-day window
    req("e1", "ue", 4_000, key="order-9:shipped"), req("e2", "uf", 40_000, key="order-9:shipped"),
    # the default window: a repeat 40 s later is still a duplicate, occurrences 2 then 3
    req("f1", "ug", 0), req("f2", "ug", 40_000), req("f3", "ug", 41_000),
]


@pytest.mark.parametrize("parallelism", [1, 2])
def test_per_request_windows(parallelism, kafka_bootstrap, topic_factory, settings_factory, job_factory):
    topics = topic_factory(partitions=1)
    cfg = settings_factory(topics, parallelism=parallelism)
    job_factory(cfg)
    produce(kafka_bootstrap, topics.requests, [(r.user_id.encode(), codec.encode_request(r), 0) for r in STREAM])
    expected = expected_records(run([(r, NO_WATERMARK) for r in STREAM], cfg.dedup.window_config()), topics)
    verdicts = {o: len(v) for o, v in expected.items() if v}
    assert verdicts == {topics.sms: 10, topics.duplicates: 8}  # the model itself, as a user reads it
    wait_for_total(kafka_bootstrap, topics, 18)
    time.sleep(2.5)
    out = read_outputs(kafka_bootstrap, topics)
    assert diff_records(expected, {t: [v for _, v in recs] for t, recs in out.items()}, topics) == []
    dups = {v["notification_id"]: (v["original_notification_id"], v["occurrence"]) for _, v in out[topics.duplicates]}
    assert dups == {"a2": ("a1", 2), "a4": ("a3", 2), "b3": ("b2", 2), "c2": ("c1", 2),
                    "d2": ("d1", 2), "e2": ("e1", 2), "f2": ("f1", 2), "f3": ("f1", 3)}
