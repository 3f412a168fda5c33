"""Apache Kafka (KRaft) on loopback, run from the jars Maven fetched: one broker, or a cluster of N
nodes that are each broker and controller.

A node is a ``LocalBroker``: its files under its own home (server.properties, data/, the pid
file, server.log), its client and controller ports. A ``LocalCluster`` is N of them with one
cluster id and one static controller quorum (``controller.quorum.voters``), internal topics with
``min(N, 3)`` replicas and, from 3 nodes on, ``min.insync.replicas`` 2. One node keeps the files
and ports of the single broker of before (``.data/kafka``, 9092/9093); N nodes live in
``<home>/node-<k>``. What runs is read back from those files, so ``dedupctl kafka stop`` or
``start --node K`` need not be told the cluster's size.
"""

from __future__ import annotations

import base64
import logging
import os
import re
import signal
import socket
import subprocess
import time
import uuid
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace
from pathlib import Path

from operators.errors import DedupError
from settings import REPO_ROOT
from settings.kafka import default_min_insync, local_replication

logger = logging.getLogger(__name__)

KAFKA_JARS = REPO_ROOT / ".cache" / "jars" / "kafka"
#: how long the controller waits for a node's heartbeats (one every quarter of it) before it fences
#: the node (``broker.session.timeout.ms``; Kafka's default is 9 s, heartbeats every 2 s). Until a
#: node that died is fenced, no ``acks=all`` record is acknowledged on any partition it is an
#: in-sync replica of (with 3 replicas on 3 nodes: every partition), so this bounds how long the
#: API's requests wait through a broker crash.
SESSION_TIMEOUT_MS = 4_000
#: how long a controller goes without hearing from the quorum's leader before it stands for
#: election (``controller.quorum.fetch.timeout.ms``; Kafka's default is 2 s). A crash of the node
#: that is the active controller costs this, the election, and then a whole session timeout: the
#: new controller starts every node's session afresh. Measured with ``python -m
#: harness.broker_loss --how kill --victim controller|broker`` on a quiet machine: at 6 s and 2 s
#: the active controller's crash was fenced after 8.1-8.8 s (a broker's after 5.3 s); at 4 s and
#: 1 s, after 5.1-6.4 s (a broker's after 3.7-4.5 s).
QUORUM_FETCH_TIMEOUT_MS = 1_000


class BrokerError(DedupError):
    """The local broker could not be started, reached or stopped."""


#: what Kafka's own start script runs a broker with (``KAFKA_JVM_PERFORMANCE_OPTS`` of
#: bin/kafka-run-class.sh): G1 aiming at 20 ms pauses, its concurrent cycle started early. With
#: G1's default aim (200 ms) the broker's young collections beside the whole pipeline paused it
#: 29 / 57 / 72 ms (p50 / p90 / max, one every ~15 s), each a stall of every acknowledgement the
#: API waits for; with these 15 / 27 / 38 ms (``python -m bench.slo --quick --accept-rates 1000``,
#: the broker's ``gc.log``). The pauses are logged to ``LocalBroker.gc_log``.
BROKER_JVM_OPTIONS = ("-XX:+UseG1GC", "-XX:MaxGCPauseMillis=20", "-XX:InitiatingHeapOccupancyPercent=35",
                      "-XX:+ExplicitGCInvokesConcurrent")
#: the broker's heap: Kafka's own start script's (``kafka-server-start.sh``: 1 GB). Beside the whole
#: pipeline a broker keeps ~190-205 MB after each young collection; at 512 MB that is over G1's 35%
#: mark (179 MB), so G1 ran one concurrent cycle after another that freed nothing (in one 2,000/s
#: run of bench.slo: 12 marking cycles of 75-100 ms, 12 remark and 12 cleanup pauses, 15 mixed
#: collections; at 1 GB: none after start-up). What that buys the accept p99 at 2,000/s is within
#: the machine's spread there: 104-225 ms (median 128) in six runs at 512 MB, 72.1-211 ms (median
#: 114) in seven at 1 GB (bench/results, s39-*).
BROKER_HEAP_MB = 1024


