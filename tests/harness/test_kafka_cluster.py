"""Three Kafka brokers on loopback (harness.local_kafka.LocalCluster, ``dedupctl kafka``): one
cluster for the module, started and stopped through the CLI, every topic the tools make with 3
replicas and min.insync.replicas 2, producers and the exactly-once job through a broker SIGKILL.

The tests share the cluster and run in file order: the last one stops it through the CLI.
"""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
import uuid
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from confluent_kafka import KafkaException, Producer
from confluent_kafka.admin import AdminClient, ConfigResource, ResourceType

from api import campaigns
from harness.broker_loss import Outage, lose_and_restore
from harness.broker_loss import victim as busiest
from harness.chaos import ChaosPlan, run_chaos
from harness.local_kafka import LocalBroker, LocalCluster
from harness.ports import free_port_run
from operators import codec
from operators.contract import Topics
from ops import kafka_io
from ops.kafka_io import Replication, TopicError
from senders.runtime.pool import ensure_topics as ensure_sender_topics
from senders.runtime.pool import sender_topics
from settings import Settings

pytestmark = pytest.mark.integration


@dataclass
class CliCluster:
    """The module's cluster: the environment ``dedupctl`` runs in, and the cluster it made."""

    env: dict[str, str]
    cluster: LocalCluster
    start_output: str = ""
    settings: Settings = field(default_factory=Settings)

    def dedupctl(self, *args: str, timeout: float = 180.0, **extra: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "dedupctl.cli", *args], env={**self.env, **extra},
                              capture_output=True, text=True, timeout=timeout)


def local_env(data_dir: Path, port: int) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("DEDUP_")}
    return {**env, "DEDUP_DATA_DIR": str(data_dir), "DEDUP_KAFKA_LOCAL_PORT": str(port),
            "DEDUP_KAFKA_LOCAL_CONTROLLER_PORT": str(port + 1)}


def wait_until(condition: Callable[[], bool], timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"{what}: not within {timeout_s:.0f} s")
        time.sleep(0.2)


def test_one_node_keeps_the_files_ports_and_status_line_of_before(tmp_path: Path) -> None:
    """The default layout is the single broker of before: ``<data_dir>/kafka`` itself, 9092/9093
    (its start is what every other test's broker does: LocalBroker.start)."""
    from dedupctl.kafka_cmd import configured

    cfg = Settings(data_dir=str(tmp_path))
    (node,) = configured(cfg).nodes
    home = tmp_path / "kafka"
    assert (node.home, node.port, node.controller_port, node.node_id) == (home, 9092, 9093, 1)
    assert (node.pid_file, node.log_file) == (home / "kafka.pid", home / "server.log")
    props = node.properties()
    assert "controller.quorum.voters=1@127.0.0.1:9093\n" in props and f"log.dirs={home / 'data'}\n" in props
    assert "offsets.topic.replication.factor=1\n" in props and "transaction.state.log.min.isr=1\n" in props
    run = CliCluster(local_env(tmp_path, 9092), LocalCluster.layout(home, [(9092, 9093)]))
    status = run.dedupctl("kafka", "status")
    assert (status.returncode, status.stdout) == (3, f"kafka stopped (home {home})\n")


@pytest.fixture(scope="module")
def three(tmp_path_factory: pytest.TempPathFactory) -> Iterator[CliCluster]:
    data = tmp_path_factory.mktemp("three-brokers")
    port = free_port_run(6)
    env = local_env(data, port)
    cluster = LocalCluster.layout(data / "kafka", [(port + 2 * k, port + 2 * k + 1) for k in range(3)])
    run = CliCluster(env, cluster)
    started = run.dedupctl("kafka", "start", "--brokers", "3")
    try:
        assert started.returncode == 0, started.stderr
        run.start_output = started.stdout
        run.settings = Settings().with_overrides(kafka={"bootstrap_servers": cluster.bootstrap})
        yield run
    finally:
        for written in LocalCluster.written(data / "kafka"):
            written.stop()


