"""The sink's transactional ids on the real broker: ``pooling`` (``flink.transaction_naming``)
reuses a few per subtask however many checkpoints complete; ``incrementing``, the connector's
default, leaves a new one on the brokers every checkpoint (kept 7 days, FLINK-34554)."""

from __future__ import annotations

import time

import pytest

from harness.kafka_transactions import held
from operators import codec
from operators.records import Channel, NotificationRequest
from ops.flink_rest import RestClient
from tests.jobs.helpers import produce, read_outputs, wait_for_total

pytestmark = pytest.mark.integration

BASE = 1_796_115_600_000
CHECKPOINTS = 12


def completed_checkpoints(rest: RestClient, job_id: str) -> int:
    return int(rest.call("GET", f"/jobs/{job_id}/checkpoints")["counts"]["completed"])


@pytest.mark.parametrize("naming", ["pooling", "incrementing"])
def test_the_sink_reuses_its_transactional_ids_when_pooling(
    naming, kafka_bootstrap, topic_factory, settings_factory, job_factory
):
    topics = topic_factory(partitions=2)
    cfg = settings_factory(topics, parallelism=2, flink={"transaction_naming": naming, "checkpoint_interval_ms": 500})
    prefix = cfg.flink.transactional_id_prefix
    job = job_factory(cfg)
    rest = RestClient(f"http://127.0.0.1:{cfg.flink.rest_port}")
    job_id = str(job.get_job_id())
    reqs: list[NotificationRequest] = []
    start = completed_checkpoints(rest, job_id)
    deadline = time.monotonic() + 180
    # records in every checkpoint's transaction, on both subtasks, until CHECKPOINTS more completed
    while completed_checkpoints(rest, job_id) < start + CHECKPOINTS:
        assert time.monotonic() < deadline, "the checkpoints did not complete"
        batch = [NotificationRequest(notification_id=f"n-{len(reqs) + i}", user_id=f"u-{len(reqs) + i}",
                                     template_id="order_shipped", params={}, channels=(Channel.PUSH,),
                                     event_time=BASE + len(reqs) + i)
                 for i in range(4)]
        produce(kafka_bootstrap, topics.requests,
                [(r.user_id.encode(), codec.encode_request(r), i % 2) for i, r in enumerate(batch)])
        reqs += batch
        time.sleep(0.25)
    wait_for_total(kafka_bootstrap, topics, len(reqs))
    ids = held(kafka_bootstrap).ids_with(prefix)
    if naming == "pooling":
        # two a subtask: the one being written and the one its last checkpoint is committing
        assert 1 <= len(ids) <= 2 * cfg.flink.parallelism, ids
    else:
        assert len(ids) >= CHECKPOINTS * cfg.flink.parallelism, ids
    out = read_outputs(kafka_bootstrap, topics)
    assert sorted(v["notification_id"] for _, v in out[topics.push]) == sorted(r.notification_id for r in reqs)
