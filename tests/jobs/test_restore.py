"""State, and the Bloom filter with it, survive stop-with-savepoint and a change of parallelism.

2 -> 1 -> 2: each resume must recognise every earlier key (exact duplicates out, nothing
accepted twice) and, from its first record on, skip the state read for new keys.
"""

from __future__ import annotations

import time

import pytest

from operators import codec
from operators.records import Channel, NotificationRequest
from ops.flink_rest import RestClient
from tests.jobs.helpers import produce, read_outputs, wait_for_total

pytestmark = pytest.mark.integration

BASE = 1_796_115_600_000


def request(i: int, attempt: int) -> NotificationRequest:
    """Event times 100 ms apart: every request stays within the 60 s out-of-orderness bound,
    so none is late, before or after a restore (the watermark floor survives restores)."""
    return NotificationRequest(
        notification_id=f"n-{i}-{attempt}", user_id=f"u-{i}", template_id="order_shipped",
        params={"order": str(i)}, channels=(Channel.PUSH,), event_time=BASE + i * 100 + attempt,
    )


def send(bootstrap: str, topic: str, reqs: list[NotificationRequest]) -> None:
    produce(bootstrap, topic, [(r.user_id.encode(), codec.encode_request(r), i % 2) for i, r in enumerate(reqs)])


def metrics(cfg, job_id: str) -> dict[str, float]:
    rest = RestClient(f"http://127.0.0.1:{cfg.flink.rest_port}")
    return rest.operator_metrics(job_id, "dedup", ["accepted", "duplicates", "state_reads",
                                                   "state_reads_skipped", "bloom_false_positives"])


def wait_metrics(cfg, job_id: str, processed: int, timeout_s: float = 60) -> dict[str, float]:
    deadline = time.monotonic() + timeout_s
    while True:
        m = metrics(cfg, job_id)
        if m["accepted"] + m["duplicates"] >= processed or time.monotonic() > deadline:
            return m
        time.sleep(1)


def stop(cfg, job_id: str, target) -> str:
    location = RestClient(f"http://127.0.0.1:{cfg.flink.rest_port}").stop_with_savepoint(job_id, str(target))
    return location.removeprefix("file:")


def test_state_and_bloom_survive_savepoints_and_rescale(
    kafka_bootstrap, topic_factory, settings_factory, job_factory, tmp_path
):
    topics = topic_factory(partitions=2)
    cfg2 = settings_factory(topics, parallelism=2)
    cfg1 = cfg2.with_overrides(flink={"parallelism": 1})

    # run 1, parallelism 2: 200 new keys
    job = job_factory(cfg2)
    send(kafka_bootstrap, topics.requests, [request(i, 0) for i in range(200)])
    wait_for_total(kafka_bootstrap, topics, 200)
    first = wait_metrics(cfg2, str(job.get_job_id()), 200)
    assert first["accepted"] == 200
    assert first["state_reads_skipped"] + first["state_reads"] == 200
    savepoint = stop(cfg2, str(job.get_job_id()), tmp_path / "sp1")

    # run 2, parallelism 1: 100 repeats of run 1, 100 new keys
    job = job_factory(cfg1, savepoint)
    send(kafka_bootstrap, topics.requests,
         [request(i, 1) for i in range(100)] + [request(i, 0) for i in range(200, 300)])
    wait_for_total(kafka_bootstrap, topics, 400)
    second = wait_metrics(cfg1, str(job.get_job_id()), 200)
    assert (second["accepted"], second["duplicates"]) == (100, 100)
    # every repeat read state; new keys skipped it from the first record after the restore
    assert second["state_reads"] >= 100
    assert second["state_reads_skipped"] >= 95
    assert second["state_reads"] - 100 == second["bloom_false_positives"]
    savepoint = stop(cfg1, str(job.get_job_id()), tmp_path / "sp2")

    # run 3, parallelism 2: repeats of both earlier runs
    job = job_factory(cfg2, savepoint)
    send(kafka_bootstrap, topics.requests,
         [request(i, 2) for i in range(0, 300, 3)])
    wait_for_total(kafka_bootstrap, topics, 500)
    time.sleep(3)

    out = read_outputs(kafka_bootstrap, topics)
    push = [v for _, v in out[topics.push]]
    assert sorted(v["notification_id"] for v in push) == sorted(f"n-{i}-0" for i in range(300))
    assert len({v["message_key"] for v in push}) == 300
    dups = {v["notification_id"]: (v["original_notification_id"], v["occurrence"]) for _, v in out[topics.duplicates]}
    expected = {f"n-{i}-1": (f"n-{i}-0", 2) for i in range(100)}
    expected |= {f"n-{i}-2": (f"n-{i}-0", 3 if i < 100 else 2) for i in range(0, 300, 3)}
    assert dups == expected
    assert len(out[topics.duplicates]) == len(expected)
    for other in (topics.late, topics.invalid, topics.sms, topics.email):
        assert out[other] == []


def test_lateness_survives_restore_before_any_new_watermark(
    kafka_bootstrap, topic_factory, settings_factory, job_factory, tmp_path
):
    """Flink does not checkpoint watermarks: a request behind the watermark of the run that took
    the savepoint is late in the resumed run too, even as its first record, in a shard that has
    never persisted a watermark floor (WatermarkCarry.java). 2 -> 1 exercises the union state."""
    topics = topic_factory(partitions=2)
    cfg2 = settings_factory(topics, parallelism=2)
    cfg1 = cfg2.with_overrides(flink={"parallelism": 1})
    minute = 60_000

    def req(name: str, event_time: int) -> NotificationRequest:
        return NotificationRequest(
            notification_id=name, user_id=f"u-{name}", template_id="order_shipped", params={},
            channels=(Channel.PUSH,), event_time=event_time,
        )

    # run 1: both partitions reach BASE + 10 min; the watermark is BASE + 9 min - 1 ms
    job = job_factory(cfg2)
    first = [req("a0", BASE), req("a1", BASE), req("b0", BASE + 10 * minute), req("b1", BASE + 10 * minute)]
    produce(kafka_bootstrap, topics.requests,
            [(r.user_id.encode(), codec.encode_request(r), int(r.notification_id[1])) for r in first])
    wait_for_total(kafka_bootstrap, topics, 4)
    savepoint = stop(cfg2, str(job.get_job_id()), tmp_path / "sp")

    # run 2: its first record is 8 minutes behind that watermark
    job_factory(cfg1, savepoint)
    late = req("c", BASE + 1 * minute)
    produce(kafka_bootstrap, topics.requests, [(late.user_id.encode(), codec.encode_request(late), 0)])
    wait_for_total(kafka_bootstrap, topics, 5)
    time.sleep(3)

    out = read_outputs(kafka_bootstrap, topics)
    assert sorted(v["notification_id"] for _, v in out[topics.push]) == ["a0", "a1", "b0", "b1"]
    assert [(v["request"]["notification_id"], v["watermark"]) for _, v in out[topics.late]] == [
        ("c", BASE + 9 * minute - 1)
    ]
    for other in (topics.duplicates, topics.invalid, topics.sms, topics.email):
        assert out[other] == []
