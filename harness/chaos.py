"""Fault injection: the real job, a real broker, SIGKILLs, broker restarts, savepoint rescales.

``dedupctl chaos`` (and ``make chaos``) runs the job as a separate process (``dedupctl run``),
produces a seeded stream, and while it flows kills the job with SIGKILL and restarts it with
``--resume latest``, stops and restarts the broker, and stops the job with a savepoint to resume
it at another parallelism. With ``--brokers 3`` the broker is a cluster of three (every topic
with 3 replicas and min.insync.replicas 2), and ``--broker-kills`` SIGKILLs one node mid-stream,
keeps it down past the cluster's session timeout (its leaders move) and starts it again. Then it
reads every output topic with read_committed and compares them with the reference model run on
the same stream: nothing missing, nothing twice, nothing else. Any difference fails the run.
"""

from __future__ import annotations

import logging
import os
import random
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

from confluent_kafka import KafkaError, KafkaException, Producer

from harness.cluster import LocalCluster
from harness.local_kafka import LocalCluster as KafkaCluster
from harness.ports import free_port
from harness.reference import diff_records, expected_records
from harness.streamgen import Stream, StreamSpec, generate
from ops import kafka_io
from ops.flink_rest import JobControlError, RestClient
from settings import Settings

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class ChaosPlan:
    """What to break and how much.

    :param requests: records in the stream
    :param rate: records produced per second (event time advances like the wall clock)
    :param kills: SIGKILLs of the job process, each followed by ``run --resume latest``
    :param broker_restarts: stops (SIGTERM) and restarts of the broker (of one node) mid-stream
    :param broker_kills: SIGKILLs of one node of the Kafka cluster (the one leading the most
        partitions), started again after ``broker_down_s``
    :param brokers: nodes of the Kafka cluster: 1, or 3 for replication 3 and min ISR 2
    :param broker_down_s: a killed node stays down for a random time in this range: past
        ``broker.session.timeout.ms`` (9 s), so that the cluster fences it and moves its leaders
    :param rescales: stops with a savepoint, resumed at the other parallelism (2 <-> 1)
    :param parallelism: parallelism of the first run
    :param seed: seeds the stream and the moments of the faults
    :param uptime_s: a fault strikes after the job has run for a random time in this range
    :param settle_timeout_s: how long to wait for the output once everything is produced
    :param cluster: run on a standalone cluster (separate JobManager and TaskManager processes,
        ``flink run -py``); a kill is then a TaskManager SIGKILL, and the JobManager restores
    :param progress_s: every this many seconds, a progress line (requests produced, output offsets
        readable); 0: none
    :param budget_s: the whole run's time, from the broker's start: the waits for the producer and
        for the output end there, and the report says what was left (a test's timeout would lose
        the run's account); None: no limit beyond each wait's own
    """

    requests: int = 200_000
    rate: int = 1000
    kills: int = 20
    broker_restarts: int = 1
    rescales: int = 2
    parallelism: int = 2
    seed: int = 7
    uptime_s: tuple[float, float] = (4.0, 12.0)
    settle_timeout_s: float = 600.0
    cluster: bool = False
    progress_s: float = 15.0
    broker_kills: int = 0
    brokers: int = 1
    broker_down_s: tuple[float, float] = (12.0, 20.0)
    budget_s: float | None = None


@dataclass
class ChaosReport:
    actions: list[str] = field(default_factory=list)
    expected: Counter[str] = field(default_factory=Counter)
    actual: Counter[str] = field(default_factory=Counter)
    problems: list[str] = field(default_factory=list)
    #: per broker kill: offsets the output topics made readable (read_committed) while the node was down
    committed_while_down: list[int] = field(default_factory=list)
    #: per broker kill: (time.monotonic() of the SIGKILL, of the node's answer after its restart)
    broker_outages: list[tuple[float, float]] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.problems


