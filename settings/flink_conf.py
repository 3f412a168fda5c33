"""What Flink is told, in one place: the job's own settings, derived from ``Settings``, and one
overlay per environment the job runs in.

* ``kafka_source(cfg)``, ``kafka_sink(cfg)``: the Java client properties of the job's Kafka
  source and exactly-once sink.
* ``job(cfg)``: state backend, checkpoints, restarts, parallelism, PyFlink's execution mode: what
  the job sets itself when it starts (jobs/dedup_job.py), wherever it runs. On a cluster Flink
  stacks them over the cluster's config.yaml, and the job's win.
* ``mini_cluster(cfg)``: the job's settings plus what the local mini-cluster of ``dedupctl run``
  needs: REST on 127.0.0.1 at ``flink.rest_port``, a slot per subtask, this interpreter for Python.
* ``standalone(cfg, ...)``: the config.yaml of the cluster that harness/cluster.py starts from the
  PyPI distribution's scripts (JobManager and TaskManagers as processes on 127.0.0.1).
* ``compose(cfg)``: flink-conf/config.yaml, of the cluster in docker-compose.yml (the job's
  settings from deploy/cluster.toml), with the Prometheus reporter the dashboard reads. It is
  generated; edit this module or deploy/cluster.toml, then::

      python -m settings.flink_conf --write flink-conf/config.yaml

  (tests/settings/test_flink_conf.py fails while the committed file differs).

Values are typed (``True``, ``3``, ``"5s"``) so that the YAML says what it means; ``as_strings``
gives the strings a ``pyflink.common.Configuration`` takes.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import re
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from operators.metric_names import ROCKSDB_PROPERTIES
from settings.base import REPO_ROOT
from settings.model import Settings, load_settings

Value = str | int | bool
Conf = dict[str, Value]

#: the compose cluster's job configuration (the submit-job service runs the job with it)
CLUSTER_TOML = REPO_ROOT / "deploy" / "cluster.toml"
COMPOSE_CONFIG = REPO_ROOT / "flink-conf" / "config.yaml"
#: the port of Flink's Prometheus reporter (deploy/prometheus/prometheus.yml scrapes it)
PROMETHEUS_PORT = 9249
PROMETHEUS_FACTORY = "org.apache.flink.metrics.prometheus.PrometheusReporterFactory"


def duration(ms: int) -> str:
    """A Flink duration: ``5s``, ``2min``, ``500ms``."""
    if ms and ms % 60_000 == 0:
        return f"{ms // 60_000}min"
    if ms and ms % 1000 == 0:
        return f"{ms // 1000}s"
    return f"{ms}ms"


# -- the job's own settings ---------------------------------------------------------------------


def state_backend(cfg: Settings) -> Conf:
    """RocksDB, incremental checkpoints, and the native metrics ``dedupctl status`` and the
    dashboard read (per column family)."""
    conf: Conf = {"state.backend.type": "rocksdb", "execution.checkpointing.incremental": True}
    conf |= {f"state.backend.rocksdb.metrics.{prop}": True for prop in ROCKSDB_PROPERTIES}
    return conf


def checkpointing(cfg: Settings) -> Conf:
    """Exactly-once checkpoints, retained on cancel (``dedupctl run --resume latest`` finds them).

    The pause after a checkpoint is at least half the interval: a checkpoint slower than that
    (a backlog, a slow disk) delays the next one rather than leaving the job no time between
    them; one faster keeps the interval, the latency of the output."""
    f = cfg.flink
    return {
        "execution.checkpointing.dir": f.checkpoint_uri(),
        "execution.checkpointing.savepoint-dir": f.savepoint_uri(),
        "execution.checkpointing.interval": duration(f.checkpoint_interval_ms),
        "execution.checkpointing.min-pause": duration(f.checkpoint_interval_ms // 2),
        "execution.checkpointing.timeout": duration(f.checkpoint_timeout_ms),
        "execution.checkpointing.mode": "EXACTLY_ONCE",
        "execution.checkpointing.externalized-checkpoint-retention": "RETAIN_ON_CANCELLATION",
        "execution.checkpointing.num-retained": 3,
    }


def restarts(cfg: Settings) -> Conf:
    """Bounded: after ``flink.restart_attempts`` restarts the job fails instead of looping."""
    f = cfg.flink
    return {
        "restart-strategy.type": "fixed-delay",
        "restart-strategy.fixed-delay.attempts": f.restart_attempts,
        "restart-strategy.fixed-delay.delay": duration(f.restart_delay_ms),
    }


def parallelism(cfg: Settings) -> Conf:
    f = cfg.flink
    return {
        "parallelism.default": f.parallelism,
        "pipeline.max-parallelism": f.max_parallelism,
        # each watermark closes the mini-batches into Python: fewer, larger calls
        "pipeline.auto-watermark-interval": duration(cfg.dedup.watermark_interval_ms),
    }


def python_job(cfg: Settings) -> Conf:
    """PyFlink: thread mode runs the Python operator inside the TaskManager's JVM (pemja)."""
    f = cfg.flink
    return {
        "python.execution-mode": f.execution_mode,
        "python.fn-execution.bundle.size": f.bundle_size,
        "python.fn-execution.bundle.time": f.bundle_time_ms,
    }


