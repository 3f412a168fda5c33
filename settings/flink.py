"""The ``[flink]`` section: how the job runs. What Flink itself is told is derived from it in
settings/flink_conf.py."""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import Field

from operators.errors import ConfigError
from settings.base import Flag, Section


def _as_uri(directory: str) -> str:
    if "://" in directory:
        return directory
    return Path(directory).resolve().as_uri()


class FlinkSettings(Section):
    """How the job runs.

    :param parallelism: parallelism of every operator
    :param max_parallelism: key groups; fixed for the life of the state, so keep it stable
    :param checkpoint_dir: retained checkpoints (and, by default, savepoints) live here
    :param savepoint_dir: where savepoints go when no target is given; empty: ``checkpoint_dir``
    :param checkpoint_interval_ms: also the latency of exactly-once output: a one-time code waits
        for the rest of the interval and the checkpoint itself (codes API -> provider p99 during
        a campaign flood: one broker, 1 s 1.2-1.3 s, 500 ms 0.8-0.9 s; three brokers on 2 cores,
        with the sink's retry backoff at 10 ms (``kafka.sink_retry_backoff_ms``), 1 s 1.56-2.04 s,
        500 ms 0.78-1.17 s; 5 s 5.3 s; what 500 ms costs the job: README "The checkpoint
        interval", bench/results/checkpoint-interval-2026-12-07/); the pause between two
        checkpoints is at least half of it
    :param checkpoint_timeout_ms: a checkpoint slower than this fails
    :param transaction_timeout_ms: Kafka transaction timeout of the sink; below the broker's
        transaction.max.timeout.ms (15 min) and above checkpoint interval + restart time
    :param transactional_id_prefix: must be stable across restarts and unique per job
    :param transaction_naming: how the sink names its transactions (flink-connector-kafka's
        ``TransactionNamingStrategy``). ``pooling``: it reuses a few transactional ids per
        subtask. ``incrementing`` (the connector's default): a new id every checkpoint, each of
        which the brokers keep for ``transactional.id.expiration.ms`` (7 days) and whose new
        producer id every output partition keeps for ``producer.id.expiration.ms`` (1 day):
        at the 500 ms interval that is 1.2 million ids a week per subtask (FLINK-34554; README
        "The sink's transactional ids": 4 against 448 ids after 100 s). ``pooling`` finds what a
        failed run left open through the output topics' producers. A state written under
        ``pooling`` is not restored under ``incrementing`` (the connector does not support that
        way back); the other way is how an existing deployment moves to ``pooling``
    :param execution_mode: PyFlink python.execution-mode, thread or process
    :param restart_attempts: fixed-delay restarts before the job fails
    :param restart_delay_ms: delay between restarts
    :param rest_port: REST port of the local mini-cluster (dedupctl stop/status use it)
    :param nice: ``dedupctl run`` runs the local mini-cluster at this CPU nice (0-19; 0: as
        started): below the API and the broker when they share a host (ops/priority.py); a
        cluster's TaskManagers are the cluster's to place
    :param cpu_idle: ``dedupctl run`` runs the local mini-cluster in a CPU-idle control group,
        the senders' too (``senders.cpu_idle``): the scheduler gives it only the CPU the API and
        the broker leave, with a guard against its starvation (ops/cpu_idle.py; needs write
        access to the cgroup hierarchy, else a warning); on systemd, ``CPUWeight=idle`` instead
    :param bundle_size: PyFlink python.fn-execution.bundle.size
    :param bundle_time_ms: PyFlink python.fn-execution.bundle.time
    """

    parallelism: int = 1
    max_parallelism: int = 128
    checkpoint_dir: str = ".data/checkpoints"
    savepoint_dir: str = ""
    checkpoint_interval_ms: int = 500
    checkpoint_timeout_ms: int = 120_000
    transaction_timeout_ms: int = 600_000
    transactional_id_prefix: str = "notify-dedup"
    transaction_naming: Literal["pooling", "incrementing"] = "pooling"
    execution_mode: Literal["thread", "process"] = "thread"
    restart_attempts: int = 10
    restart_delay_ms: int = 2_000
    rest_port: int = 8081
    nice: int = Field(default=0, ge=0, le=19)
    cpu_idle: Flag = False
    bundle_size: int = 1000
    bundle_time_ms: int = 100

    def checkpoint_uri(self) -> str:
        """The directory as a URI; a plain path is taken relative to the working directory."""
        return _as_uri(self.checkpoint_dir)

    def savepoint_uri(self) -> str:
        """Where savepoints go by default, as a URI (``checkpoint_uri()`` unless set)."""
        return _as_uri(self.savepoint_dir) if self.savepoint_dir else self.checkpoint_uri()

    def checkpoint_path(self) -> Path:
        uri = self.checkpoint_uri()
        if not uri.startswith("file://"):
            raise ConfigError(f"checkpoint_dir {uri} is not a local path")
        return Path(uri[len("file://"):])
