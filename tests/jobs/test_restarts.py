"""Safe restarts on the real broker and mini-cluster: ``dedupctl run`` resumes what a killed run
left, a missing topic is reported before the job is submitted, and lateness is carried across a
restore at a parallelism above the partition count."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from bench.api import Processes
from jobs.runner import run_job
from operators import codec
from operators.errors import ConfigError
from operators.records import Channel, NotificationRequest
from ops import kafka_io
from ops.flink_rest import RestClient
from tests.jobs.helpers import produce, read_outputs, wait_for_total
from tests.ops.helpers import cpu_group_of, idle_group_path, writable_cpu_hierarchy

pytestmark = pytest.mark.integration

BASE = 1_796_115_600_000
MINUTE = 60_000
REPO = Path(__file__).resolve().parents[2]


def req(name: str, event_time: int, user: str | None = None) -> NotificationRequest:
    return NotificationRequest(
        notification_id=name, user_id=user or f"u-{name}", template_id="order_shipped", params={},
        channels=(Channel.PUSH,), event_time=event_time,
    )


def config_file(cfg, path: Path) -> Path:
    t = cfg.topics.by_role()
    path.write_text("\n".join([
        "[kafka]", f'bootstrap_servers = "{cfg.kafka.bootstrap_servers}"', f'group_id = "{cfg.kafka.group_id}"',
        "[flink]", f'checkpoint_dir = "{cfg.flink.checkpoint_path()}"', "checkpoint_interval_ms = 1000",
        f"rest_port = {cfg.flink.rest_port}", f'transactional_id_prefix = "{cfg.flink.transactional_id_prefix}"',
        "[dedup]", "idleness_ms = 5000",
        "[topics]", *(f'{role} = "{name}"' for role, name in t.items()), "",
    ]))
    return path


def start_run(config: Path, log: Path, *extra: str, env: dict[str, str] | None = None) -> subprocess.Popen[bytes]:
    with open(log, "ab") as out:
        return subprocess.Popen(
            [sys.executable, "-m", "dedupctl.cli", "--config", str(config), "run", *extra],
            stdout=out, stderr=subprocess.STDOUT, cwd=REPO, start_new_session=True, env={**os.environ, **(env or {})},
        )


def cpu_groups(pid: int) -> set[str]:
    """The cpu controller's group of ``pid`` and of every process below it (one gone meanwhile
    is left out)."""
    groups = {cpu_group_of(p.pid) for p in Processes(pid).tree()}
    return {g for g in groups if g is not None}


def wait_running(rest: RestClient, timeout_s: float = 120) -> str:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            jobs = [j for j in rest.call("GET", "/jobs/overview")["jobs"] if j["state"] == "RUNNING"]
            if jobs:
                return str(jobs[0]["jid"])
        except Exception:  # noqa: BLE001 - not up yet
            pass
        time.sleep(0.5)
    raise AssertionError("the job did not start")


def wait_checkpoint(rest: RestClient, job_id: str, timeout_s: float = 60) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        counts = rest.call("GET", f"/jobs/{job_id}/checkpoints")["counts"]
        if counts["completed"] >= 2:
            return
        time.sleep(0.5)
    raise AssertionError("no checkpoint")


def test_run_after_a_kill_resumes_its_state_and_a_second_run_refuses(
    kafka_bootstrap, topic_factory, settings_factory, tmp_path
):
    topics = topic_factory(partitions=1)
    cfg = settings_factory(topics)
    config = config_file(cfg, tmp_path / "dedup.toml")
    rest = RestClient(f"http://127.0.0.1:{cfg.flink.rest_port}")
    first = start_run(config, tmp_path / "run1.log")
    try:
        job_id = wait_running(rest)
        # a second job on the same checkpoint directory refuses at once, and says why
        second = subprocess.run([sys.executable, "-m", "dedupctl.cli", "--config", str(config), "run"],
                                capture_output=True, text=True, cwd=REPO, timeout=120)
        assert second.returncode == 2
        assert f"is in use by another job (pid {first.pid})" in second.stderr
        a = req("a", BASE, user="u-1")
        produce(kafka_bootstrap, topics.requests, [(b"u-1", codec.encode_request(a), 0)])
        wait_for_total(kafka_bootstrap, topics, 1)
        wait_checkpoint(rest, job_id)
    finally:
        os.killpg(first.pid, signal.SIGKILL)
        first.wait()
    # plain `run` again, as a user would: it resumes, so the repeat is a duplicate; where this host
    # allows, in the CPU-idle group (flink.cpu_idle), which the mini-cluster's JVM inherits
    hierarchy = writable_cpu_hierarchy()
    again = start_run(config, tmp_path / "run2.log", env={"DEDUP_FLINK_CPU_IDLE": "true"} if hierarchy else None)
    try:
        wait_running(rest)
        if hierarchy is not None:
            groups = cpu_groups(again.pid)  # the run, its JVM and what the JVM started
            assert groups == {idle_group_path(hierarchy)}, (groups, (tmp_path / "run2.log").read_text()[-3000:])
        repeat = req("a-again", BASE + 1_000, user="u-1")
        produce(kafka_bootstrap, topics.requests, [(b"u-1", codec.encode_request(repeat), 0)])
        wait_for_total(kafka_bootstrap, topics, 2)
        time.sleep(2)
    finally:
        os.killpg(again.pid, signal.SIGKILL)
        again.wait()
    out = read_outputs(kafka_bootstrap, topics)
    assert [v["notification_id"] for _, v in out[topics.push]] == ["a"]
    assert [(v["notification_id"], v["original_notification_id"]) for _, v in out[topics.duplicates]] == [
        ("a-again", "a")
    ]
    assert "resuming from" in (tmp_path / "run2.log").read_text()


def test_a_missing_output_topic_is_reported_before_the_job_is_submitted(kafka_bootstrap, settings_factory):
    from operators.contract import Topics

    topics = Topics().with_prefix("missing-late.")
    kafka_io.create_topics({"bootstrap.servers": kafka_bootstrap}, [t for t in topics.all() if t != topics.late], 1)
    cfg = settings_factory(topics)
    with pytest.raises(ConfigError, match=f"no topic {topics.late} on "):
        run_job(cfg, detached=True)


def test_lateness_survives_a_restore_above_the_partition_count(
    kafka_bootstrap, topic_factory, settings_factory, job_factory, tmp_path
):
    """Parallelism 4 over 3 partitions: one source subtask never has a partition (idle, it held
    nothing back) and carries no watermark; the request late before the restore is late after it."""
    topics = topic_factory(partitions=3)
    cfg = settings_factory(topics, parallelism=4)
    job = job_factory(cfg)
    first = [req(f"a{p}", BASE + 10 * MINUTE) for p in range(3)]
    produce(kafka_bootstrap, topics.requests,
            [(r.user_id.encode(), codec.encode_request(r), p) for p, r in enumerate(first)])
    wait_for_total(kafka_bootstrap, topics, 3)
    time.sleep(8)  # every subtask past idleness: the one without a partition is idle
    rest = RestClient(f"http://127.0.0.1:{cfg.flink.rest_port}")
    savepoint = rest.stop_with_savepoint(str(job.get_job_id()), str(tmp_path / "sp")).removeprefix("file:")

    job_factory(cfg, savepoint)
    late = req("c", BASE + 1 * MINUTE)
    produce(kafka_bootstrap, topics.requests, [(late.user_id.encode(), codec.encode_request(late), 0)])
    wait_for_total(kafka_bootstrap, topics, 4)
    time.sleep(3)
    out = read_outputs(kafka_bootstrap, topics)
    assert sorted(v["notification_id"] for _, v in out[topics.push]) == ["a0", "a1", "a2"]
    assert [(v["request"]["notification_id"], v["watermark"]) for _, v in out[topics.late]] == [
        ("c", BASE + 9 * MINUTE - 1)
    ]