def test_three_nodes_started_by_the_cli(three: CliCluster) -> None:
    cluster = three.cluster
    for node in cluster.nodes:
        assert f"kafka node {node.node_id} running: pid" in three.start_output
    assert f"kafka cluster: 3 of 3 nodes running; bootstrap {cluster.bootstrap}" in three.start_output
    assert "set DEDUP_KAFKA_LOCAL_BROKERS=3" in three.start_output  # the settings say 1 node
    assert cluster.live_brokers() == [1, 2, 3]
    assert len({n.formatted_cluster_id() for n in cluster.nodes} - {None}) == 1
    for node in cluster.nodes:
        props = node.config_file.read_text()
        assert f"node.id={node.node_id}\n" in props
        for line in ("offsets.topic.replication.factor=3", "transaction.state.log.replication.factor=3",
                     "transaction.state.log.min.isr=2", "default.replication.factor=3", "min.insync.replicas=2"):
            assert line in props
    md = AdminClient({"bootstrap.servers": cluster.bootstrap}).list_topics(timeout=10)
    for internal in ("__consumer_offsets", "__transaction_state"):
        assert {len(p.replicas) for p in md.topics[internal].partitions.values()} == {3}
    status = three.dedupctl("kafka", "status")
    assert status.returncode == 0 and "kafka cluster: 3 of 3 nodes running" in status.stdout
    # the one-node layout cannot start on the same data dir (and ports) while the cluster runs
    refused = three.dedupctl("kafka", "start")
    assert refused.returncode == 2 and "a cluster of 3 node(s) runs from" in refused.stderr


def test_every_topic_the_tools_make_has_three_replicas_and_min_isr_two(three: CliCluster) -> None:
    topics = Topics().with_prefix(f"t{uuid.uuid4().hex[:8]}.")
    env = {f"DEDUP_TOPICS_{role.upper()}": name for role, name in topics.by_role().items()}
    made = three.dedupctl("topics", "create", DEDUP_KAFKA_LOCAL_BROKERS="3", **env)
    assert made.returncode == 0, made.stderr
    assert made.stdout.splitlines() == [f"{name}: created" for name in topics.all()]
    client = {"bootstrap.servers": three.cluster.bootstrap}
    for name in topics.all():
        assert kafka_io.topic_replication(client, name) == Replication(3, 2)
    again = three.dedupctl("topics", "create", DEDUP_KAFKA_LOCAL_BROKERS="3", **env)
    assert again.stdout.splitlines() == [f"{name}: exists" for name in topics.all()]

    cfg = Settings(topics=topics).with_overrides(kafka={"bootstrap_servers": three.cluster.bootstrap},
                                                 senders={"status_topic": f"{topics.push}.status",
                                                          "dlq_topic": f"{topics.push}.dlq"})
    assert set(ensure_sender_topics(cfg).values()) == {"created"}
    for name in sender_topics(cfg):
        assert kafka_io.topic_replication(client, name) == Replication(3, 2)
    progress = f"{topics.push}.campaigns"
    campaigns.ensure_topic(cfg.kafka, progress)
    assert kafka_io.topic_replication(client, progress) == Replication(3, 2)
    admin = AdminClient(client)
    resource = ConfigResource(ResourceType.TOPIC, progress)
    assert admin.describe_configs([resource])[resource].result()["cleanup.policy"].value == "compact"
    # what the settings say wins over the cluster's default, and is checked against the live brokers
    one = three.settings.with_overrides(kafka={"replication_factor": 1})
    kafka_io.ensure_topics(one.kafka, [f"{topics.push}.rf1"], 1)
    assert kafka_io.topic_replication(client, f"{topics.push}.rf1") == Replication(1, 1)
    four = three.settings.with_overrides(kafka={"replication_factor": 4})
    with pytest.raises(TopicError, match=r"replication factor 4 \(kafka.replication_factor\) needs 4 live brokers"):
        kafka_io.ensure_topics(four.kafka, [f"{topics.push}.rf4"], 1)


