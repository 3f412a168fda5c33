"""The systems under test: how each is started, checked for readiness, asked for state, stopped.

Every system runs as processes of its own (started in a new session, so the whole tree can be
killed), reads its own input topic and writes its own output topics, all prefixed with the run.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bench import checkpoints
from bench.feeds import Feed
from bench.measure import AvroParser, JsonParser, Parser
from bench.peers.common import prefixed_topics
from bench.watch import Tally
from harness.cluster import LocalCluster
from harness.local_redis import redis_command
from harness.ports import free_port
from operators.metric_names import (
    ACCEPTED,
    BLOOM_BITS,
    BLOOM_FALSE_POSITIVES,
    BLOOM_FILL_RATIO_PCT,
    BLOOM_KEYS_ESTIMATE,
    DEDUP_COUNTERS,
    DEDUP_OPERATOR,
    DUPLICATES,
    KEYS_HELD,
    LATE,
    NUM_RESTARTS,
    STATE_READS,
    STATE_READS_SKIPPED,
)
from operators.records import Channel, Priority
from ops import kafka_io
from ops.flink_rest import JobControlError, RestClient
from settings import REPO_ROOT, load_settings

EXACTLY_ONCE = "exactly-once"
AT_LEAST_ONCE = "NOT exactly-once (auto-commit, no transactions)"
NO_DURABILITY = "NOT exactly-once (in memory, no durability)"


@dataclass
class Context:
    bootstrap: str
    work: Path
    run_id: str
    partitions: int
    checkpoint_ms: int
    #: a topic of the harness's own, where the live producer writes its first record
    prime_topic: str = ""


class Proc:
    """One started process (and its children), with its output in a log file."""

    def __init__(self, name: str, cmd: list[str], log: Path, env: dict[str, str] | None = None) -> None:
        self.name = name
        self.log = log
        with open(log, "ab") as out:
            self.popen = subprocess.Popen(
                cmd, cwd=REPO_ROOT, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                start_new_session=True, env=env,
            )

    @property
    def pid(self) -> int:
        return self.popen.pid

    def alive(self) -> bool:
        return self.popen.poll() is None

    def terminate(self, grace_s: float) -> None:
        """SIGTERM to the process, then SIGKILL to its whole process group."""
        if self.alive():
            try:
                self.popen.send_signal(signal.SIGTERM)
                self.popen.wait(timeout=grace_s)
            except subprocess.TimeoutExpired:
                pass
        try:
            os.killpg(self.popen.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
        try:
            self.popen.wait(timeout=30)
        except subprocess.TimeoutExpired:
            pass

    def tail(self, lines: int = 15) -> str:
        try:
            return "\n".join(self.log.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return ""


@dataclass
class System:
    key: str
    title: str
    guarantee: str
    #: "avro" or "json" (the dataset), "index" (a pass-through stream: bench/feeds.py)
    input_format: str = "avro"
    procs: list[Proc] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    @property
    def exactly_once(self) -> bool:
        return self.guarantee == EXACTLY_ONCE

    # set by prepare()
    input_topic: str = ""
    output_topics: list[str] = field(default_factory=list)

    def prefix(self, ctx: Context) -> str:
        return f"bench{ctx.run_id}.{self.key}"

    def prepare(self, ctx: Context) -> None:
        self.topics = prefixed_topics(self.prefix(ctx), f"{self.prefix(ctx)}.requests")
        self.input_topic = self.topics.requests
        self.output_topics = self.topics.outputs()
        kafka_io.create_topics({"bootstrap.servers": ctx.bootstrap}, self.topics.all(), ctx.partitions)

    def parser(self) -> Parser:
        lanes = {}
        for channel in Channel:
            lanes[self.topics.channel_topic(channel, Priority.NORMAL)] = "normal"
            lanes[self.topics.channel_topic(channel, Priority.HIGH)] = "priority"
        return AvroParser(lanes, self.topics.duplicates)

    def tally(self, feed: Feed) -> Tally:
        """What the watcher keeps of this system's output."""
        return feed.tally(self.parser())

    def start(self, ctx: Context) -> None:
        raise NotImplementedError

    def wait_ready(self, timeout_s: float) -> None:
        """Returns once the system takes input (Flink: every task RUNNING)."""

    def alive(self) -> bool:
        return bool(self.procs) and all(p.alive() for p in self.procs)

    def metrics(self, processed: int = 0) -> dict[str, Any]:
        """Called while the system still runs, after the last phase (``processed`` requests given)."""
        return {}

    def stop(self) -> None:
        for p in reversed(self.procs):
            p.terminate(grace_s=15)

    def after_stop(self) -> dict[str, Any]:
        """State figures that can only be read once the system stopped."""
        return {}

    def failure(self) -> str:
        return "\n".join(f"--- {p.name} ({p.log}):\n{p.tail()}" for p in self.procs)

    def cleanup(self, ctx: Context) -> None:
        """Delete this run's topics: the broker holds only the running system's (its per-partition
        work would otherwise grow from round to round)."""
        delete_topics(ctx.bootstrap, [self.input_topic, *self.output_topics, *self.extra_topics()])

    def extra_topics(self) -> list[str]:
        topics = getattr(self, "topics", None)
        return list(topics.all()) if topics is not None else []


