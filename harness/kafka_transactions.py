"""What a Kafka cluster holds of transactional producers (Kafka's Admin API, through
``harness/KafkaTransactions.java`` run by the JDK on the broker's jars): every transactional id,
and how many producer ids each partition of some topics keeps. The job's sink leaves them
(``flink.transaction_naming``); ``tests/jobs/test_transactions.py`` and
``python -m bench.transaction_ids`` count them."""

from __future__ import annotations

import subprocess
from dataclasses import dataclass
from pathlib import Path

from harness.local_kafka import KAFKA_JARS

TOOL = Path(__file__).with_name("KafkaTransactions.java")


@dataclass(frozen=True)
class Held:
    """:param ids: transactional id -> state
    :param producers: (topic, partition) -> producer ids the partition keeps"""

    ids: dict[str, str]
    producers: dict[tuple[str, int], int]

    def ids_with(self, prefix: str) -> list[str]:
        return sorted(i for i in self.ids if i.startswith(prefix))


def held(bootstrap: str, topics: list[str] | tuple[str, ...] = ()) -> Held:
    out = subprocess.run(["java", "-cp", f"{KAFKA_JARS}/*", str(TOOL), bootstrap, *topics],
                         capture_output=True, text=True, timeout=120, check=True).stdout
    ids: dict[str, str] = {}
    producers: dict[tuple[str, int], int] = {}
    for line in out.splitlines():
        kind, *rest = line.split()
        if kind == "txn":
            ids[rest[0]] = rest[1]
        elif kind == "producers":
            producers[rest[0], int(rest[1])] = int(rest[2])
    return Held(ids, producers)