def python_executables(executable: str) -> Conf:
    """The interpreter of the Python operators and of the client; it must have this project."""
    return {"python.executable": executable, "python.client.executable": executable}


def job(cfg: Settings) -> Conf:
    """What the job sets itself, in every environment."""
    return state_backend(cfg) | checkpointing(cfg) | restarts(cfg) | parallelism(cfg) | python_job(cfg)


def kafka_source(cfg: Settings) -> dict[str, str]:
    """The Java client properties of the job's KafkaSource (jobs/dedup_job.py), also the
    benchmark's pass-through ceiling's (bench/peers/ceiling.py)."""
    return {
        "isolation.level": "read_committed",
        "partition.discovery.interval.ms": "30000",
        "commit.offsets.on.checkpoint": "true",
        "fetch.min.bytes": str(cfg.kafka.source_fetch_min_bytes),
        "fetch.max.wait.ms": str(cfg.kafka.source_fetch_max_wait_ms),
        **cfg.kafka.java_properties(),
    }


def kafka_sink(cfg: Settings) -> dict[str, str]:
    """The Java client properties of the job's exactly-once KafkaSink (its transactional id
    prefix is ``flink.transactional_id_prefix``), also the benchmark's ceiling's."""
    k = cfg.kafka
    return {
        "transaction.timeout.ms": str(cfg.flink.transaction_timeout_ms),
        "enable.idempotence": "true",
        "compression.type": k.sink_compression,
        "linger.ms": str(k.sink_linger_ms),
        "retry.backoff.ms": str(k.sink_retry_backoff_ms),
        "batch.size": "262144",
        "max.request.size": str(k.sink_max_request_bytes),
        **k.java_properties(),
    }


# -- the environments ---------------------------------------------------------------------------


def local_rest(port: int) -> Conf:
    return {"rest.address": "127.0.0.1", "rest.bind-address": "127.0.0.1", "rest.port": port}


def mini_cluster(cfg: Settings, python: str | None = sys.executable) -> Conf:
    """The local mini-cluster (``dedupctl run``, the tests, the benchmark's peers); ``python``
    None: a job without Python operators (the Flink SQL peer)."""
    conf = job(cfg)
    if python is None:
        conf = {k: v for k, v in conf.items() if not k.startswith("python.")}
    else:
        conf |= python_executables(python)
    return conf | local_rest(cfg.flink.rest_port) | {
        "taskmanager.numberOfTaskSlots": max(1, cfg.flink.parallelism),
        # the job's classloader closes with the job, while the Kafka clients' threads it started
        # may still load a class on their way out: without the check that is harmless, with it
        # an IllegalStateException ("Trying to access closed classloader") printed after the end
        "classloader.check-leaked-classloader": False,
    }


def distribution_java_opts(flink_home: Path | None = None) -> str:
    """``env.java.opts.all`` of the Flink distribution (its --add-opens, needed on Java 17)."""
    home = flink_home or pyflink_home()
    text = (home / "conf" / "config.yaml").read_text(encoding="utf-8")
    match = re.search(r"^\s+all: (--add-exports.*)$", text, re.MULTILINE)
    return match.group(1).strip() if match else ""


