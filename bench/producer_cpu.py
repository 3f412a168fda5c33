"""A producer's own CPU per record against local brokers, with nothing else running:
``python -m bench.producer_cpu [--brokers 3] [--rate 1000] [--seconds 15] [--set KEY=VALUE ...]``.

The producer is configured as the API's (``enable.idempotence``, ``acks=all``, ``linger.ms`` 1)
unless ``--set`` says otherwise; the topic has 3 partitions, replication ``min(3, brokers)`` and
``min.insync.replicas`` ``min(2, brokers)``. Prints and writes
``bench/results/producer-cpu-<date>-<label>.json``: records sent and acknowledged, the
producer's CPU seconds and per record, each broker's CPU share, the load average.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import resource
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import psutil
from confluent_kafka import KafkaError, Message, Producer
from confluent_kafka.admin import AdminClient, NewTopic

from harness.local_kafka import LocalCluster
from settings import REPO_ROOT

API_LIKE = {"enable.idempotence": "true", "acks": "all", "linger.ms": "1"}


def _cpu_s() -> float:
    ru = resource.getrusage(resource.RUSAGE_SELF)
    return ru.ru_utime + ru.ru_stime


def measure(brokers: int, rate: float, seconds: float, extra: dict[str, str]) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="bench-producer-cpu-") as home:
        cluster = LocalCluster.on_free_ports(Path(home), brokers)
        cluster.start()
        try:
            client = {"bootstrap.servers": cluster.bootstrap}
            topic = NewTopic("producer-cpu", 3, min(3, brokers), config={"min.insync.replicas": str(min(2, brokers))})
            admin = AdminClient(client)  # kept until its futures are done
            for future in admin.create_topics([topic]).values():
                future.result()
            config = {**client, **API_LIKE, **extra}
            producer = Producer(config)
            errors: list[KafkaError] = []
            acked = [0]

            def delivered(err: KafkaError | None, _msg: Message) -> None:
                acked[0] += 1
                if err is not None:
                    errors.append(err)

            procs = [psutil.Process(pid) for node in cluster.nodes if (pid := node.pid())]
            for p in procs:
                p.cpu_percent()
            cpu0, start, sent = _cpu_s(), time.monotonic(), 0
            while (now := time.monotonic()) - start < seconds:
                due = int((now - start) * rate)
                while sent < due:
                    producer.produce("producer-cpu", b"x" * 300, key=str(sent).encode(), on_delivery=delivered)
                    sent += 1
                producer.poll(0.001)
            producer.flush(60)
            cpu = _cpu_s() - cpu0
            elapsed = time.monotonic() - start
            return {"brokers": brokers, "rate": rate, "seconds": round(elapsed, 1), "config": {**API_LIKE, **extra},
                    "sent": sent, "acknowledged": acked[0], "errors": len(errors),
                    "producer_cpu_s": round(cpu, 2), "producer_cpu_ms_per_record": round(cpu * 1000 / max(1, sent), 3),
                    "broker_cpu_percent": [round(p.cpu_percent(), 1) for p in procs],
                    "load_average": [round(x, 2) for x in os.getloadavg()]}
        finally:
            cluster.stop()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.producer_cpu", description=__doc__.split("\n\n")[0])
    parser.add_argument("--brokers", type=int, default=3)
    parser.add_argument("--rate", type=float, default=1000.0, help="records per second")
    parser.add_argument("--seconds", type=float, default=15.0)
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="a producer setting")
    parser.add_argument("--label", default="run")
    args = parser.parse_args(argv)
    extra = dict(item.split("=", 1) for item in args.set)
    result = {"date": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
              "command": "python -m bench.producer_cpu " + " ".join(argv if argv is not None else sys.argv[1:]),
              **measure(args.brokers, args.rate, args.seconds, extra)}
    out = REPO_ROOT / "bench" / "results" / f"producer-cpu-{dt.date.today().isoformat()}-{args.label}.json"
    out.write_text(json.dumps(result, indent=1) + "\n", encoding="utf-8")
    print(json.dumps(result, indent=1))
    print(f"-> {out.relative_to(REPO_ROOT)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