@dataclass(frozen=True)
class LocalBroker:
    """Where a local broker keeps its files and which ports it answers on.

    :param home: data, logs, pid file and server.properties live here
    :param port: client (PLAINTEXT) port on 127.0.0.1
    :param controller_port: KRaft controller port on 127.0.0.1
    :param heap_mb: JVM heap of the broker
    :param node_id: its ``node.id``
    :param voters: the controller quorum (``1@127.0.0.1:9093,...``); empty: this node alone
    :param replication: replicas of the internal topics (offsets, transactions) and the
        ``default.replication.factor`` of the cluster; ``min.insync.replicas`` follows from it
    :param cluster_id: the id its storage is formatted with when it has none; None: a new one
    """

    home: Path
    port: int = 9092
    controller_port: int = 9093
    heap_mb: int = BROKER_HEAP_MB
    node_id: int = 1
    voters: str = ""
    replication: int = 1
    cluster_id: str | None = None

    @property
    def bootstrap(self) -> str:
        return f"127.0.0.1:{self.port}"

    @property
    def pid_file(self) -> Path:
        return self.home / "kafka.pid"

    @property
    def gc_log(self) -> Path:
        """The JVM's collections, each with its wall-clock time and pause (``bench.measure.gc_pauses``)."""
        return self.home / "gc.log"

    @property
    def log_file(self) -> Path:
        return self.home / "server.log"

    @property
    def config_file(self) -> Path:
        return self.home / "server.properties"

    def properties(self) -> str:
        voters = self.voters or f"{self.node_id}@127.0.0.1:{self.controller_port}"
        rf, isr = self.replication, default_min_insync(self.replication)
        return "\n".join(
            [
                "process.roles=broker,controller",
                f"node.id={self.node_id}",
                f"controller.quorum.voters={voters}",
                f"listeners=PLAINTEXT://127.0.0.1:{self.port},CONTROLLER://127.0.0.1:{self.controller_port}",
                f"advertised.listeners=PLAINTEXT://127.0.0.1:{self.port}",
                "controller.listener.names=CONTROLLER",
                "listener.security.protocol.map=PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT",
                "inter.broker.listener.name=PLAINTEXT",
                f"log.dirs={self.home / 'data'}",
                "num.partitions=1",
                "auto.create.topics.enable=false",
                f"default.replication.factor={rf}",
                f"min.insync.replicas={isr}",
                f"offsets.topic.replication.factor={rf}",
                "offsets.topic.num.partitions=4",
                f"transaction.state.log.replication.factor={rf}",
                f"transaction.state.log.min.isr={isr}",
                "transaction.state.log.num.partitions=4",
                "transaction.max.timeout.ms=900000",
                "group.initial.rebalance.delay.ms=0",
                f"broker.session.timeout.ms={SESSION_TIMEOUT_MS}",
                f"broker.heartbeat.interval.ms={SESSION_TIMEOUT_MS // 4}",
                f"controller.quorum.fetch.timeout.ms={QUORUM_FETCH_TIMEOUT_MS}",
                f"share.coordinator.state.topic.replication.factor={rf}",
                f"share.coordinator.state.topic.min.isr={isr}",
                "",
            ]
        )

    @classmethod
    def written(cls, home: Path) -> LocalBroker | None:
        """The broker whose server.properties is in ``home``, as it was last started; None if none."""
        try:
            text = (home / "server.properties").read_text()
        except OSError:
            return None
        props = dict(line.split("=", 1) for line in text.splitlines() if "=" in line)
        ports = re.search(r"PLAINTEXT://127\.0\.0\.1:(\d+),CONTROLLER://127\.0\.0\.1:(\d+)", props.get("listeners", ""))
        if ports is None:
            return None
        voters = props.get("controller.quorum.voters", "")
        return cls(home=home, port=int(ports[1]), controller_port=int(ports[2]),
                   node_id=int(props.get("node.id", "1")), voters=voters if "," in voters else "",
                   replication=int(props.get("default.replication.factor", "1")))

    def formatted_cluster_id(self) -> str | None:
        """The cluster id its storage was formatted with; None before the first start."""
        try:
            text = (self.home / "data" / "meta.properties").read_text()
        except OSError:
            return None
        found = re.search(r"^cluster\.id=(\S+)$", text, re.MULTILINE)
        return found[1] if found else None

    def pid(self) -> int | None:
        """The broker's pid when its process is alive, else None."""
        try:
            pid = int(self.pid_file.read_text().strip())
        except (OSError, ValueError):
            return None
        try:  # reap it if it is our own child that has exited
            if os.waitpid(pid, os.WNOHANG)[0] == pid:
                return None
        except ChildProcessError:
            pass  # not our child (started by another dedupctl)
        return pid if _alive(pid) else None

    def answers(self) -> bool:
        try:
            with socket.create_connection(("127.0.0.1", self.port), timeout=1):
                return True
        except OSError:
            return False

    def status(self) -> str:
        pid = self.pid()
        if pid is None:
            return f"stopped (home {self.home})"
        state = "running" if self.answers() else "starting"
        return f"{state}: pid {pid}, {self.bootstrap}, home {self.home}"

    def start(self, timeout_s: float = 90.0) -> None:
        """Start the broker unless it runs already; returns once it takes metadata requests."""
        self.launch()
        self.wait_ready(timeout_s)

    def launch(self) -> None:
        """Start the broker's process (formatting its storage first if need be), without waiting."""
        if self.pid() is not None:
            return
        if self.answers():
            raise BrokerError(f"port {self.port} is taken by another process")
        if not KAFKA_JARS.is_dir() or not any(KAFKA_JARS.glob("kafka_2.13-*.jar")):
            raise BrokerError(f"no Kafka jars in {KAFKA_JARS}: run `make jars` first")
        self.home.mkdir(parents=True, exist_ok=True)
        self.config_file.write_text(self.properties())
        classpath = f"{KAFKA_JARS}/*"
        if not (self.home / "data" / "meta.properties").exists():
            cluster_id = self.cluster_id or new_cluster_id()
            subprocess.run(  # "=": an id may start with "-", which would read as an option
                ["java", "-cp", classpath, "kafka.tools.StorageTool", "format",
                 f"--cluster-id={cluster_id}", "-c", str(self.config_file)],
                check=True, capture_output=True, timeout=120,
            )
        log4j = self.home / "log4j2.properties"
        log4j.write_text(
            "rootLogger.level=INFO\nrootLogger.appenderRef.out.ref=out\n"
            "appender.out.type=Console\nappender.out.name=out\n"
            "appender.out.layout.type=PatternLayout\nappender.out.layout.pattern=[%d] %p %m (%c)%n\n"
            "logger.kafka.name=kafka\nlogger.kafka.level=WARN\n"
            "logger.apache.name=org.apache.kafka\nlogger.apache.level=WARN\n"
            # the quorum's elections and the controller's fencing decisions, for the record
            "logger.raft.name=org.apache.kafka.raft.QuorumState\nlogger.raft.level=INFO\n"
            "logger.fence.name=org.apache.kafka.controller.ReplicationControlManager\nlogger.fence.level=INFO\n"
        )
        with open(self.log_file, "ab") as log:
            proc = subprocess.Popen(
                ["java", f"-Xmx{self.heap_mb}m", f"-Xms{self.heap_mb}m", *BROKER_JVM_OPTIONS,
                 f"-Xlog:gc:file={self.gc_log}:time,level,tags:filecount=2,filesize=10m",
                 f"-Dlog4j2.configurationFile={log4j}", "-cp", classpath, "kafka.Kafka", str(self.config_file)],
                stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True,
            )
        self.pid_file.write_text(str(proc.pid))
        logger.info("kafka broker starting", extra={"pid": proc.pid, "port": self.port, "node": self.node_id})

    def wait_ready(self, timeout_s: float = 90.0) -> None:
        """Until the broker answers metadata requests (a node of a cluster: once it has joined)."""
        from confluent_kafka.admin import AdminClient

        deadline = time.monotonic() + timeout_s
        admin = None
        while time.monotonic() < deadline:
            if self.pid() is None:
                raise BrokerError(f"the broker exited during start-up; see {self.log_file}")
            if self.answers():
                admin = admin or AdminClient({"bootstrap.servers": self.bootstrap})
                try:
                    admin.list_topics(timeout=5)
                    return
                except Exception:  # noqa: BLE001 - not ready yet, retry until the deadline
                    pass
            time.sleep(0.5)
        raise BrokerError(f"the broker did not answer within {timeout_s:.0f} s; see {self.log_file}")

    def stop(self, timeout_s: float = 30.0) -> bool:
        """Stop the broker (SIGTERM, then SIGKILL); returns False when it was not running."""
        pid = self.pid()
        if pid is None:
            return False
        os.kill(pid, signal.SIGTERM)
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline and self.pid() is not None:
            time.sleep(0.2)
        if self.pid() is not None:
            self.kill()
        self.pid_file.unlink(missing_ok=True)
        return True

    def kill(self, timeout_s: float = 30.0) -> bool:
        """SIGKILL the broker and wait until its process is gone; False when it was not running."""
        pid = self.pid()
        if pid is None:
            return False
        os.kill(pid, signal.SIGKILL)
        deadline = time.monotonic() + timeout_s
        while self.pid() is not None:
            if time.monotonic() > deadline:
                raise BrokerError(f"the broker (pid {pid}) outlived SIGKILL by {timeout_s:.0f} s")
            time.sleep(0.05)
        self.pid_file.unlink(missing_ok=True)
        return True