class IdempotentWriter(threading.Thread):
    """An ``acks=all`` idempotent producer writing 1, 2, 3, ... until stopped; counts what was
    acknowledged and how long the longest acknowledgement took.

    It promises no loss, and no duplicate within one producer epoch. A leader change can bump the
    epoch, and a batch retried across the bump can then be written twice (librdkafka issue 4953,
    open; its maintainers: only transactions rule duplicates out). Seen once here, in the whole
    suite on a loaded machine: 1 record of 19,151 twice."""

    def __init__(self, bootstrap: str, topic: str) -> None:
        super().__init__(daemon=True)
        self.producer = Producer({"bootstrap.servers": bootstrap, "enable.idempotence": "true", "acks": "all",
                                  "linger.ms": "5", "delivery.timeout.ms": "120000"})
        self.topic = topic
        self.acked: list[str] = []
        self.acked_at: list[float] = []
        self.failed: list[str] = []
        self.longest_s = 0.0
        self.unsent = -1
        self.stop_event = threading.Event()

    def run(self) -> None:
        i = 0
        while not self.stop_event.is_set():
            i += 1
            sent = time.monotonic()

            def done(err: object, msg: object, sent: float = sent) -> None:
                if err is not None:
                    self.failed.append(str(err))
                    return
                self.acked.append(msg.value().decode())  # type: ignore[attr-defined]
                self.acked_at.append(time.monotonic())
                self.longest_s = max(self.longest_s, time.monotonic() - sent)

            self.producer.produce(self.topic, key=str(i % 7).encode(), value=str(i).encode(), on_delivery=done)
            self.producer.poll(0)
            time.sleep(0.01)
        self.unsent = self.producer.flush(120)
        del self.producer  # the client goes with its last reference (this confluent-kafka has no close())


class TransactionalWriter(threading.Thread):
    """A transactional producer committing batches of 10 records until stopped; keeps the
    records of the committed batches and of the aborted ones."""

    def __init__(self, bootstrap: str, topic: str) -> None:
        super().__init__(daemon=True)
        self.producer = Producer({"bootstrap.servers": bootstrap, "transactional.id": f"txn-{uuid.uuid4().hex[:8]}",
                                  "transaction.timeout.ms": "60000"})
        self.topic = topic
        self.committed: list[str] = []
        self.committed_at: list[float] = []
        self.aborted: list[str] = []
        self.fatal: str | None = None
        self.stop_event = threading.Event()

    def run(self) -> None:
        self.producer.init_transactions(60)
        batch = 0
        while not self.stop_event.is_set() and self.fatal is None:
            batch += 1
            values = [f"b{batch}-{j}" for j in range(10)]
            self.producer.begin_transaction()
            for v in values:
                self.producer.produce(self.topic, key=v.encode(), value=v.encode())
            self._commit(values)
            time.sleep(0.1)
        self.producer.flush(30)
        del self.producer  # the client goes with its last reference (this confluent-kafka has no close())

    def _commit(self, values: list[str]) -> None:
        while True:
            try:
                self.producer.commit_transaction(60)
                self.committed += values
                self.committed_at.append(time.monotonic())
                return
            except KafkaException as exc:
                error = exc.args[0]
                if error.retriable():
                    continue
                if error.txn_requires_abort():
                    self.producer.abort_transaction(60)
                    self.aborted += values
                    return
                self.fatal = str(error)
                return


