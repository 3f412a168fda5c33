"""What the job's sink leaves on the broker by its transaction naming: ``python -m
bench.transaction_ids [--naming pooling|incrementing] [--seconds 100] [--rate 200] [--parallelism 2]``.

One local broker, the job (``dedupctl run``, the 500 ms checkpoint interval) fed ``--rate``
requests/s for ``--seconds``, then stopped; then, by Kafka's Admin API
(``harness.kafka_transactions``), the transactional ids with the job's prefix and the producer
ids the output topics' partitions keep. Prints one JSON line.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bench.dataset import DatasetSpec, build, bulk_producer
from harness.kafka_transactions import held
from harness.local_kafka import LocalCluster
from harness.ports import free_port
from harness.settings_file import write_settings
from ops import kafka_io
from settings import REPO_ROOT, Settings

PREFIX = "txids"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--naming", choices=["pooling", "incrementing"], default="pooling")
    parser.add_argument("--seconds", type=float, default=100.0)
    parser.add_argument("--rate", type=float, default=200.0)
    parser.add_argument("--parallelism", type=int, default=2)
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="transaction-ids-"))
    cluster = LocalCluster.on_free_ports(work / "kafka", 1)
    cluster.start()
    try:
        cfg = Settings(data_dir=str(work)).with_overrides(
            kafka={"bootstrap_servers": cluster.bootstrap},
            flink={"checkpoint_dir": str(work / "checkpoints"), "rest_port": free_port(),
                   "transactional_id_prefix": PREFIX, "transaction_naming": args.naming,
                   "parallelism": args.parallelism})
        kafka_io.ensure_topics(cfg.kafka, cfg.topics.all(), 4)
        config = write_settings(cfg, work / "job.toml")
        data = build(DatasetSpec(backlog=0, live_pool=int(args.seconds * args.rate)))
        with open(work / "job.log", "wb") as log:
            job = subprocess.Popen([sys.executable, "-m", "dedupctl.cli", "--config", str(config), "run"],
                                   cwd=REPO_ROOT, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        try:
            time.sleep(15)  # the job starts
            producer = bulk_producer(cluster.bootstrap)
            start = time.monotonic()
            for i in range(len(data)):
                while time.monotonic() - start < i / args.rate:
                    producer.poll(0.005)
                producer.produce(cfg.topics.requests, value=data.avro[i], key=data.keys[i],
                                 partition=data.partitions[i])
            producer.flush(30)
            time.sleep(5)
        finally:
            os.killpg(job.pid, signal.SIGTERM)
            job.wait(120)
        outputs = cfg.topics.outputs()
        found = held(cluster.bootstrap, outputs)
        print(json.dumps({
            "naming": args.naming, "seconds": args.seconds, "rate": args.rate, "parallelism": args.parallelism,
            "transactional_ids": len(found.ids_with(PREFIX)),
            "producer_ids_max_per_partition": max(found.producers.values(), default=0),
            "producer_ids_by_topic": {t: sum(n for (topic, _), n in found.producers.items() if topic == t)
                                      for t in outputs},
        }))
    finally:
        cluster.stop()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
