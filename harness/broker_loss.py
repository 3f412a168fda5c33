"""How long ``acks=all`` writes wait when one broker of a local cluster is lost.

``python -m harness.broker_loss [--brokers 3] [--partitions 6] [--rounds 2] [--how kill|stop]
[--victim leader|controller|broker]`` starts a cluster of its own, writes to every partition of a
topic (replicas: the cluster's default) every 10 ms with an idempotent ``acks=all`` producer, and
per round loses a node, by SIGKILL (a crash) and by SIGTERM (a controlled shutdown) unless
``--how`` names one, then starts it again. The node lost is the one leading the most partitions
(``leader``), the active controller (``controller``: its loss first elects another), or the
node leading the most partitions among the others (``broker``). For each loss it prints, as
JSON, whether the node was the active controller, how long the cluster took to drop the node
from the metadata and the longest acknowledgement per partition written around the loss.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from confluent_kafka import Producer

from harness.local_kafka import BrokerError, LocalCluster
from ops import kafka_io


@dataclass(frozen=True)
class Loss:
    """One lost node: ``how`` (kill or stop), seconds until the metadata left it out, and the
    longest acknowledgement of a record sent to each partition in the 30 s around it."""

    how: str
    node: int
    was_controller: bool
    fenced_after_s: float
    longest_ack_s: dict[int, float]
    failed: int


class Writer(threading.Thread):
    """Sends a record to every partition every 10 ms; keeps (sent at, acked after, partition)."""

    def __init__(self, bootstrap: str, topic: str, partitions: int) -> None:
        super().__init__(daemon=True)
        self.producer = Producer({"bootstrap.servers": bootstrap, "enable.idempotence": "true", "acks": "all",
                                  "linger.ms": "1", "delivery.timeout.ms": "120000"})
        self.topic, self.partitions = topic, partitions
        self.acks: list[tuple[float, float, int]] = []
        self.failed = 0
        self.stop_event = threading.Event()

    def run(self) -> None:
        while not self.stop_event.is_set():
            for p in range(self.partitions):
                sent = time.monotonic()

                def done(err: Any, _msg: Any, sent: float = sent, p: int = p) -> None:
                    if err is not None:
                        self.failed += 1
                    else:
                        self.acks.append((sent, time.monotonic() - sent, p))

                self.producer.produce(self.topic, value=b"x", partition=p, on_delivery=done)
            self.producer.poll(0)
            time.sleep(0.01)
        self.producer.flush(120)


VICTIMS = ("leader", "controller", "broker")


@dataclass(frozen=True)
class Victim:
    """The node to lose, whether it is the active controller, and how many partitions it leads."""

    node: int
    was_controller: bool
    led_partitions: int


def victim(cluster: LocalCluster, topic: str, which: str) -> Victim:
    """The node to lose (``VICTIMS``): the one leading the most of ``topic``'s partitions, the
    active controller, or the one leading the most of them among the nodes that are not it."""
    controller = cluster.active_controller()
    leaders = cluster.leaders([topic])
    if which == "controller":
        if controller is None:
            raise BrokerError("no running node is the active controller (its election is not in the logs)")
        node = controller
    else:
        node = max((k for k in leaders if which == "leader" or k != controller), key=lambda k: leaders[k])
    return Victim(node, node == controller, leaders[node])


@dataclass(frozen=True)
class Outage:
    """A node lost and back: seconds from its loss until the cluster fenced it (dropped it from
    the metadata) and until every replica was in sync again."""

    node: int
    fenced_after_s: float
    back_in_sync_after_s: float


def lose_and_restore(cluster: LocalCluster, node: int, how: str = "kill", *,
                     while_down: Callable[[float], None] | None = None) -> Outage:
    """Lose ``node`` (``kill``: SIGKILL, a crash; ``stop``: SIGTERM, a controlled shutdown), wait
    until the cluster has fenced it, call ``while_down`` with the monotonic time of the loss, then
    start the node again and wait until every replica is in sync."""
    at = time.monotonic()
    if how == "kill":
        cluster.kill(node)
    else:
        cluster.stop_node(node)
    cluster.wait_brokers(cluster.size - 1, timeout_s=120, exactly=True)
    fenced = time.monotonic() - at
    if while_down is not None:
        while_down(at)
    cluster.start_node(node)
    cluster.wait_in_sync()
    return Outage(node, round(fenced, 2), round(time.monotonic() - at, 2))


def lose_one(cluster: LocalCluster, writer: Writer, how: str, which: str = "leader") -> Loss:
    lost = victim(cluster, writer.topic, which)
    failed_before = writer.failed
    longest: dict[int, float] = {p: 0.0 for p in range(writer.partitions)}

    def longest_acks(at: float) -> None:
        time.sleep(max(0.0, at + 20 - time.monotonic()))  # writes go on with the node down
        for sent, took, p in list(writer.acks):
            if at - 5 <= sent <= at + 25:
                longest[p] = max(longest[p], round(took, 2))

    outage = lose_and_restore(cluster, lost.node, how, while_down=longest_acks)
    return Loss(how, lost.node, lost.was_controller, outage.fenced_after_s, longest, writer.failed - failed_before)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m harness.broker_loss",
                                     description="how long acks=all writes wait when a broker is lost")
    parser.add_argument("--brokers", type=int, default=3)
    parser.add_argument("--partitions", type=int, default=6)
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--how", choices=("kill", "stop"), help="only this way of losing a node (default: both)")
    parser.add_argument("--victim", choices=VICTIMS, default="leader", help="which node is lost (default: leader)")
    args = parser.parse_args(argv)
    home = Path(tempfile.mkdtemp(prefix="notify-dedup-broker-loss-"))
    cluster = LocalCluster.on_free_ports(home, args.brokers)
    cluster.start()
    writer = None
    try:
        topic = f"broker-loss-{uuid.uuid4().hex[:8]}"
        kafka_io.create_topics({"bootstrap.servers": cluster.bootstrap}, [topic], args.partitions)
        writer = Writer(cluster.bootstrap, topic, args.partitions)
        writer.start()
        time.sleep(5)
        for _ in range(args.rounds):
            for how in [args.how] if args.how else ["kill", "stop"]:
                sys.stdout.write(json.dumps(asdict(lose_one(cluster, writer, how, args.victim))) + "\n")
                sys.stdout.flush()
    finally:
        if writer is not None:
            writer.stop_event.set()
            writer.join(150)
        cluster.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