def test_the_job_and_two_producers_through_a_broker_sigkill(three: CliCluster, tmp_path: Path) -> None:
    """The chaos driver's slice on the three nodes: the exactly-once job (``dedupctl run``, its own
    process) on RF-3 topics while the busiest node is SIGKILLed, kept down past its fencing and
    started again; every output topic equals the reference model's. Meanwhile an idempotent
    ``acks=all`` producer and a transactional one write topics of their own: each goes on writing
    while the node is down and after it is back, and reads back (read_committed) exactly what it
    was told was written, once."""
    cluster = three.cluster
    client = {"bootstrap.servers": cluster.bootstrap}
    run = uuid.uuid4().hex[:8]
    idem_topic, txn_topic = f"idem-{run}", f"txn-{run}"
    kafka_io.create_topics(client, [idem_topic, txn_topic], 3)
    idem, txn = IdempotentWriter(cluster.bootstrap, idem_topic), TransactionalWriter(cluster.bootstrap, txn_topic)
    idem.start()
    txn.start()
    # the first 1,000 requests (5 s) come before the stream's first late one: the kill falls among them
    plan = ChaosPlan(requests=2000, rate=200, kills=0, broker_restarts=0, broker_kills=1, rescales=0, seed=13,
                     brokers=3, uptime_s=(2.0, 4.0), broker_down_s=(13.0, 15.0), settle_timeout_s=240)
    try:
        report = run_chaos(plan, lambda line: print(line, flush=True), work=tmp_path, kafka=cluster)
        (killed_at, back_at), = report.broker_outages
        wait_until(lambda: len(idem.acked_at) > 0 and idem.acked_at[-1] > back_at + 1
                   and len(txn.committed_at) > 0 and txn.committed_at[-1] > back_at + 1, 60, "writes after the restart")
    finally:
        idem.stop_event.set()
        txn.stop_event.set()
        idem.join(180)
        txn.join(180)
    assert any("topics with 4 partitions, 3 replicas, min.insync.replicas 2" in a for a in report.actions)
    assert sum("SIGKILL broker node" in a for a in report.actions) == 1
    assert sum("back in sync" in a for a in report.actions) == 1
    assert report.committed_while_down[0] > 0  # the job went on committing with one node down
    assert report.expected["notifications.late"] > 0 and report.expected["notifications.invalid"] > 0
    assert report.problems == []
    assert report.actual == report.expected

    print(f"longest acks=all acknowledgement across the SIGKILL: {idem.longest_s:.1f} s")
    for times in (idem.acked_at, txn.committed_at):
        assert any(killed_at < t < back_at for t in times)  # written while the node was down
        assert any(t > back_at for t in times)  # and after it came back
    assert idem.failed == [] and idem.unsent == 0 and txn.fatal is None
    # idempotent: every acknowledged record is there, nothing else; a copy written twice across an
    # epoch bump (see IdempotentWriter) sits at two offsets of the log, never one offset read twice
    where: dict[str, list[tuple[int, int]]] = {}
    for m in kafka_io.read_committed(client, [idem_topic], idle_timeout_s=30, until_end=True):
        assert m.value is not None
        where.setdefault(m.value.decode(), []).append((m.partition, m.offset))
    assert set(where) == set(idem.acked) and len(idem.acked) == len(set(idem.acked))
    twice = {v: at for v, at in where.items() if len(at) > 1}
    assert all(len(set(at)) == len(at) for at in twice.values())
    print(f"idempotent producer: {len(idem.acked)} acknowledged, {len(twice)} written twice: {twice}")
    # transactional: exactly the committed batches, each record once, no aborted one
    got = Counter(m.value.decode() for m in kafka_io.read_committed(client, [txn_topic], idle_timeout_s=30,
                                                                    until_end=True) if m.value is not None)
    assert got == Counter(txn.committed) and set(got.values()) == {1}
    assert not set(txn.aborted) & set(got)


