"""A producer's own CPU per record against local brokers, with nothing else running:
``python -m bench.producer_cpu [--brokers 3] [--rate 1000] [--seconds 15] [--warmup 10]
[--set KEY=VALUE ...]``.

The producer is configured as the API's (``api.producer.DELIVERY_SETTINGS``, ``linger.ms`` 1)
unless ``--set`` says otherwise (``--set enable.idempotence=true`` is what the API ran before
stop 37); the topic has 3 partitions, replication ``min(3, brokers)`` and
``min.insync.replicas`` ``min(2, brokers)``. After ``--warmup`` seconds at the
rate (the brokers' JIT), prints and writes ``bench/results/producer-cpu-<date>-<label>.json``:
records sent and acknowledged, their acknowledgement's p50/p99/max, how often librdkafka's broker
threads woke (its statistics, every second), the producer's CPU seconds and per record, each
broker's CPU share, the load average.
"""

from __future__ import annotations

import argparse
import datetime as dt
import functools
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

from api.producer import DELIVERY_SETTINGS
from bench.measure import percentile
from harness.local_kafka import LocalCluster
from settings import REPO_ROOT

API_LIKE = {**DELIVERY_SETTINGS, "linger.ms": "1"}


def _cpu_s() -> float:
    ru = resource.getrusage(resource.RUSAGE_SELF)
    return ru.ru_utime + ru.ru_stime


def measure(brokers: int, rate: float, seconds: float, warmup: float, extra: dict[str, str]) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="bench-producer-cpu-") as home:
        cluster = LocalCluster.on_free_ports(Path(home), brokers)
        cluster.start()
        try:
            client = {"bootstrap.servers": cluster.bootstrap}
            topic = NewTopic("producer-cpu", 3, min(3, brokers), config={"min.insync.replicas": str(min(2, brokers))})
            admin = AdminClient(client)  # kept until its futures are done
            for future in admin.create_topics([topic]).values():
                future.result()
            wakeups: list[int] = []  # the broker threads' wake-ups so far, at each statistics report

            def statistics(report: str) -> None:
                brokers = json.loads(report)["brokers"].values()
                wakeups.append(sum(b["wakeups"] for b in brokers if b["nodeid"] >= 0))

            config = {**client, **API_LIKE, "statistics.interval.ms": "1000", "stats_cb": statistics, **extra}
            producer = Producer(config)
            errors: list[KafkaError] = []
            ack_s: list[float] = []

            def delivered(err: KafkaError | None, _msg: Message, produced: float) -> None:
                ack_s.append(time.monotonic() - produced)
                if err is not None:
                    errors.append(err)

            def drive(seconds: float) -> int:
                start, sent = time.monotonic(), 0
                while (now := time.monotonic()) - start < seconds:
                    while sent < int((now - start) * rate):
                        producer.produce("producer-cpu", b"x" * 300, key=str(sent).encode(),
                                         on_delivery=functools.partial(delivered, produced=time.monotonic()))
                        sent += 1
                    producer.poll(0.001)
                producer.flush(60)
                return sent

            drive(warmup)  # the brokers' JIT and the producer's connections, not measured
            ack_s.clear()
            errors.clear()
            procs = [psutil.Process(pid) for node in cluster.nodes if (pid := node.pid())]
            for p in procs:
                p.cpu_percent()
            cpu0, start, woken0 = _cpu_s(), time.monotonic(), wakeups[-1] if wakeups else 0
            sent = drive(seconds)
            woken = (wakeups[-1] if wakeups else 0) - woken0  # none yet: a run shorter than a report's second
            ack_s.sort()
            cpu = _cpu_s() - cpu0
            elapsed = time.monotonic() - start
            return {"brokers": brokers, "rate": rate, "warmup_s": warmup, "seconds": round(elapsed, 1),
                    "config": {**API_LIKE, **extra},
                    "sent": sent, "acknowledged": len(ack_s), "errors": len(errors),
                    "ack_ms": {f"p{q:g}": round((percentile(ack_s, q) or 0.0) * 1000, 1) for q in (50, 99, 100)},
                    "broker_thread_wakeups_per_s": round(woken / elapsed),
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
    parser.add_argument("--warmup", type=float, default=10.0, help="seconds at the rate before measuring")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="a producer setting")
    parser.add_argument("--label", default="run")
    args = parser.parse_args(argv)
    extra = dict(item.split("=", 1) for item in args.set)
    result = {"date": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
              "command": "python -m bench.producer_cpu " + " ".join(argv if argv is not None else sys.argv[1:]),
              **measure(args.brokers, args.rate, args.seconds, args.warmup, extra)}
    out = REPO_ROOT / "bench" / "results" / f"producer-cpu-{dt.date.today().isoformat()}-{args.label}.json"
    out.write_text(json.dumps(result, indent=1) + "\n", encoding="utf-8")
    print(json.dumps(result, indent=1))
    print(f"-> {out.relative_to(REPO_ROOT)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