# -- Flink (the job and the SQL peer) --------------------------------------------------------


class FlinkSystem(System):
    rest: RestClient
    parallelism: int = 1
    job_id: str | None = None

    def wait_ready(self, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if not self.alive():
                raise RuntimeError(f"{self.key} exited during start-up:\n{self.failure()}")
            try:
                jobs = [j for j in self.rest.call("GET", "/jobs/overview")["jobs"] if j["state"] == "RUNNING"]
                if len(jobs) == 1:
                    detail = self.rest.call("GET", f"/jobs/{jobs[0]['jid']}")
                    if all(v["status"] == "RUNNING" for v in detail["vertices"]):
                        self.job_id = str(jobs[0]["jid"])
                        return
            except JobControlError:
                pass
            time.sleep(0.3)
        raise TimeoutError(f"{self.key}: no running job after {timeout_s:.0f} s")

    def checkpoint_history(self) -> list[dict[str, Any]]:
        """The REST API's recent checkpoints (``history``; bench.checkpoints keeps them all)."""
        if not self.job_id:
            return []
        return checkpoints.job_history(self.rest, self.job_id)

    def checkpoint_stats(self) -> dict[str, Any]:
        if not self.job_id:
            return {}
        try:
            cps = self.rest.call("GET", f"/jobs/{self.job_id}/checkpoints")
            restarts = self.rest.call("GET", f"/jobs/{self.job_id}/metrics?get={NUM_RESTARTS}")
        except JobControlError as exc:
            return {"error": str(exc)}
        latest = (cps.get("latest") or {}).get("completed") or {}
        failed = (cps.get("latest") or {}).get("failed") or {}
        e2e = (cps.get("summary") or {}).get("end_to_end_duration") or {}
        return {
            "completed": (cps.get("counts") or {}).get("completed"),
            "failed": (cps.get("counts") or {}).get("failed"),
            "latest_state_size": latest.get("state_size"),
            "latest_checkpointed_size": latest.get("checkpointed_size"),
            "duration_ms_avg": e2e.get("avg"),
            "duration_ms_max": e2e.get("max"),
            "latest_failure": (failed.get("failure_message") or "")[:300] or None,
            "restarts": next((float(m["value"]) for m in restarts or [] if m.get("id") == NUM_RESTARTS),
                             None),
        }

    def write_job_config(self, ctx: Context) -> tuple[Path, Path, int]:
        """This run's working directory, the job's configuration file in it, and its REST port."""
        work = ctx.work / self.key
        work.mkdir(parents=True, exist_ok=True)
        rest_port = free_port()
        config = work / "job.toml"
        config.write_text(self.job_config(ctx, rest_port, self.parallelism))
        return work, config, rest_port

    def job_config(self, ctx: Context, rest_port: int, parallelism: int) -> str:
        """The job's configuration file for this run (the job's and the ceiling's)."""
        topics = "\n".join(f'{role} = "{name}"' for role, name in self.topics.by_role().items())
        return "\n".join([
            "[kafka]", f'bootstrap_servers = "{ctx.bootstrap}"', f'group_id = "{self.prefix(ctx)}"',
            "[topics]", topics,
            "[flink]", f"parallelism = {parallelism}",
            f'checkpoint_dir = "{ctx.work / self.key / "checkpoints"}"',
            f"checkpoint_interval_ms = {ctx.checkpoint_ms}", f"rest_port = {rest_port}",
            f'transactional_id_prefix = "{self.prefix(ctx)}-{uuid.uuid4().hex[:6]}"',
            "transaction_timeout_ms = 600000", "",
        ])

    def stop(self) -> None:
        if self.job_id:
            try:
                self.rest.call("PATCH", f"/jobs/{self.job_id}?mode=cancel")
                deadline = time.monotonic() + 20
                while time.monotonic() < deadline and self.alive():
                    time.sleep(0.3)
            except JobControlError:
                pass
        for p in self.procs:
            p.terminate(grace_s=5)


class DedupJob(FlinkSystem):
    """This job: ``python -m dedupctl.cli --config FILE run --parallelism N``."""

    METRICS = (*DEDUP_COUNTERS, KEYS_HELD, BLOOM_BITS, BLOOM_KEYS_ESTIMATE, BLOOM_FILL_RATIO_PCT)

    def __init__(self, parallelism: int) -> None:
        super().__init__(f"job-p{parallelism}", f"notify-dedup job, parallelism {parallelism}", EXACTLY_ONCE)
        self.parallelism = parallelism

    def start(self, ctx: Context) -> None:
        work, config, port = self.write_job_config(ctx)
        self.rest = RestClient(f"http://127.0.0.1:{port}")
        cmd = [sys.executable, "-m", "dedupctl.cli", "--config", str(config), "run",
               "--parallelism", str(self.parallelism)]
        self.procs = [Proc("job", cmd, work / "job.log")]

    def metrics(self, processed: int = 0) -> dict[str, Any]:
        out: dict[str, Any] = {"checkpoints": self.checkpoint_stats()}
        if not self.job_id:
            return out
        # the REST API serves metrics fetched every 10 s (metrics.fetcher.update-interval):
        # wait until they count every request given to the job
        deadline = time.monotonic() + 25
        while True:
            try:
                m = self.rest.operator_metrics(self.job_id, DEDUP_OPERATOR, list(self.METRICS))
            except JobControlError as exc:
                out["dedup_metrics_error"] = str(exc)
                return out
            decided = m[ACCEPTED] + m[DUPLICATES] + m[LATE]
            if decided >= processed or time.monotonic() > deadline:
                break
            if not any(m.values()) and time.monotonic() > deadline - 13:
                break  # nothing at all after a full fetch interval: no such metrics
            time.sleep(1)
        out["metrics_decided"] = decided
        out["dedup_metrics"] = m
        if not any(m.values()):
            out["dedup_metrics_error"] = f"no operator named {DEDUP_OPERATOR!r} reports these metrics"
            return out
        reads, skipped, fps = m[STATE_READS], m[STATE_READS_SKIPPED], m[BLOOM_FALSE_POSITIVES]
        keys = m[KEYS_HELD]
        out["bloom"] = {
            "bits_per_key": m[BLOOM_BITS] / keys if keys else None,
            "fp_rate": fps / (skipped + fps) if skipped + fps else None,
            "reads_skipped_share": skipped / (reads + skipped) if reads + skipped else None,
        }
        return out


class DedupJobCluster(DedupJob):
    """This job on a standalone cluster of one TaskManager per core, one slot each.

    In thread mode every Python operator of one JVM shares one interpreter and its GIL, so on the
    mini-cluster (one JVM) a second subtask adds no Python throughput. Here each subtask has a
    TaskManager, and so an interpreter, of its own, as on a cluster with a TaskManager per core.
    The JobManager and TaskManagers run in the foreground under the harness; the job is submitted
    with ``flink run -py``.
    """

    def __init__(self, taskmanagers: int) -> None:
        super().__init__(taskmanagers)
        self.key = f"job-p{taskmanagers}-tm{taskmanagers}"
        self.title = f"notify-dedup job, parallelism {taskmanagers}, {taskmanagers} TaskManagers"
        self.taskmanagers = taskmanagers

    def start(self, ctx: Context) -> None:
        work, config, rest_port = self.write_job_config(ctx)
        cluster = LocalCluster(work / "cluster", rest_port, free_port(), slots=1,
                               settings=load_settings(config, env={}))
        self.rest = cluster.rest
        cmd, env = cluster.foreground("jobmanager")
        self.procs = [Proc("jobmanager", cmd, work / "jobmanager.log", env)]
        cmd, env = cluster.foreground("taskmanager")
        self.procs += [Proc(f"taskmanager-{i}", cmd, work / f"taskmanager-{i}.log", env)
                       for i in range(self.taskmanagers)]
        cluster.wait_taskmanagers(self.taskmanagers)
        cluster.submit(config, self.parallelism)


class FlinkSql(FlinkSystem):
    """Flink SQL deduplication, JSON in and out (bench/peers/flink_sql.py)."""

    def __init__(self, parallelism: int, variant: str = "rownumber") -> None:
        what = "ROW_NUMBER dedup" if variant == "rownumber" else "over-aggregation"
        super().__init__(f"flink-sql-p{parallelism}", f"Flink SQL {what}, parallelism {parallelism}",
                         EXACTLY_ONCE, input_format="json")
        self.parallelism = parallelism
        self.variant = variant
        self.notes.append("JSON in and out (a JSON copy of the dataset); the SQL derives the dedup key")

    def prepare(self, ctx: Context) -> None:
        p = self.prefix(ctx)
        self.input_topic = f"{p}.requests.json"
        self.accepted, self.duplicates = f"{p}.accepted", f"{p}.duplicates"
        self.output_topics = [self.accepted, self.duplicates]
        kafka_io.create_topics({"bootstrap.servers": ctx.bootstrap},
                               [self.input_topic, *self.output_topics], ctx.partitions)

    def parser(self) -> Parser:
        return JsonParser(self.accepted, self.duplicates)

    def start(self, ctx: Context) -> None:
        work = ctx.work / self.key
        work.mkdir(parents=True, exist_ok=True)
        port = free_port()
        self.rest = RestClient(f"http://127.0.0.1:{port}")
        cmd = [sys.executable, "-m", "bench.peers.flink_sql", "--bootstrap", ctx.bootstrap,
               "--input", self.input_topic, "--accepted", self.accepted, "--duplicates", self.duplicates,
               "--group", self.prefix(ctx), "--txn-prefix", f"{self.prefix(ctx)}-{uuid.uuid4().hex[:6]}",
               "--checkpoint-dir", str(work / "checkpoints"), "--checkpoint-ms", str(ctx.checkpoint_ms),
               "--rest-port", str(port), "--parallelism", str(self.parallelism), "--variant", self.variant]
        self.procs = [Proc("flink-sql", cmd, work / "flink-sql.log")]

    def metrics(self, processed: int = 0) -> dict[str, Any]:
        return {"checkpoints": self.checkpoint_stats()}


class Ceiling(FlinkSystem):
    """The exactly-once pass-through (bench/peers/ceiling.py): raw bytes, JVM only, with the job's
    configuration file and so its checkpointing and sink settings."""

    def __init__(self, parallelism: int = 1) -> None:
        super().__init__("ceiling", f"exactly-once pass-through (ceiling), parallelism {parallelism}",
                         EXACTLY_ONCE, input_format="index")
        self.parallelism = parallelism
        self.notes.append("Flink SQL, raw format in and out, the job's Kafka source and sink settings")

    def prepare(self, ctx: Context) -> None:
        p = self.prefix(ctx)
        self.topics = prefixed_topics(p, f"{p}.requests")
        self.input_topic = self.topics.requests
        self.output_topics = [f"{p}.passthrough"]
        kafka_io.create_topics({"bootstrap.servers": ctx.bootstrap}, [self.input_topic, *self.output_topics],
                               ctx.partitions)

    def extra_topics(self) -> list[str]:
        return []

    def tally(self, feed: Feed) -> Tally:
        return feed.tally(None)

    def start(self, ctx: Context) -> None:
        work, config, port = self.write_job_config(ctx)
        self.rest = RestClient(f"http://127.0.0.1:{port}")
        cmd = [sys.executable, "-m", "bench.peers.ceiling", "--config", str(config),
               "--output", self.output_topics[0]]
        self.procs = [Proc("ceiling", cmd, work / "ceiling.log")]

    def metrics(self, processed: int = 0) -> dict[str, Any]:
        return {"checkpoints": self.checkpoint_stats()}


# -- Python peers ----------------------------------------------------------------------------


class PythonPeer(System):
    """A peer process that writes ``ready`` once imported and configured, just before it consumes."""

    work: Path

    def ready_file(self) -> Path:
        return self.work / "ready"

    def wait_ready(self, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        while not self.ready_file().exists():
            if not self.alive():
                raise RuntimeError(f"{self.key} exited during start-up:\n{self.failure()}")
            if time.monotonic() > deadline:
                raise TimeoutError(f"{self.key}: not ready after {timeout_s:.0f} s")
            time.sleep(0.05)


class Quix(PythonPeer):
    def __init__(self) -> None:
        super().__init__("quix", "Quix Streams, RocksDB state", EXACTLY_ONCE)
        self.notes.append("state per message key (user id), TTL = window from the record timestamp")

    def start(self, ctx: Context) -> None:
        self.work = ctx.work / self.key
        self.work.mkdir(parents=True, exist_ok=True)
        self.ready_file().unlink(missing_ok=True)
        cmd = [sys.executable, "-m", "bench.peers.quix_app", "--bootstrap", ctx.bootstrap,
               "--input", self.input_topic, "--prefix", self.prefix(ctx), "--group", self.prefix(ctx),
               "--state-dir", str(self.work / "state"), "--commit-interval-s", str(ctx.checkpoint_ms / 1000),
               "--ready-file", str(self.ready_file())]
        self.procs = [Proc("quix", cmd, self.work / "quix.log")]

    def after_stop(self) -> dict[str, Any]:
        return {"state_bytes": dir_size(self.work / "state"), "state_source": "RocksDB files on disk"}


class Loop(PythonPeer):
    def __init__(self, store: str) -> None:
        if store == "redis":
            super().__init__("redis", "consumer loop + Redis SET NX", AT_LEAST_ONCE)
        else:
            super().__init__("memory", "consumer loop + Python dict", NO_DURABILITY)
        self.store = store

    def start(self, ctx: Context) -> None:
        self.work = ctx.work / self.key
        self.work.mkdir(parents=True, exist_ok=True)
        self.ready_file().unlink(missing_ok=True)
        self.stats_file = self.work / "stats.json"
        cmd = [sys.executable, "-m", "bench.peers.loop", "--bootstrap", ctx.bootstrap, "--input",
               self.input_topic, "--prefix", self.prefix(ctx), "--group", self.prefix(ctx),
               "--store", self.store, "--stats", str(self.stats_file), "--ready-file", str(self.ready_file())]
        if self.store == "redis":
            port = free_port()
            redis = Proc("redis-server", redis_command(port, self.work), self.work / "redis.log")
            self.procs = [redis]
            wait_port(port, 30, redis)
            cmd += ["--redis-port", str(port)]
        self.procs.append(Proc(f"loop-{self.store}", cmd, self.work / "loop.log"))

    def stop(self) -> None:
        # the loop first (it writes its stats, reading Redis), then Redis
        for p in reversed(self.procs):
            p.terminate(grace_s=20)

    def after_stop(self) -> dict[str, Any]:
        try:
            stats = json.loads(self.stats_file.read_text())
        except (OSError, ValueError):
            return {}
        source = ("Redis used_memory growth" if self.store == "redis"
                  else "sys.getsizeof of dict, entries, heap")
        return {"state_bytes": stats.get("state_bytes"), "state_source": source, "peer_stats": stats}


def wait_port(port: int, timeout_s: float, proc: Proc) -> None:
    import socket

    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if not proc.alive():
            raise RuntimeError(f"{proc.name} exited:\n{proc.tail()}")
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=1):
                return
        except OSError:
            time.sleep(0.1)
    raise TimeoutError(f"{proc.name} did not listen on {port}")


def delete_topics(bootstrap: str, topics: list[str]) -> None:
    from confluent_kafka.admin import AdminClient

    names = sorted({t for t in topics if t})
    if not names:
        return
    # the client is kept until its futures are settled: one collected at once purges their results
    # ("Purging 2 unserved events from background queue") and result() would wait for ever
    admin = AdminClient({"bootstrap.servers": bootstrap})
    for future in admin.delete_topics(names, operation_timeout=30, request_timeout=60).values():
        try:
            future.result(timeout=90)
        except Exception:  # noqa: BLE001 - already gone, or never made: nothing to clean
            pass


def dir_size(path: Path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file()) if path.exists() else 0


def ensure_redis_server(say: Any) -> str | None:
    """The redis-server binary, installing Debian's package when missing; None: skip the peer."""
    found = shutil.which("redis-server")
    if found:
        return found
    if os.geteuid() != 0 or not shutil.which("apt-get"):
        say("redis-server is missing and cannot be installed here (needs root and apt-get): "
            "skipping the Redis peer. Install it with `apt-get install -y redis-server`.")
        return None
    say("redis-server is missing: installing Debian's redis-server package")
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    install = ["apt-get", "install", "-y", "-q", "redis-server"]
    try:
        if subprocess.run(install, env=env, capture_output=True, timeout=600).returncode != 0:
            subprocess.run(["apt-get", "update", "-q"], env=env, capture_output=True, timeout=600)
            subprocess.run(install, env=env, capture_output=True, timeout=600)
    except (OSError, subprocess.TimeoutExpired) as exc:
        say(f"apt-get failed: {exc}")
    found = shutil.which("redis-server")
    if not found:
        say("installing redis-server failed: skipping the Redis peer")
    return found


ALL = ("ceiling", "job-p1", "job-p2", "job-p2-tm2", "quix", "flink-sql-p1", "flink-sql-p2", "redis", "memory")
QUICK = ("ceiling", "job-p1", "quix", "flink-sql-p1", "redis", "memory")


def make(key: str, sql_variant: str = "rownumber") -> System:
    if key == "ceiling":
        return Ceiling()
    if key in ("job-p1", "job-p2"):
        return DedupJob(int(key[-1]))
    if key == "job-p2-tm2":
        return DedupJobCluster(2)
    if key == "quix":
        return Quix()
    if key in ("flink-sql-p1", "flink-sql-p2"):
        return FlinkSql(int(key[-1]), sql_variant)
    if key in ("redis", "memory"):
        return Loop(key)
    raise ValueError(f"unknown system {key!r}; one of {', '.join(ALL)}")
