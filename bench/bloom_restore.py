"""The Bloom prefilter in numbers: share of new keys that skip the state read, in steady state
and in the first minute after a restore (at another parallelism), false-positive rate against
the configured one, and bits per key.

    python -m bench.bloom_restore [--requests 150000] [--rate 1500]

Writes bench/results/bloom-restore-<date>.json.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import platform
import shutil
import tempfile
import time
from datetime import date
from pathlib import Path

from harness.local_kafka import LocalBroker
from harness.ports import free_port
from harness.streamgen import StreamSpec, generate
from jobs.runner import run_job
from operators.contract import Topics
from operators.metric_names import (
    ACCEPTED,
    BLOOM_BITS,
    BLOOM_FALSE_POSITIVES,
    DEDUP_OPERATOR,
    DUPLICATES,
    KEYS_HELD,
    LATE,
    STATE_READS,
    STATE_READS_SKIPPED,
)
from ops import kafka_io
from ops.flink_rest import RestClient
from settings import Settings

NAMES = [ACCEPTED, DUPLICATES, LATE, STATE_READS, STATE_READS_SKIPPED, BLOOM_FALSE_POSITIVES, KEYS_HELD, BLOOM_BITS]


def figures(m: dict[str, float]) -> dict[str, float]:
    absent = m[STATE_READS_SKIPPED] + m[BLOOM_FALSE_POSITIVES]  # lookups of keys not in state
    return {
        **m,
        "skip_share_of_new_keys": m[STATE_READS_SKIPPED] / absent if absent else 0.0,
        "false_positive_rate": m[BLOOM_FALSE_POSITIVES] / absent if absent else 0.0,
        "bloom_bits_per_key_held": m[BLOOM_BITS] / m[KEYS_HELD] if m[KEYS_HELD] else 0.0,
    }


def settle(rest: RestClient, job_id: str, total: int, timeout_s: float) -> dict[str, float]:
    deadline = time.monotonic() + timeout_s
    m = rest.operator_metrics(job_id, DEDUP_OPERATOR, NAMES)
    while m[ACCEPTED] + m[DUPLICATES] + m[LATE] < total and time.monotonic() < deadline:
        time.sleep(2)
        m = rest.operator_metrics(job_id, DEDUP_OPERATOR, NAMES)
    time.sleep(11)  # one more metric-fetcher refresh, for the gauges
    return rest.operator_metrics(job_id, DEDUP_OPERATOR, NAMES)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=150_000)
    parser.add_argument("--rate", type=int, default=1500, help="records/s in the minute after the restore")
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="bloom-restore-"))
    broker = LocalBroker(home=work / "kafka", port=free_port(), controller_port=free_port())
    broker.start()
    try:
        topics = Topics().with_prefix("bench.")
        kafka_io.create_topics({"bootstrap.servers": broker.bootstrap}, topics.all(), 4)
        cfg = Settings(topics=topics).with_overrides(
            kafka={"bootstrap_servers": broker.bootstrap, "group_id": "bloom-bench"},
            flink={"parallelism": 2, "checkpoint_dir": str(work / "ck"), "checkpoint_interval_ms": 2000,
                   "rest_port": free_port(), "transactional_id_prefix": "bloom-bench"},
            dedup={"bloom_expected_keys": args.requests * 4 // 3, "bloom_fp_rate": 0.01},
        )
        spec = StreamSpec(requests=args.requests, partitions=4, seed=3, late_share=0, invalid_share=0,
                          step_ms=2, param_bytes=200)
        first = generate(spec)
        newest = max(r.request.event_time for r in first.records if r.request)
        after = generate(dataclasses.replace(spec, requests=args.rate * 60, seed=4, id_prefix="r",
                                             start_ms=newest))
        prod = kafka_io.producer(cfg.kafka.client_config())
        kafka_io.produce_all(prod, topics.requests, [(r.key, r.value) for r in first.records])
        client = run_job(cfg, detached=True)
        rest = RestClient(f"http://127.0.0.1:{cfg.flink.rest_port}")
        steady = figures(settle(rest, str(client.get_job_id()), len(first.records), 600))
        location = rest.stop_with_savepoint(str(client.get_job_id()), str(work / "sp"))
        time.sleep(3)
        cfg1 = cfg.with_overrides(flink={"parallelism": 1, "rest_port": free_port()})
        client = run_job(cfg1, location.removeprefix("file:"), detached=True)
        rest = RestClient(f"http://127.0.0.1:{cfg1.flink.rest_port}")
        # the first minute after the restore: new users' requests and repeats of earlier ones
        # (repeats of the last requests before the restore, then the new stream: 20% repeats)
        records = first.records[-args.rate * 6:] + after.records[: args.rate * 54]
        start = time.monotonic()
        for i in range(0, len(records), args.rate // 10):
            kafka_io.produce_all(prod, topics.requests, [(r.key, r.value) for r in records[i:i + args.rate // 10]])
            time.sleep(max(0.0, start + (i + args.rate // 10) / args.rate - time.monotonic()))
        restored = figures(settle(rest, str(client.get_job_id()), len(records), 300))
        client.cancel().result()
        result = {
            "command": "python -m bench.bloom_restore " + f"--requests {args.requests} --rate {args.rate}",
            "date": str(date.today()),
            "machine": {"cpus": __import__("os").cpu_count(), "python": platform.python_version()},
            "configured_fp_rate": 0.01,
            "bloom_expected_keys": cfg.dedup.bloom_expected_keys,
            "steady_state_parallelism_2": steady,
            "first_minute_after_restore_parallelism_1": restored,
        }
        out = Path(__file__).resolve().parent / "results" / f"bloom-restore-{date.today()}.json"
        out.write_text(json.dumps(result, indent=2))
        print(json.dumps(result, indent=2))
    finally:
        broker.stop()
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