def _alive(pid: int) -> bool:
    """The process exists and is not a zombie: a broker whose parent exited (started by another
    dedupctl) is reaped by PID 1, which may take its time."""
    try:
        os.kill(pid, 0)
    except OSError:
        return False
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return True  # no /proc: trust the signal
    return stat.rpartition(")")[2].split()[0] != "Z"


def new_cluster_id() -> str:
    return base64.urlsafe_b64encode(uuid.uuid4().bytes).decode().rstrip("=")


@dataclass(frozen=True)
class LocalCluster:
    """N local brokers, each broker and controller, with one cluster id and one quorum.

    Build one with ``LocalCluster.layout`` (the ports given) or ``LocalCluster.on_free_ports``;
    ``LocalCluster.written`` reads back the one whose files are in a home.

    :param home: the cluster's directory; one node uses it as its own home, N nodes ``node-<k>``
    :param nodes: the brokers, node 1 first
    """

    home: Path
    nodes: tuple[LocalBroker, ...]

    @classmethod
    def layout(cls, home: Path, ports: Sequence[tuple[int, int]], heap_mb: int = BROKER_HEAP_MB) -> LocalCluster:
        """A cluster of ``len(ports)`` nodes, node k on the k-th (client port, controller port)."""
        if not ports:
            raise BrokerError("a cluster needs at least one node")
        if len(ports) == 1:
            (port, controller), = ports
            return cls(home, (LocalBroker(home=home, port=port, controller_port=controller, heap_mb=heap_mb),))
        voters = ",".join(f"{k}@127.0.0.1:{c}" for k, (_, c) in enumerate(ports, 1))
        nodes = [
            LocalBroker(home=home / f"node-{k}", port=p, controller_port=c, heap_mb=heap_mb, node_id=k,
                        voters=voters, replication=local_replication(len(ports)))
            for k, (p, c) in enumerate(ports, 1)
        ]
        return cls(home, _one_cluster_id(home, nodes))

    @classmethod
    def on_free_ports(cls, home: Path, brokers: int = 1, heap_mb: int = BROKER_HEAP_MB) -> LocalCluster:
        from harness.ports import free_port

        return cls.layout(home, [(free_port(), free_port()) for _ in range(brokers)], heap_mb)

    @classmethod
    def written(cls, home: Path) -> list[LocalCluster]:
        """The clusters whose files are in ``home``: the one-node layout, the N-node one, both or none."""
        found = []
        single = LocalBroker.written(home)
        if single is not None:
            found.append(cls(home, (single,)))
        nodes = [b for d in sorted(home.glob("node-*")) if (b := LocalBroker.written(d)) is not None]
        if nodes:
            found.append(cls(home, _one_cluster_id(home, sorted(nodes, key=lambda b: b.node_id))))
        return found

    @property
    def size(self) -> int:
        return len(self.nodes)

    @property
    def bootstrap(self) -> str:
        """Every node's client address: what clients should bootstrap from."""
        return ",".join(n.bootstrap for n in self.nodes)

    def node(self, k: int) -> LocalBroker:
        """Node ``k`` (from 1)."""
        if not 1 <= k <= self.size:
            raise BrokerError(f"no node {k}: the cluster in {self.home} has nodes 1 to {self.size}")
        return self.nodes[k - 1]

    def running(self) -> list[int]:
        """The nodes whose process is alive."""
        return [n.node_id for n in self.nodes if n.pid() is not None]

    def start(self, timeout_s: float = 120.0) -> None:
        """Start every node that is not running; returns once every one has joined the cluster
        (and, with more than one, the internal topics exist with their replicas)."""
        for n in self.nodes:
            if n.pid() is None and n.answers():
                raise BrokerError(f"port {n.port} of node {n.node_id} is taken by another process")
        with ThreadPoolExecutor(self.size) as pool:  # formatting is a JVM start per node: in parallel
            list(pool.map(LocalBroker.launch, self.nodes))
        for n in self.nodes:
            n.wait_ready(timeout_s)
        self.wait_brokers(self.size, timeout_s)
        if self.size > 1:
            self._create_internal_topics(timeout_s)

    def stop(self) -> list[int]:
        """Stop every node (SIGTERM, all at once: one by one, the last would wait for a quorum
        that is gone); returns the nodes that were running."""
        with ThreadPoolExecutor(self.size) as pool:
            stopped = list(pool.map(LocalBroker.stop, self.nodes))
        return [n.node_id for n, was in zip(self.nodes, stopped, strict=True) if was]

    def kill(self, k: int) -> bool:
        """SIGKILL node ``k``: no controlled shutdown, what a crashed machine does."""
        return self.node(k).kill()

    def stop_node(self, k: int) -> bool:
        return self.node(k).stop()

    def start_node(self, k: int, timeout_s: float = 120.0) -> None:
        """Start node ``k`` again; returns once the cluster lists it."""
        self.node(k).start(timeout_s)
        self.wait_brokers(1, timeout_s, including=k)

    def restart(self, k: int, timeout_s: float = 120.0) -> None:
        """Stop node ``k`` if it runs, start it again and wait until it is back in every ISR."""
        self.stop_node(k)
        self.start_node(k, timeout_s)
        self.wait_in_sync(timeout_s)

    def live_brokers(self, timeout_s: float = 10.0) -> list[int]:
        """The broker ids the cluster's metadata lists (KRaft lists the unfenced ones)."""
        from confluent_kafka.admin import AdminClient

        admin = AdminClient({"bootstrap.servers": self.bootstrap})
        return sorted(admin.list_topics(timeout=timeout_s).brokers)

    def active_controller(self) -> int | None:
        """The node that leads the controller quorum (the active controller), from the nodes'
        logs: the latest epoch a node took the lead in, if that node runs; None if none does."""
        latest: tuple[int, int] | None = None
        for n in self.nodes:
            try:
                text = n.log_file.read_text(errors="replace")
            except OSError:
                continue
            for epoch in re.findall(r"Completed transition to Leader\(.*?\bepoch=(\d+)", text):
                if latest is None or int(epoch) > latest[0]:
                    latest = (int(epoch), n.node_id)
        if latest is None or self.node(latest[1]).pid() is None:
            return None
        return latest[1]

    def leaders(self, topics: Sequence[str]) -> dict[int, int]:
        """Node -> how many partitions of ``topics`` it leads (every node, 0 for none)."""
        from confluent_kafka.admin import AdminClient

        md = AdminClient({"bootstrap.servers": self.bootstrap}).list_topics(timeout=10)
        counts = {n.node_id: 0 for n in self.nodes}
        for t in topics:
            for pm in md.topics[t].partitions.values():
                if pm.leader in counts:
                    counts[pm.leader] += 1
        return counts

    def wait_brokers(self, count: int, timeout_s: float = 60.0, including: int | None = None,
                     exactly: bool = False) -> list[int]:
        """Until the metadata lists at least (``exactly``: just) ``count`` brokers, ``including``
        that one; returns them. After a SIGKILL the count drops once the controller has fenced
        the node (``broker.session.timeout.ms``: ``SESSION_TIMEOUT_MS``)."""
        deadline = time.monotonic() + timeout_s
        seen: list[int] = []
        while time.monotonic() < deadline:
            try:
                seen = self.live_brokers(timeout_s=5)
            except Exception:  # noqa: BLE001 - no broker answers yet: retry until the deadline
                seen = []
            enough = len(seen) == count if exactly else len(seen) >= count
            if enough and (including is None or including in seen):
                return seen
            time.sleep(0.3)
        raise BrokerError(f"the cluster listed brokers {seen} after {timeout_s:.0f} s, not {count}")

    def wait_in_sync(self, timeout_s: float = 120.0) -> None:
        """Until every partition of every topic has all its replicas in sync."""
        from confluent_kafka.admin import AdminClient

        admin = AdminClient({"bootstrap.servers": self.bootstrap})
        deadline = time.monotonic() + timeout_s
        lagging: list[str] = []
        while time.monotonic() < deadline:
            try:
                md = admin.list_topics(timeout=5)
                lagging = [f"{t}/{p}" for t, tm in md.topics.items() for p, pm in tm.partitions.items()
                           if set(pm.isrs) != set(pm.replicas)]
                if not lagging:
                    return
            except Exception:  # noqa: BLE001 - metadata not answered: retry until the deadline
                pass
            time.sleep(0.5)
        raise BrokerError(f"{len(lagging)} partitions still under-replicated after {timeout_s:.0f} s: {lagging[:5]}")

    def _create_internal_topics(self, timeout_s: float) -> None:
        """The offsets and transaction-state topics, created now with all nodes alive: created at
        first use instead, while a node is down, they could not get their replicas."""
        from confluent_kafka import Consumer, KafkaException, Producer, TopicPartition

        conf = {"bootstrap.servers": self.bootstrap}
        quiet = {"log_level": "3"}  # "not coordinator: retrying" while the topic is being made
        prod = Producer({**conf, **quiet, "transactional.id": f"local-cluster-{uuid.uuid4().hex[:8]}"})
        prod.init_transactions(timeout_s)  # InitProducerId creates __transaction_state
        consumer = Consumer({**conf, **quiet, "group.id": f"local-cluster-{uuid.uuid4().hex[:8]}"})
        deadline = time.monotonic() + timeout_s
        try:  # FindCoordinator, before the offset fetch, creates __consumer_offsets
            while True:
                try:
                    consumer.committed([TopicPartition("__transaction_state", 0)], timeout=10)
                    return
                except KafkaException as exc:  # "not coordinator" while its partitions get leaders
                    if time.monotonic() > deadline:
                        raise BrokerError(f"the cluster did not make __consumer_offsets: {exc}") from None
                    time.sleep(0.5)
        finally:
            consumer.close()


def _one_cluster_id(home: Path, nodes: Sequence[LocalBroker]) -> tuple[LocalBroker, ...]:
    """The nodes, each told the cluster id the formatted ones have (a new one if none is)."""
    known = {cid for n in nodes if (cid := n.formatted_cluster_id())}
    if len(known) > 1:
        raise BrokerError(f"the nodes under {home} were formatted for different clusters: remove its node-*/")
    cluster_id = known.pop() if known else new_cluster_id()
    return tuple(replace(n, cluster_id=cluster_id) for n in nodes)