def pyflink_home() -> Path:
    """The Flink distribution inside the installed PyFlink (bin/, lib/, conf/), not imported."""
    spec = importlib.util.find_spec("pyflink")
    if spec is None or spec.origin is None:
        raise ModuleNotFoundError("pyflink is not installed")
    return Path(spec.origin).resolve().parent


def standalone(
    cfg: Settings, *, rest_port: int, rpc_port: int, slots: int, java_opts: str, python: str = sys.executable
) -> Conf:
    """The standalone cluster of harness/cluster.py: everything on 127.0.0.1, small memory, fast
    heartbeats (a killed TaskManager is noticed in seconds), and the job's settings."""
    return {
        "env.java.opts.all": java_opts,
        "jobmanager.rpc.address": "127.0.0.1",
        "jobmanager.rpc.port": rpc_port,
        "jobmanager.bind-host": "127.0.0.1",
        "taskmanager.bind-host": "127.0.0.1",
        "taskmanager.host": "127.0.0.1",
        **local_rest(rest_port),
        "jobmanager.memory.process.size": "1024m",
        "taskmanager.memory.process.size": "1728m",
        "taskmanager.numberOfTaskSlots": slots,
        "heartbeat.timeout": 10000,
        "heartbeat.interval": 2000,
        **job(cfg),
        **python_executables(python),
    }


def prometheus_reporter(port: int = PROMETHEUS_PORT) -> Conf:
    """Flink's Prometheus reporter (deploy/prometheus scrapes it; tests/ops runs it on the
    mini-cluster). Metric names: operators/metric_names.py."""
    return {
        "metrics.reporters": "prom",
        "metrics.reporter.prom.factory.class": PROMETHEUS_FACTORY,
        "metrics.reporter.prom.port": port,
    }


@dataclass(frozen=True)
class Group:
    """Settings under one comment of a config.yaml."""

    title: str
    comment: str
    values: Conf


def compose(cfg: Settings, java_opts: str | None = None) -> tuple[Group, ...]:
    """flink-conf/config.yaml: the cluster of docker-compose.yml, ``cfg`` its job's settings
    (deploy/cluster.toml)."""
    f = cfg.flink
    return (
        Group("JVM (the distribution's defaults, required on Java 17)", "",
              {"env.java.opts.all": java_opts if java_opts is not None else distribution_java_opts()}),
        Group("Addresses (service names on the compose network)", "", {
            "jobmanager.rpc.address": "jobmanager",
            "jobmanager.rpc.port": 6123,
            "jobmanager.bind-host": "0.0.0.0",
            "taskmanager.bind-host": "0.0.0.0",
            "rest.address": "jobmanager",
            "rest.port": 8081,
            "rest.bind-address": "0.0.0.0",
            "blob.server.port": 6124,
        }),
        Group("Resources (sized for a laptop)",
              "One TaskManager with a slot per subtask of the job (flink.parallelism).", {
                  "jobmanager.memory.process.size": "1600m",
                  "taskmanager.memory.process.size": "2048m",
                  "taskmanager.numberOfTaskSlots": f.parallelism,
                  **parallelism(cfg),
                  "jobmanager.execution.failover-strategy": "region",
              }),
        Group("State backend and checkpoints",
              "RocksDB native metrics per state and operator, reported by the TaskManagers. Three\n"
              "failed checkpoints in a row are tolerated, the next fails the job\n"
              "(DedupCheckpointsFailing alerts before).", {
                  **state_backend(cfg),
                  "execution.checkpointing.storage": "filesystem",
                  **checkpointing(cfg),
                  "execution.checkpointing.max-concurrent-checkpoints": 1,
                  "execution.checkpointing.tolerable-failed-checkpoints": 3,
              }),
        Group("Restarts: fixed delay, bounded",
              "After flink.restart_attempts restarts the job goes to FAILED instead of restarting forever.",
              restarts(cfg)),
        Group("PyFlink",
              "Thread mode runs Python UDFs inside the TaskManager JVM (pemja); it needs\n"
              "flink-python-*.jar in lib/ and a python3 with a shared libpython, both\n"
              "provided by deploy/flink/Dockerfile (python3 resolves to /opt/venv/bin).",
              python_job(cfg) | python_executables("python3")),
        Group("Metrics",
              "The Prometheus reporter ships in plugins/metrics-prometheus of the image;\n"
              "deploy/prometheus/prometheus.yml scrapes the JobManager and every TaskManager.",
              prometheus_reporter()),
    )


