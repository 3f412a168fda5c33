"""The job on the standalone cluster of harness/cluster.py (JobManager and TaskManager processes
from the PyPI distribution's scripts, ``flink run -py``): its config.yaml comes from
settings/flink_conf.py, and the job submitted to it runs with its own settings."""

from __future__ import annotations

import uuid

import pytest

from harness.chaos import wait_running
from harness.cluster import LocalCluster
from harness.ports import free_port
from operators import codec
from operators.records import Channel, NotificationRequest
from settings import load_settings
from tests.jobs.helpers import produce, read_outputs, wait_for_total

pytestmark = pytest.mark.integration


def test_job_submitted_to_the_standalone_cluster(kafka_bootstrap, topic_factory, tmp_path):
    topics = topic_factory(partitions=2)
    run = uuid.uuid4().hex[:8]
    rest_port = free_port()
    config = tmp_path / "job.toml"
    names = "\n".join(f'{role} = "{name}"' for role, name in topics.by_role().items())
    config.write_text("\n".join([
        "[kafka]", f'bootstrap_servers = "{kafka_bootstrap}"', f'group_id = "cluster-{run}"',
        "[topics]", names,
        "[flink]", f'checkpoint_dir = "{tmp_path / "checkpoints"}"', "checkpoint_interval_ms = 1000",
        f"rest_port = {rest_port}", f'transactional_id_prefix = "cluster-{run}"', "restart_attempts = 7",
        "[dedup]", "idleness_ms = 5000", "",
    ]))
    cfg = load_settings(config, env={})
    cluster = LocalCluster(tmp_path / "flink", rest_port, free_port(), slots=1, settings=cfg)
    cluster.start()
    try:
        written = (tmp_path / "flink" / "conf" / "config.yaml").read_text()
        assert f"rest.port: {rest_port}" in written and "restart-strategy.fixed-delay.attempts: 7" in written
        job_id = cluster.submit(config, parallelism=1)
        assert wait_running(cluster.rest) == job_id
        reqs = [NotificationRequest(notification_id=f"n-{i}", user_id=f"u-{i}", template_id="t", params={"i": str(i)},
                                    channels=(Channel.PUSH,), event_time=1_796_115_600_000 + i)
                for i in range(5)]
        produce(kafka_bootstrap, topics.requests, [(r.user_id.encode(), codec.encode_request(r), 0) for r in reqs])
        produce(kafka_bootstrap, topics.requests, [(b"u-0", codec.encode_request(reqs[0]), 1)])
        wait_for_total(kafka_bootstrap, topics, 6, timeout_s=180)
        out = read_outputs(kafka_bootstrap, topics)
        assert len(out[topics.push]) == 5 and len(out[topics.duplicates]) == 1
        job = cluster.rest.call("GET", f"/jobs/{job_id}/config")["execution-config"]
        assert job["job-parallelism"] == 1
    finally:
        cluster.stop()