def test_the_api_accepts_through_a_broker_sigkill(three: CliCluster, tmp_path: Path) -> None:
    """The API (``dedupctl api run``, its own process, the production ack timeout) on the three
    nodes, sent 40 requests/s open loop while the node leading most of the requests topic's
    partitions is SIGKILLed, kept down past its fencing and started again: at least 99.9% of the
    requests are answered 202 (a request waits for its acknowledgement while its partition moves,
    it is not refused), and the requests topic holds each 202's request (read_committed), at most
    repeated as the same record by the producer's retry."""
    import asyncio

    import httpx

    from tests.api.conftest import RunningApi, api_settings, register_users

    cluster = three.cluster
    cfg = api_settings(cluster.bootstrap, tmp_path, partitions=3,
                       api={"ack_timeout_ms": 15_000, "pending_wait_ms": 17_000})
    users = [f"bk-{i}" for i in range(20)]
    register_users(cfg, users)
    api = RunningApi(cfg, tmp_path).start()
    token = api.token("shop", rate=10_000)  # the answers that waited come at once: no 429 for that
    rate, seconds, kill_at = 40.0, 45.0, 10.0
    answers: list[tuple[int, str | None]] = []  # (status, notification id)
    outages: list[Outage] = []

    def lose_a_broker() -> None:
        time.sleep(kill_at)
        outages.append(lose_and_restore(cluster, busiest(cluster, cfg.topics.requests, "leader").node))

    async def send(client: httpx.AsyncClient, n: int) -> None:
        body = {"user_id": users[n % len(users)], "template": "order_shipped", "params": {"order": f"K-{n}"},
                "channels": ["sms"]}
        try:
            reply = await client.post("/v1/notifications", json=body, headers={"Idempotency-Key": f"bk-{n}"})
        except httpx.HTTPError:
            answers.append((0, None))
            return
        answers.append((reply.status_code, reply.json().get("id") if reply.status_code == 202 else None))

    async def load() -> None:
        limits = httpx.Limits(max_connections=2000, max_keepalive_connections=2000)  # never queued here
        async with httpx.AsyncClient(base_url=api.url, headers={"Authorization": f"Bearer {token}"},
                                     timeout=30, limits=limits) as client:
            start = time.monotonic()
            tasks = []
            for n in range(int(rate * seconds)):
                await asyncio.sleep(max(0.0, start + n / rate - time.monotonic()))
                tasks.append(asyncio.create_task(send(client, n)))
            await asyncio.gather(*tasks)

    killer = threading.Thread(target=lose_a_broker, daemon=True)
    killer.start()
    try:
        asyncio.run(load())
        killer.join(240)
    finally:
        api.stop()
    assert len(outages) == 1, "the node was not lost and back in sync within the load"
    print(f"node {outages[0].node} fenced {outages[0].fenced_after_s:.1f} s after its SIGKILL, back in sync after"
          f" {outages[0].back_in_sync_after_s:.1f} s")
    statuses = Counter(status for status, _ in answers)
    accepted = [nid for status, nid in answers if status == 202 and nid is not None]
    assert len(accepted) == statuses[202]  # every 202 names its notification
    assert len(answers) == int(rate * seconds)
    assert len(accepted) >= 0.999 * len(answers), statuses
    copies: dict[str, set[bytes]] = {}  # notification id -> the distinct records written for it
    written: Counter[str] = Counter()
    for m in kafka_io.read_committed(cfg.kafka.client_config(), [cfg.topics.requests], idle_timeout_s=10,
                                     until_end=True):
        assert m.value is not None
        nid = codec.decode("notification_request", m.value)["notification_id"]
        written[nid] += 1
        copies.setdefault(nid, set()).add(m.value)
    assert all(written[nid] >= 1 for nid in accepted), [nid for nid in accepted if not written[nid]][:5]
    # the producer is not the idempotent one (api/producer.py): a produce request whose answer was
    # lost with the node is sent again and may be written twice, the same record, which the dedup
    # job suppresses by its key like a caller's retry; never a different one
    assert all(len(copies[nid]) == 1 for nid in accepted)
    print(f"{len(accepted)} accepted, {sum(n > 1 for n in written.values())} written twice by a retry")