class JobProcess:
    """``dedupctl run`` in its own process group, so a SIGKILL takes its JVM down with it."""

    def __init__(self, config_file: Path, log_file: Path) -> None:
        self.config_file = config_file
        self.log_file = log_file
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self, parallelism: int, resume: str) -> None:
        cmd = [sys.executable, "-m", "dedupctl.cli", "--config", str(self.config_file), "run",
               "--parallelism", str(parallelism), "--resume", resume]
        with open(self.log_file, "ab") as log:
            self.proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT,
                                         stdin=subprocess.DEVNULL, start_new_session=True)

    def kill(self) -> None:
        if self.proc is None:
            return
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        self.proc.wait(timeout=30)
        self.proc = None

    def wait_exit(self, timeout_s: float) -> None:
        if self.proc is not None:
            try:
                self.proc.wait(timeout=timeout_s)
            except subprocess.TimeoutExpired:
                self.kill()
            self.proc = None


def wait_running(rest: RestClient, timeout_s: float = 180.0) -> str:
    """Until one job runs with every task RUNNING; returns its id."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            jobs = [j for j in rest.call("GET", "/jobs/overview")["jobs"] if j["state"] == "RUNNING"]
            if len(jobs) == 1:
                detail = rest.call("GET", f"/jobs/{jobs[0]['jid']}")
                if all(v["status"] == "RUNNING" for v in detail["vertices"]):
                    return str(jobs[0]["jid"])
        except JobControlError:
            pass
        time.sleep(0.5)
    raise TimeoutError(f"no running job after {timeout_s:.0f} s")


def wait_failover(rest: RestClient, job_id: str, timeout_s: float = 30.0) -> None:
    """Until the JobManager has noticed a lost TaskManager (the job leaves RUNNING)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            if rest.call("GET", f"/jobs/{job_id}")["state"] != "RUNNING":
                return
        except JobControlError:
            pass
        time.sleep(0.3)


def chaos_settings(bootstrap: str, work: Path, rest_port: int) -> str:
    return "\n".join([
        "[kafka]", f'bootstrap_servers = "{bootstrap}"', 'group_id = "chaos"',
        "[flink]", f'checkpoint_dir = "{work / "checkpoints"}"',
        f"rest_port = {rest_port}", 'transactional_id_prefix = "chaos"', "restart_attempts = 30",
        "restart_delay_ms = 2000",
        "[dedup]", "idleness_ms = 5000",
        "",
    ])


def first_watermark(stream: Stream, cfg: Settings) -> int:
    """The watermark the stream's records before its first late one give the job: the lowest of
    the partitions' newest event times, less the out-of-orderness."""
    newest: dict[int, int] = {}
    for rec in stream.records[: stream.spec.late_after]:
        if rec.request is not None:
            newest[rec.partition] = max(newest.get(rec.partition, rec.request.event_time), rec.request.event_time)
    return min(newest.values()) - cfg.dedup.out_of_orderness_ms - 1


def wait_watermark(rest: RestClient, at_least: int, timeout_s: float = 300.0) -> None:
    """Until the job has judged lateness on a watermark of at least ``at_least`` (every subtask
    of a vertex after the sources has that input watermark) and a checkpoint completed after
    that, so the watermark carry holds it for any restore. Restarts in between are waited out."""
    deadline = time.monotonic() + timeout_s
    seen_at: int | None = None  # completed checkpoints when the watermark was there
    seen_in: str | None = None  # of this job (a restarted job counts its own)
    while time.monotonic() < deadline:
        try:
            jid = wait_running(rest, max(1.0, deadline - time.monotonic()))
            if jid != seen_in:
                seen_at, seen_in = None, jid
            completed = int(rest.call("GET", f"/jobs/{jid}/checkpoints")["counts"]["completed"])
            if seen_at is None:
                for v in rest.call("GET", f"/jobs/{jid}")["vertices"]:
                    marks = rest.call("GET", f"/jobs/{jid}/vertices/{v['id']}/watermarks")
                    values = [int(m["value"]) for m in marks if m["id"].endswith("currentInputWatermark")]
                    if values and min(values) >= at_least:
                        seen_at = completed
                        break
            elif completed > seen_at:
                return
        except (JobControlError, KeyError, ValueError):
            pass
        time.sleep(0.2)
    raise TimeoutError(f"the job's watermark did not reach {at_least} within {timeout_s:.0f} s")


