"""The current build restores savepoints taken by earlier builds of the job graph, and reads the
records of older producers (written before a trailing optional field, ``traceparent``, was added).

tests/jobs/fixtures/savepoint-v<N> were written by tests/jobs/fixtures/make_savepoint.py with the
build of their generation: v1 by the first job graph, v2 by the graph before the data contract
moved into schemas/contract.json (requests parsed in the Python operator's JVM neighbours three
times, batches before the keyBy). If an operator uid, a state name or a state type changes
incompatibly, the restore fails or forgets the keys, and so does this test.
"""

from __future__ import annotations

import time
from dataclasses import replace

import pytest
from confluent_kafka.admin import AdminClient

from operators import codec
from operators.records import Channel, NotificationRequest
from ops import kafka_io
from tests.jobs.fixtures.make_savepoint import FIXTURE_DIR, fixture_batch, fixture_topics, produce_batch
from tests.jobs.helpers import read_outputs, wait_for_total

#: every committed generation, oldest first
GENERATIONS = sorted(p.name for p in FIXTURE_DIR.parent.glob("savepoint-v*"))

pytestmark = pytest.mark.integration
TRACEPARENT = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"


def fresh_topics(bootstrap: str, names: list[str]) -> None:
    """The savepoints name their source topic: drop what an earlier generation's test left there."""
    admin = AdminClient({"bootstrap.servers": bootstrap})
    existing = set(admin.list_topics(timeout=10).topics)
    gone = [n for n in names if n in existing]
    if gone:
        for future in admin.delete_topics(gone, operation_timeout=30).values():
            future.result()
        deadline = time.monotonic() + 30
        while set(gone) & set(admin.list_topics(timeout=10).topics) and time.monotonic() < deadline:
            time.sleep(0.5)
    kafka_io.create_topics({"bootstrap.servers": bootstrap}, names, 1)


def test_there_are_generations_to_restore():
    assert GENERATIONS[:2] == ["savepoint-v1", "savepoint-v2"]


@pytest.mark.parametrize("generation", GENERATIONS)
def test_restores_savepoint_of_previous_build(generation, kafka_bootstrap, settings_factory, job_factory):
    topics = fixture_topics()
    fresh_topics(kafka_bootstrap, topics.all())
    # the savepoint's source offsets point past the fixture batch: put the same records there
    produce_batch(kafka_bootstrap, topics, fixture_batch())
    cfg = settings_factory(topics, parallelism=2).with_overrides(
        kafka={"group_id": "upgrade"}, flink={"transactional_id_prefix": "upgrade"}
    )
    job_factory(cfg, str(FIXTURE_DIR.parent / generation))
    base = fixture_batch()
    repeats = [
        NotificationRequest(notification_id=f"v2-{i}", user_id=r.user_id, template_id=r.template_id,
                            params=r.params, channels=(Channel.PUSH,), event_time=r.event_time + 500)
        for i, r in enumerate(base[:10])
    ]
    new = [
        NotificationRequest(notification_id=f"v2-new-{i}", user_id=f"u-new-{i}", template_id="t",
                            channels=(Channel.PUSH,), event_time=base[-1].event_time + i)
        for i in range(5)
    ]
    # an old producer's records (written before the traceparent field: the schema's last byte, its
    # null branch, absent) and new ones that carry a trace context, on the restored job
    traced = {r.notification_id: TRACEPARENT for r in new[:2]}
    old = [(r.user_id.encode(), codec.encode_request(r)[:-1]) for r in repeats + new[2:]]
    kafka_io.produce_all(kafka_io.producer({"bootstrap.servers": kafka_bootstrap}), topics.requests, old, 0)
    produce_batch(kafka_bootstrap, topics, [replace(r, traceparent=TRACEPARENT) for r in new[:2]])
    wait_for_total(kafka_bootstrap, topics, 15)
    time.sleep(3)
    out = read_outputs(kafka_bootstrap, topics)
    assert out.get(topics.invalid, []) == []
    # nothing of the fixture batch is emitted again: the restored offsets and state hold
    assert sorted(v["notification_id"] for _, v in out[topics.push]) == sorted(r.notification_id for r in new)
    # the channel message carries the request's trace context, null for an old record
    assert {v["notification_id"]: v["traceparent"] for _, v in out[topics.push]} == {
        r.notification_id: traced.get(r.notification_id) for r in new}
    dups = sorted((v["notification_id"], v["original_notification_id"], v["occurrence"]) for _, v in out[topics.duplicates])
    assert dups == sorted((f"v2-{i}", f"v1-{i}", 2) for i in range(10))