def test_losing_the_active_controller_elects_another_fences_the_node_and_writes_go_on(three: CliCluster) -> None:
    """SIGKILL the node that leads the controller quorum (a crash that takes a broker and the
    active controller at once): another node takes the lead, fences the dead one (its log says
    why), ``kafka status`` names the new controller, and an idempotent ``acks=all`` producer
    writing all along has every record acknowledged and written once."""
    cluster = three.cluster
    client = {"bootstrap.servers": cluster.bootstrap}
    before = cluster.active_controller()
    assert before in (1, 2, 3)
    assert f"active controller: node {before}\n" in three.dedupctl("kafka", "status").stdout
    topic = f"controller-loss-{uuid.uuid4().hex[:8]}"
    kafka_io.create_topics(client, [topic], 3)
    producer = Producer({**client, "enable.idempotence": "true", "acks": "all", "linger.ms": "1"})
    acked: list[str] = []
    failed: list[str] = []
    stop = threading.Event()

    def write() -> None:
        n = 0
        while not stop.is_set():
            producer.produce(topic, value=f"r-{n}".encode(), partition=n % 3,
                             on_delivery=lambda err, msg: (failed if err else acked).append(
                                 str(err) if err else msg.value().decode()))
            producer.poll(0)
            n += 1
            time.sleep(0.01)
        assert producer.flush(120) == 0

    writer = threading.Thread(target=write, daemon=True)
    writer.start()
    time.sleep(2)
    elected: list[int | None] = []
    fence_logged: list[bool] = []
    status: list[str] = []

    def with_the_node_fenced(_lost_at: float) -> None:
        after = cluster.active_controller()
        elected.append(after)
        if after is not None:
            log = cluster.node(after).log_file.read_text(errors="replace")
            fence_logged.append(f"Fencing broker {before} at epoch" in log)
            status.append(three.dedupctl("kafka", "status").stdout)
        time.sleep(2)  # writes after the fence, to the partitions' new leaders
        stop.set()
        writer.join(150)

    outage = lose_and_restore(cluster, before, while_down=with_the_node_fenced)
    (after,) = elected
    assert after is not None and after != before
    assert fence_logged == [True]
    print(f"active controller {before} SIGKILLed: node {after} took the lead, fenced it after"
          f" {outage.fenced_after_s:.1f} s; {len(acked)} records acknowledged")
    assert not failed and len(acked) > 300
    assert f"active controller: node {after}\n" in status[0]  # asked while the node was down
    assert f"active controller: node {after}\n" in three.dedupctl("kafka", "status").stdout  # and after
    got = Counter(m.value.decode() for m in kafka_io.read_committed(client, [topic], idle_timeout_s=10,
                                                                   until_end=True) if m.value is not None)
    assert got == Counter(acked) and set(got.values()) == {1}


def test_the_cli_kills_one_node_and_stops_the_rest(three: CliCluster) -> None:
    killed = three.dedupctl("kafka", "kill", "--node", "3")
    assert (killed.returncode, killed.stdout) == (0, "kafka node 3 killed\n")
    status = three.dedupctl("kafka", "status")
    assert status.returncode == 3 and "kafka node 3 stopped" in status.stdout and "2 of 3 nodes running" in status.stdout
    # no new topic gets 3 replicas from 2 brokers: refused with the numbers, and not half made
    client = {"bootstrap.servers": three.cluster.bootstrap}
    three.cluster.wait_brokers(2, timeout_s=60, exactly=True)  # fenced: broker.session.timeout.ms
    with pytest.raises(TopicError, match=r"needs 3 live brokers, and the cluster has 2 \(ids 1, 2\)"):
        kafka_io.create_topics(client, ["refused"], 1)
    assert "refused" not in AdminClient(client).list_topics(timeout=10).topics
    made = three.dedupctl("topics", "create", DEDUP_KAFKA_LOCAL_BROKERS="3", DEDUP_TOPICS_PUSH="refused.push")
    assert made.returncode == 2 and "needs 3 live brokers, and the cluster has 2" in made.stderr


def test_the_cli_stops_every_node(three: CliCluster) -> None:
    stopped = three.dedupctl("kafka", "stop")
    assert stopped.returncode == 0 and stopped.stdout == "kafka stopped: nodes 1, 2\n"  # 3 was killed
    assert three.cluster.running() == []
    assert all(isinstance(n, LocalBroker) and not n.answers() for n in three.cluster.nodes)
    status = three.dedupctl("kafka", "status")
    assert status.returncode == 3 and "0 of 3 nodes running" in status.stdout