@dataclass
class Produced:
    """How many of the stream's records the producer has handed to its client so far, and why it
    stopped early if it did."""

    records: int = 0
    failure: str | None = None


def producer_thread(cfg: Settings, stream: Stream, rate: int, done: threading.Event,
                    before_late: Callable[[], None] = lambda: None,
                    produced: Produced | None = None) -> threading.Thread:
    """Produce the stream at ``rate``, counting into ``produced``. Before its first late request,
    ``before_late()``: the job's first watermark comes from its periodic emitter, and records read
    before it (a burst after a slow start) are on time whatever their event time; the model's
    verdicts hold once the job has a watermark."""
    count = produced if produced is not None else Produced()

    def run() -> None:
        try:
            produce()
        except Exception as exc:  # noqa: BLE001 - the run's report says it, and its waits end now
            logger.exception("the chaos producer stopped after %d records", count.records)
            count.failure = f"{type(exc).__name__}: {exc}"
        finally:
            done.set()

    def produce() -> None:
        failed: list[str] = []  # a record the broker never took is the producer's loss, not the job's
        fatal: list[str] = []  # the client's fatal error, as its delivery reports say it

        def on_delivery(err: KafkaError | None, _msg: object) -> None:
            if err is not None:
                (fatal if err.fatal() else failed).append(str(err))

        def check(prod: Producer) -> None:
            prod.poll(0)
            if fatal:
                raise KafkaException(KafkaError(KafkaError._FATAL, fatal[0], fatal=True))

        new_producer = partial(kafka_io.producer, cfg.kafka.client_config(), **{"delivery.timeout.ms": "600000"})
        prod, on_topic, watermark_waited, restarts = new_producer(), set[int](), False, 0
        start = time.monotonic()
        i = 0
        while i < len(stream.records):
            rec = stream.records[i]
            try:
                if i >= stream.spec.late_after and not watermark_waited:
                    prod.flush(600)
                    check(prod)
                    try:
                        before_late()
                    except Exception:  # noqa: BLE001 - go on: the run's comparison shows what it cost
                        logger.exception("the late requests go out without the job's first watermark")
                    watermark_waited = True
                    start = time.monotonic() - i / rate
                ahead = i / rate - (time.monotonic() - start)
                if ahead > 0:
                    time.sleep(ahead)
                while i not in on_topic:
                    try:
                        prod.produce(cfg.topics.requests, key=rec.key, value=rec.value, partition=rec.partition,
                                     on_delivery=on_delivery)
                        break
                    except BufferError:
                        prod.poll(0.1)
                count.records = max(count.records, i + 1)  # handed to the client
                check(prod)
                if i == len(stream.records) - 1:
                    remaining = prod.flush(600)
                    check(prod)
                    if remaining or failed:
                        raise RuntimeError("; ".join(
                            [*([f"{remaining} records still unsent after 600 s"] if remaining else []),
                             *([f"{len(failed)} refused (the first: {failed[0]})"] if failed else [])]))
            except KafkaException as exc:
                if not exc.args[0].fatal() or restarts == 3:
                    raise
                # an idempotent producer's fatal error (librdkafka: its sequence lost with a broker):
                # a new one goes on from what the topic holds, each partition's records in order
                restarts += 1
                logger.warning("the chaos producer's client failed (%s); a new one goes on", exc.args[0].str())
                # the topic read back is the truth now: what the old client reported (as it is
                # dropped, too) is not counted against the new one
                prod, fatal[:], failed[:] = new_producer(), [], []
                on_topic = records_on_topic(cfg, stream)
                i = min((j for j in range(len(stream.records)) if j not in on_topic), default=len(stream.records))
                continue
            i += 1

    thread = threading.Thread(target=run, name="producer", daemon=True)
    thread.start()
    return thread


