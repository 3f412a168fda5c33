"""``dedupctl demo``: a broker, the job and the scenario, end to end, then a summary."""

from __future__ import annotations

import logging
import shutil
import tempfile
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

from harness import scenario
from harness.local_kafka import LocalBroker
from harness.ports import free_port
from operators.contract import Topics
from ops import kafka_io
from settings import Settings

logger = logging.getLogger(__name__)


def demo_settings(base: Settings, bootstrap: str, work: Path) -> Settings:
    return base.with_overrides(
        kafka={"bootstrap_servers": bootstrap, "partitions": 2},
        flink={"checkpoint_dir": str(work / "checkpoints"),
               "rest_port": free_port(), "transactional_id_prefix": f"demo-{work.name}"},
        dedup={"idleness_ms": 5000},
    )


def produce_scenario(
    cfg: Settings, wait_visible: Callable[[int], object], say: Callable[[str], None]
) -> None:
    """Produce the scenario's steps; before a barrier, wait until all earlier output is visible."""
    prod = kafka_io.producer(cfg.kafka.client_config())
    for step in scenario.steps():
        if step.barrier:
            wait_visible(0)
        say(f"  produce -> p{step.partition}: {step.note}")
        kafka_io.produce_all(prod, cfg.topics.requests, [(step.key(), step.value())], step.partition)


def count_outputs(cfg: Settings) -> Counter[str]:
    counts: Counter[str] = Counter()
    for msg in kafka_io.read_committed(cfg.kafka.client_config(), cfg.topics.outputs(), idle_timeout_s=1.5):
        counts[msg.topic] += 1
    return counts


def wait_for_counts(cfg: Settings, want: dict[str, int], timeout_s: float) -> Counter[str]:
    deadline = time.monotonic() + timeout_s
    counts: Counter[str] = Counter()
    while time.monotonic() < deadline:
        counts = count_outputs(cfg)
        if all(counts[t] >= n for t, n in want.items()):
            return counts
        time.sleep(1)
    raise TimeoutError(f"outputs after {timeout_s:.0f} s: {dict(counts)}; expected at least {want}")


def describe(topic: str, value: dict[str, Any], topics: Topics) -> str:
    """One line per record, without message parameters (they can hold codes and addresses)."""
    if topic == topics.duplicates:
        return (f"{value['notification_id']} repeats {value['original_notification_id']}"
                f" (occurrence {value['occurrence']}, key {value['dedup_key']})")
    if topic == topics.late:
        req = value["request"]
        return f"{req['notification_id']} event_time {req['event_time']} < watermark {value['watermark']}"
    if topic == topics.invalid:
        return f"p{value['partition']}@{value['offset']}: {value['error']}"
    return (f"{value['notification_id']} -> {value['user_id']} template {value['template_id']}"
            f" [{value['priority']}] message_key {value['message_key']}")


def print_summary(cfg: Settings, say: Callable[[str], None]) -> None:
    by_topic = {
        topic: [describe(topic, value, cfg.topics) for _, value in records]
        for topic, records in kafka_io.read_outputs(cfg.kafka.client_config(), cfg.topics).items()
    }
    say("")
    say("What landed in each topic (read_committed):")
    for topic, lines in by_topic.items():
        say(f"  {topic}: {len(lines)}")
        for line in lines:
            say(f"      {line}")


def run_demo(base: Settings, say: Callable[[str], None] = print, keep: bool = False) -> None:
    from jobs.runner import run_job

    work = Path(tempfile.mkdtemp(prefix="notify-dedup-demo-"))
    broker = LocalBroker(home=work / "kafka", port=free_port(), controller_port=free_port())
    client = None
    try:
        say(f"Starting a Kafka broker (KRaft) on {broker.bootstrap} ...")
        broker.start()
        cfg = demo_settings(base, broker.bootstrap, work)
        created = kafka_io.ensure_topics(cfg.kafka, cfg.topics.all())
        say(f"Created {len(created)} topics, {cfg.kafka.partitions} partitions each.")
        say("Starting the dedup job on the Flink mini-cluster (RocksDB, exactly-once) ...")
        client = run_job(cfg, detached=True)
        say(f"  job {client.get_job_id()}, REST on 127.0.0.1:{cfg.flink.rest_port}")
        want = {getattr(cfg.topics, k): n for k, n in scenario.EXPECTED_COUNTS.items() if n}
        before_barrier = {getattr(cfg.topics, k): n for k, n in scenario.EXPECTED_BEFORE_BARRIER.items() if n}
        say("Producing the story (three users; event times from ten minutes ago):")
        produce_scenario(cfg, lambda _: wait_for_counts(cfg, before_barrier, 180), say)
        wait_for_counts(cfg, want, 120)
        print_summary(cfg, say)
        from harness.senders_demo import run_senders_demo

        run_senders_demo(cfg, say)
    finally:
        if client is not None:
            try:
                client.cancel().result()
                time.sleep(2)  # let the job's Kafka clients close before the broker goes
            except Exception:  # noqa: BLE001 - the mini-cluster may be gone already
                logger.debug("cancel failed", exc_info=True)
        broker.stop()
        say("Stopped the job, the senders and the broker.")
        if not keep:
            shutil.rmtree(work, ignore_errors=True)