def flatten(groups: Sequence[Group]) -> Conf:
    out: Conf = {}
    for g in groups:
        for key, value in g.values.items():
            if key in out and out[key] != value:
                raise ValueError(f"{key} is set twice, to {out[key]!r} and {value!r}")
            out[key] = value
    return out


def as_strings(conf: Mapping[str, Value]) -> dict[str, str]:
    """The values as ``Configuration.set_string`` takes them."""
    return {k: ("true" if v else "false") if isinstance(v, bool) else str(v) for k, v in conf.items()}


# -- config.yaml --------------------------------------------------------------------------------

_PLAIN = re.compile(r"[A-Za-z0-9/._@-][A-Za-z0-9/._:@=,+ -]*")
_YAML_WORDS = {"true", "false", "yes", "no", "on", "off", "null", "~", "y", "n"}

HEADER = """\
# Flink 2.2 cluster configuration for the notify-dedup compose stack.
#
# GENERATED by `python -m settings.flink_conf --write flink-conf/config.yaml` from
# settings/flink_conf.py (the cluster's settings) and deploy/cluster.toml (the job's, which the
# job sets again when it is submitted). Edit those and run the command; do not edit this file
# (tests/settings/test_flink_conf.py fails while it differs from what the command writes).
#
# Flink 2.x reads conf/config.yaml (standard YAML). Keys are written flat here
# (`a.b.c: value` is the same option as the nested form) so that they can be
# grepped and compared with the Flink configuration reference one-to-one.
#
# This file is baked into the image by deploy/flink/Dockerfile. The image's
# entrypoint rewrites conf/config.yaml at start-up (it sets
# jobmanager.rpc.address and applies $FLINK_PROPERTIES), so it must not be
# bind-mounted read-only; per-container overrides go into FLINK_PROPERTIES in
# docker-compose.yml.
"""


def yaml_scalar(value: Value) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    plain = bool(_PLAIN.fullmatch(value)) and not value.endswith(" ") and ": " not in value
    if plain and value.lower() not in _YAML_WORDS:
        try:
            float(value)
        except ValueError:
            return value
    return json.dumps(value)


def render_yaml(groups: Sequence[Group], header: str = HEADER) -> str:
    flatten(groups)  # no key twice
    lines = [header.rstrip("\n")]
    for g in groups:
        lines += ["", f"# --- {g.title} " + "-" * max(3, 72 - len(g.title))]
        lines += [f"# {line}" if line else "#" for line in g.comment.splitlines()]
        lines += [f"{key}: {yaml_scalar(value)}" for key, value in g.values.items()]
    return "\n".join(lines) + "\n"


def compose_yaml(cluster_toml: Path = CLUSTER_TOML) -> str:
    """flink-conf/config.yaml as this module writes it."""
    return render_yaml(compose(load_settings(cluster_toml, env={})))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Write (or check) flink-conf/config.yaml of the compose cluster")
    group = parser.add_mutually_exclusive_group()
    group.add_argument("--write", type=Path, metavar="PATH", help="write it here")
    group.add_argument("--check", type=Path, metavar="PATH", help="exit 1 if the file there differs")
    args = parser.parse_args(argv)
    text = compose_yaml()
    if args.write:
        args.write.write_text(text, encoding="utf-8")
    elif args.check:
        current = args.check.read_text(encoding="utf-8") if args.check.exists() else ""
        if current != text:
            sys.stderr.write(f"{args.check} differs from what settings/flink_conf.py generates: run\n"
                             f"  python -m settings.flink_conf --write {args.check}\n")
            return 1
    else:
        sys.stdout.write(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