def records_on_topic(cfg: Settings, stream: Stream) -> set[int]:
    """The stream's records already on the requests topic (their indices): each partition must hold
    the first of the stream's records for it, in order, and nothing else."""
    held: dict[int, list[bytes | None]] = {}
    for m in kafka_io.read_committed(cfg.kafka.client_config(), [cfg.topics.requests], idle_timeout_s=10,
                                     until_end=True):
        held.setdefault(m.partition, []).append(m.value)
    found: set[int] = set()
    for partition, values in held.items():
        mine = [j for j, r in enumerate(stream.records) if r.partition == partition][: len(values)]
        if [stream.records[j].value for j in mine] != values:
            raise RuntimeError(f"partition {partition} of {cfg.topics.requests} holds other records than the"
                               " stream's first ones: the stream cannot go on exactly")
        found.update(mine)
    return found


def expected_outputs(stream: Stream, cfg: Settings) -> dict[str, list[dict[str, Any]]]:
    expected = expected_records(stream.outcomes(cfg.dedup.window_config()), cfg.topics)
    offsets: Counter[int] = Counter()
    invalid = []
    for rec in stream.records:
        offset = offsets[rec.partition]
        offsets[rec.partition] += 1
        if rec.request is None:
            invalid.append({"raw": rec.value, "topic": cfg.topics.requests,
                            "partition": rec.partition, "offset": offset})
    expected[cfg.topics.invalid] = invalid
    return _normalised(expected, cfg)


def _normalised(records: dict[str, list[dict[str, Any]]], cfg: Settings) -> dict[str, list[dict[str, Any]]]:
    """Drop what timing decides (a late notice's watermark) or the model does not (error text)."""
    out = {}
    for topic, values in records.items():
        if topic == cfg.topics.late:
            values = [{**v, "watermark": None, "reason": None} for v in values]
        if topic == cfg.topics.invalid:
            values = [{k: v[k] for k in ("raw", "topic", "partition", "offset")} for v in values]
        out[topic] = values
    return out


def read_outputs(cfg: Settings) -> dict[str, list[dict[str, Any]]]:
    out: dict[str, list[dict[str, Any]]] = {}
    # to the end of every partition: an idle gap (a leader that moved, a busy machine) once ended
    # a read of three brokers' output early, and the run failed on records that were all there
    client = cfg.kafka.client_config()
    for topic, records in kafka_io.read_outputs(client, cfg.topics, idle_timeout_s=30, until_end=True).items():
        out[topic] = [value for _, value in records]
    for value in out[cfg.topics.invalid]:
        if not value["error"]:  # an invalid record must say why: make it differ from the model
            value["raw"] = b"<no error text>" + value["raw"]
    return _normalised(out, cfg)


def kill_broker(kafka: KafkaCluster, cfg: Settings, rng: random.Random, down_s: tuple[float, float],
                act: Callable[[str], None], report: ChaosReport) -> None:
    """SIGKILL the node leading the most partitions, keep it down (for ``down_s``, and on until the
    output topics have made something readable without it, at most 2 minutes more), start it
    again and wait until every replica is back in sync; the report gets the outage and the
    offsets the output topics made readable (read_committed) while the node was down."""
    leaders = kafka.leaders(cfg.topics.all())
    most = max(leaders.values())
    node = rng.choice(sorted(k for k, n in leaders.items() if n == most))
    client = cfg.kafka.client_config()
    before = kafka_io.stable_offsets(client, cfg.topics.outputs())
    killed_at = time.monotonic()
    kafka.kill(node)
    down = rng.uniform(*down_s)
    act(f"SIGKILL broker node {node} (leader of {most} partitions); down for {down:.0f} s")
    time.sleep(down)
    committed = kafka_io.stable_offsets(client, cfg.topics.outputs()) - before
    deadline = time.monotonic() + 120
    while committed == 0 and time.monotonic() < deadline:  # a slow machine: the job is still fencing it
        time.sleep(1)
        committed = kafka_io.stable_offsets(client, cfg.topics.outputs()) - before
    kafka.start_node(node)
    report.broker_outages.append((killed_at, time.monotonic()))
    report.committed_while_down.append(committed)
    act(f"broker node {node} restarted after {time.monotonic() - killed_at:.0f} s; {committed} output offsets "
        "committed while it was down")
    kafka.wait_in_sync()
    act(f"broker node {node} back in sync")


