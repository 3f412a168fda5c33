"""A backfill of ten windows' worth of event time: state tracks rate x window, not volume."""

from __future__ import annotations

import time

import pytest

from operators import codec
from operators.records import Channel, NotificationRequest
from ops.flink_rest import RestClient
from tests.jobs.helpers import produce, read_outputs, wait_for_total

pytestmark = pytest.mark.integration

BASE = 1_796_115_600_000
WINDOW_S = 60
PER_SECOND = 5           # event-time rate of unique keys
SPAN_S = 10 * WINDOW_S   # ten windows


def test_backfill_keeps_state_bounded(kafka_bootstrap, topic_factory, settings_factory, job_factory):
    topics = topic_factory(partitions=2)
    cfg = settings_factory(
        topics, parallelism=1,
        dedup={"default_window_sec": WINDOW_S, "out_of_orderness_ms": 10_000, "idleness_ms": 5000},
    )
    job = job_factory(cfg)
    total = PER_SECOND * SPAN_S
    reqs = [
        NotificationRequest(
            notification_id=f"n-{i}", user_id=f"u-{i}", template_id="digest", params={},
            channels=(Channel.EMAIL,), event_time=BASE + i * 1000 // PER_SECOND,
        )
        for i in range(total)
    ]
    # a repeat 30 s (event time) after each of the first 50 keys: still inside the window
    repeats = [
        NotificationRequest(
            notification_id=f"r-{i}", user_id=f"u-{i}", template_id="digest", params={},
            channels=(Channel.EMAIL,), event_time=BASE + i * 1000 // PER_SECOND + 30_000,
        )
        for i in range(50)
    ]
    stream = reqs[:200] + repeats + reqs[200:]
    produce(kafka_bootstrap, topics.requests,
            [(r.user_id.encode(), codec.encode_request(r), i % 2) for i, r in enumerate(stream)])
    wait_for_total(kafka_bootstrap, topics, total + 50, timeout_s=240)

    rest = RestClient(f"http://127.0.0.1:{cfg.flink.rest_port}")
    job_id = str(job.get_job_id())
    names = ["accepted", "duplicates", "evicted", "keys_held"]
    deadline = time.monotonic() + 60
    m = rest.operator_metrics(job_id, "dedup", names)
    while m["accepted"] < total and time.monotonic() < deadline:
        time.sleep(1)
        m = rest.operator_metrics(job_id, "dedup", names)
    assert m["accepted"] == total
    assert m["duplicates"] == 50
    # the watermark sits at newest - 10 s; keys whose window (60 s) ended before it are gone:
    # about (60 s + 10 s + 1 s timer grain) x 5/s = 355 keys held, never the 3,000 seen
    held_bound = (WINDOW_S + 10 + 2) * PER_SECOND
    assert m["keys_held"] <= held_bound, m
    assert m["keys_held"] + m["evicted"] == total, m
    assert m["evicted"] >= total - held_bound

    out = read_outputs(kafka_bootstrap, topics)
    assert len(out[topics.email]) == total
    assert sorted(v["notification_id"] for _, v in out[topics.duplicates]) == sorted(f"r-{i}" for i in range(50))