def progress_thread(cfg: Settings, total: int, produced: Produced, interval_s: float,
                    say: Callable[[str], None], stop: threading.Event, t0: float) -> threading.Thread:
    """Every ``interval_s``, a line: requests produced of ``total``, output offsets readable
    (read_committed; a transaction's marker takes an offset too) and how many more since the last
    line. Not one of the report's actions."""

    def run() -> None:
        client = cfg.kafka.client_config()
        before: int | None = None
        while not stop.wait(interval_s):
            try:
                readable = kafka_io.stable_offsets(client, cfg.topics.outputs())
            except Exception as exc:  # noqa: BLE001 - a broker down mid-fault: say so, look again later
                say(f"[{time.monotonic() - t0:7.1f}s] progress: {produced.records:,} of {total:,} requests produced;"
                    f" the output offsets not readable now ({type(exc).__name__})")
                continue
            more = "" if before is None else f" (+{readable - before:,})"
            say(f"[{time.monotonic() - t0:7.1f}s] progress: {produced.records:,} of {total:,} requests produced;"
                f" {readable:,} output offsets readable{more}")
            before = readable

    thread = threading.Thread(target=run, name="progress", daemon=True)
    thread.start()
    return thread


def run_chaos(plan: ChaosPlan, say: Callable[[str], None] = print, work: Path | None = None,
              kafka: KafkaCluster | None = None) -> ChaosReport:
    """Run the plan; on ``kafka`` when given (of ``plan.brokers`` nodes, left running, its nodes
    started again), else on a cluster of its own under ``work``."""
    work = work or Path(tempfile.mkdtemp(prefix="notify-dedup-chaos-"))
    rng = random.Random(plan.seed)
    report = ChaosReport()
    t0 = time.monotonic()

    def act(text: str) -> None:
        line = f"[{time.monotonic() - t0:7.1f}s] {text}"
        report.actions.append(line)
        say(line)

    own_kafka = kafka is None
    kafka = kafka or KafkaCluster.on_free_ports(work / "kafka", plan.brokers)
    if kafka.size != plan.brokers:
        raise ValueError(f"the plan is for {plan.brokers} Kafka nodes, the cluster given has {kafka.size}")
    kafka.start()
    rest_port = free_port()
    config_file = work / "chaos.toml"
    config_file.write_text(chaos_settings(kafka.bootstrap, work, rest_port))
    from settings import load_settings

    cfg = load_settings(config_file, env={})
    kafka_io.create_topics(cfg.kafka.client_config(), cfg.topics.all(), 4)
    held = kafka_io.topic_replication(cfg.kafka.client_config(), cfg.topics.requests)
    act(f"kafka: {kafka.size} node(s); topics with 4 partitions, {held.factor} replicas, "
        f"min.insync.replicas {held.min_insync}")
    spec = StreamSpec(requests=plan.requests, partitions=4, seed=plan.seed, step_ms=max(1, 1000 // plan.rate))
    stream = generate(spec)
    expected = expected_outputs(stream, cfg)
    report.expected = Counter({t: len(v) for t, v in expected.items()})
    act(f"stream: {len(stream.records)} records ({len(stream.invalid())} invalid), seed {plan.seed}; "
        f"expected {dict(report.expected)}")

    rest = RestClient(f"http://127.0.0.1:{rest_port}")
    job = JobProcess(config_file, work / "job.log")
    parallelism = plan.parallelism
    cluster = LocalCluster(work / "flink", rest_port, free_port(), settings=cfg) if plan.cluster else None
    if cluster is not None:
        cluster.start()
        act("standalone cluster started: a JobManager and a TaskManager, separate processes")
        cluster.submit(config_file, parallelism)
    else:
        job.start(parallelism, "latest")
    wait_running(rest)
    act(f"job running, parallelism {parallelism}")
    produced = threading.Event()
    at_least = first_watermark(stream, cfg)

    def before_late() -> None:
        wait_watermark(rest, at_least)
        act(f"the job's watermark is past {at_least} and checkpointed: the late requests go out")

    count = Produced()
    producer_thread(cfg, stream, plan.rate, produced, before_late, count)
    quiet = threading.Event()
    if plan.progress_s > 0:
        progress_thread(cfg, len(stream.records), count, plan.progress_s, say, quiet, t0)
    faults = (["kill"] * plan.kills + ["broker"] * plan.broker_restarts + ["broker-kill"] * plan.broker_kills
              + ["rescale"] * plan.rescales)
    rng.shuffle(faults)
    try:
        for fault in faults:
            time.sleep(rng.uniform(*plan.uptime_s))
            if fault == "kill" and cluster is not None:
                job_id = wait_running(rest)
                pid = cluster.kill_taskmanager()
                act(f"SIGKILL TaskManager {pid}; a new TaskManager started")
                wait_failover(rest, job_id)
                cluster.wait_taskmanagers(1)
                wait_running(rest)
                act("job restored by the JobManager from its latest checkpoint")
            elif fault == "kill":
                job.kill()
                act("SIGKILL the job process group")
                job.start(parallelism, "latest")
                wait_running(rest)
                act("resumed from the latest retained checkpoint")
            elif fault == "broker":
                node = rng.randint(1, kafka.size) if kafka.size > 1 else 1  # one node: the seed's timings of before
                kafka.stop_node(node)
                act("broker stopped" if kafka.size == 1 else f"broker node {node} stopped")
                time.sleep(rng.uniform(2, 5))
                kafka.start_node(node)
                kafka.wait_in_sync()
                act("broker restarted" if kafka.size == 1 else f"broker node {node} restarted, back in sync")
            elif fault == "broker-kill":
                kill_broker(kafka, cfg, rng, plan.broker_down_s, act, report)
            else:
                job_id = wait_running(rest)
                location = rest.stop_with_savepoint(job_id, str(cfg.flink.checkpoint_path()))
                parallelism = 1 if parallelism == 2 else 2
                act(f"stopped with savepoint {Path(location.removeprefix('file:')).name}")
                if cluster is not None:
                    cluster.submit(config_file, parallelism, savepoint=location.removeprefix("file:"))
                else:
                    job.wait_exit(60)
                    job.start(parallelism, location.removeprefix("file:"))
                wait_running(rest)
                act(f"resumed from it at parallelism {parallelism}")
        budget_end = t0 + plan.budget_s if plan.budget_s is not None else float("inf")
        if not produced.wait(timeout=max(0.0, min(plan.requests / plan.rate + 600, budget_end - time.monotonic()))):
            report.problems.append(f"the producer handed over {count.records:,} of {len(stream.records):,} records "
                                   "and had not flushed them when its wait ended")
            act(report.problems[-1])
        elif count.failure is not None:
            report.problems.append(f"the producer stopped after {count.records:,} records: {count.failure}")
            act(report.problems[-1])
        else:
            act("every record produced; waiting for the output")
        total = sum(report.expected.values())
        deadline = min(time.monotonic() + plan.settle_timeout_s, budget_end)
        actual = read_outputs(cfg)
        while sum(len(v) for v in actual.values()) < total and time.monotonic() < deadline:
            time.sleep(5)
            actual = read_outputs(cfg)
        time.sleep(5)  # anything extra would be committed by now
        actual = read_outputs(cfg)
    finally:
        quiet.set()
        job.kill()
        if cluster is not None:
            cluster.stop()
        if own_kafka:
            kafka.stop()
    report.actual = Counter({t: len(v) for t, v in actual.items()})
    report.problems += diff_records(expected, actual, cfg.topics)
    kills = sum("SIGKILL the job" in a or "SIGKILL TaskManager" in a for a in report.actions)
    act(f"done: {kills} kills, {plan.broker_restarts} broker restarts, {plan.broker_kills} broker kills, "
        f"{plan.rescales} savepoint rescales")
    for topic in cfg.topics.outputs():
        mark = "ok" if report.expected[topic] == report.actual[topic] else "DIFFERENT"
        say(f"  {topic:32} expected {report.expected[topic]:7}  read_committed {report.actual[topic]:7}  {mark}")
    if report.problems:
        say(f"FAILED: {len(report.problems)} differences, first ones:")
        for line in report.problems[:20]:
            say(f"  {line[:300]}")
    else:
        say("PASSED: every output topic matches the reference model exactly")
    return report
