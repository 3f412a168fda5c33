"""One frozen configuration: defaults, then a TOML file, then ``DEDUP_*`` variables, then flags.

File sections and environment variables share names: ``[kafka] bootstrap_servers`` is
``DEDUP_KAFKA_BOOTSTRAP_SERVERS``; ``DEDUP_CONFIG`` names the file.
"""

from __future__ import annotations

import dataclasses
import os
import tomllib
import types
import typing
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from operators.bloom import BloomConfig
from operators.errors import ConfigError
from operators.routing import Topics
from operators.window import LatePolicy, WindowConfig

REPO_ROOT = Path(__file__).resolve().parent.parent
ENV_PREFIX = "DEDUP_"


class Secret(str):
    """A string that never shows itself in repr, logs or tracebacks."""

    def __repr__(self) -> str:
        return "Secret('******')"

    def __str__(self) -> str:
        return "******"

    def reveal(self) -> str:
        return str.__str__(self)


@dataclass(frozen=True)
class KafkaSettings:
    """Kafka connection and the local broker.

    :param bootstrap_servers: brokers the job and the tools talk to
    :param security_protocol: PLAINTEXT, SSL, SASL_PLAINTEXT or SASL_SSL
    :param sasl_mechanism: PLAIN, SCRAM-SHA-256 or SCRAM-SHA-512 when SASL is used
    :param sasl_username: SASL user
    :param sasl_password: SASL password (a secret)
    :param ssl_ca_location: PEM file of the CA that signed the brokers' certificates
    :param partitions: partitions of each topic ``dedupctl topics create`` makes
    :param replication_factor: replicas of each topic it makes
    :param group_id: consumer group of the dedup job's source
    :param local_port: client port of ``dedupctl kafka start``
    :param local_controller_port: KRaft controller port of the local broker
    """

    bootstrap_servers: str = "127.0.0.1:9092"
    security_protocol: str = "PLAINTEXT"
    sasl_mechanism: str | None = None
    sasl_username: str | None = None
    sasl_password: Secret | None = None
    ssl_ca_location: str | None = None
    partitions: int = 3
    replication_factor: int = 1
    group_id: str = "notify-dedup"
    local_port: int = 9092
    local_controller_port: int = 9093

    def client_config(self) -> dict[str, str]:
        """librdkafka (confluent-kafka) settings."""
        conf = {"bootstrap.servers": self.bootstrap_servers, "security.protocol": self.security_protocol}
        if self.sasl_mechanism:
            conf["sasl.mechanism"] = self.sasl_mechanism
        if self.sasl_username:
            conf["sasl.username"] = self.sasl_username
        if self.sasl_password:
            conf["sasl.password"] = self.sasl_password.reveal()
        if self.ssl_ca_location:
            conf["ssl.ca.location"] = self.ssl_ca_location
        return conf

    def java_properties(self) -> dict[str, str]:
        """Java client settings for the Flink source and sink (bootstrap servers excluded)."""
        props = {"security.protocol": self.security_protocol}
        if self.sasl_mechanism:
            props["sasl.mechanism"] = self.sasl_mechanism
            module = (
                "org.apache.kafka.common.security.plain.PlainLoginModule"
                if self.sasl_mechanism == "PLAIN"
                else "org.apache.kafka.common.security.scram.ScramLoginModule"
            )
            user = self.sasl_username or ""
            secret = self.sasl_password.reveal() if self.sasl_password else ""
            props["sasl.jaas.config"] = f'{module} required username="{user}" password="{secret}";'
        if self.ssl_ca_location:
            props["ssl.truststore.type"] = "PEM"
            props["ssl.truststore.location"] = self.ssl_ca_location
        return props


@dataclass(frozen=True)
class DedupSettings:
    """The dedup rule, watermarks and the Bloom prefilter.

    :param default_window_sec: window of a request without dedup_ttl_sec
    :param max_window_sec: upper clamp of dedup_ttl_sec
    :param allowed_lateness_ms: how far behind the watermark a request is still on time
    :param late_policy: side-output (late requests only to the late topic) or best-effort
    :param out_of_orderness_ms: watermark = newest event time of a partition minus this
    :param idleness_ms: a partition with no records for this long stops holding the watermark
    :param shards: keyed-state shards the dedup keys are spread over (the key of key_by)
    :param bloom_expected_keys: keys the whole job is expected to hold over one default window
    :param bloom_fp_rate: target false-positive rate of the prefilter
    :param bloom_segments_per_window: event-time segments one default window is split into
    :param bloom_snapshot_every: keys added to a shard between two snapshots of its filter
    """

    default_window_sec: int = 7 * 86_400
    max_window_sec: int = 30 * 86_400
    allowed_lateness_ms: int = 0
    late_policy: str = LatePolicy.SIDE_OUTPUT.value
    out_of_orderness_ms: int = 60_000
    idleness_ms: int = 30_000
    shards: int = 128
    bloom_expected_keys: int = 1_000_000
    bloom_fp_rate: float = 0.01
    bloom_segments_per_window: int = 4
    bloom_snapshot_every: int = 512

    def window_config(self) -> WindowConfig:
        return WindowConfig(
            default_window_ms=self.default_window_sec * 1000,
            max_window_ms=self.max_window_sec * 1000,
            allowed_lateness_ms=self.allowed_lateness_ms,
            late_policy=LatePolicy(self.late_policy),
        )

    def bloom_config(self) -> BloomConfig:
        # whole seconds, so that eviction timers (1 s grain) never outlive their segment
        span = max(1, self.default_window_sec // self.bloom_segments_per_window) * 1000
        return BloomConfig(
            expected_keys=max(1, self.bloom_expected_keys // self.shards),
            fp_rate=self.bloom_fp_rate,
            span_ms=span,
            segments_per_window=self.bloom_segments_per_window,
        )


@dataclass(frozen=True)
class FlinkSettings:
    """How the job runs.

    :param parallelism: parallelism of every operator
    :param max_parallelism: key groups; fixed for the life of the state, so keep it stable
    :param checkpoint_dir: retained checkpoints (and, by default, savepoints) live here
    :param checkpoint_interval_ms: also the latency of exactly-once output
    :param checkpoint_timeout_ms: a checkpoint slower than this fails
    :param transaction_timeout_ms: Kafka transaction timeout of the sink; below the broker's
        transaction.max.timeout.ms (15 min) and above checkpoint interval + restart time
    :param transactional_id_prefix: must be stable across restarts and unique per job
    :param execution_mode: PyFlink python.execution-mode, thread or process
    :param restart_attempts: fixed-delay restarts before the job fails
    :param restart_delay_ms: delay between restarts
    :param rest_port: REST port of the local mini-cluster (dedupctl stop/status use it)
    :param bundle_size: PyFlink python.fn-execution.bundle.size
    :param bundle_time_ms: PyFlink python.fn-execution.bundle.time
    """

    parallelism: int = 1
    max_parallelism: int = 128
    checkpoint_dir: str = ".data/checkpoints"
    checkpoint_interval_ms: int = 5_000
    checkpoint_timeout_ms: int = 120_000
    transaction_timeout_ms: int = 600_000
    transactional_id_prefix: str = "notify-dedup"
    execution_mode: str = "thread"
    restart_attempts: int = 10
    restart_delay_ms: int = 2_000
    rest_port: int = 8081
    bundle_size: int = 1000
    bundle_time_ms: int = 100

    def checkpoint_uri(self) -> str:
        """The directory as a URI; a plain path is taken relative to the working directory."""
        if "://" in self.checkpoint_dir:
            return self.checkpoint_dir
        return Path(self.checkpoint_dir).resolve().as_uri()

    def checkpoint_path(self) -> Path:
        uri = self.checkpoint_uri()
        if not uri.startswith("file://"):
            raise ConfigError(f"checkpoint_dir {uri} is not a local path")
        return Path(uri[len("file://"):])


@dataclass(frozen=True)
class Settings:
    kafka: KafkaSettings = field(default_factory=KafkaSettings)
    topics: Topics = field(default_factory=Topics)
    dedup: DedupSettings = field(default_factory=DedupSettings)
    flink: FlinkSettings = field(default_factory=FlinkSettings)
    data_dir: str = ".data"

    def data_path(self) -> Path:
        return Path(self.data_dir).resolve()

    def with_overrides(self, **sections: Mapping[str, Any]) -> Settings:
        """A copy with some fields of some sections replaced (values coerced)."""
        changes: dict[str, Any] = {}
        for name, values in sections.items():
            if not values:
                continue
            section = getattr(self, name)
            changes[name] = _apply(section, values, f"{name}")
        return dataclasses.replace(self, **changes)


_SECTIONS = {f.name for f in dataclasses.fields(Settings) if f.name != "data_dir"}


def _coerce(value: Any, hint: Any, where: str) -> Any:
    origin = typing.get_origin(hint)
    if origin in (types.UnionType, typing.Union):
        args = [a for a in typing.get_args(hint) if a is not type(None)]
        if value is None or value == "":
            return None
        return _coerce(value, args[0], where)
    try:
        if hint is bool:
            if isinstance(value, str):
                return value.strip().lower() in ("1", "true", "yes", "on")
            return bool(value)
        if hint is int:
            return int(value)
        if hint is float:
            return float(value)
        if hint is Secret:
            return Secret(value)
        return str(value)
    except (TypeError, ValueError) as exc:
        raise ConfigError(f"{where}: {exc}") from None


def _apply(section: Any, values: Mapping[str, Any], where: str) -> Any:
    hints = typing.get_type_hints(type(section))
    known = {f.name for f in dataclasses.fields(section)}
    unknown = set(values) - known
    if unknown:
        raise ConfigError(f"unknown setting(s) in [{where}]: {', '.join(sorted(unknown))}")
    coerced = {k: _coerce(v, hints[k], f"{where}.{k}") for k, v in values.items() if v is not None}
    return dataclasses.replace(section, **coerced)


def load_settings(
    config_file: str | os.PathLike[str] | None = None,
    env: Mapping[str, str] | None = None,
) -> Settings:
    """Defaults < file (``config_file`` or ``$DEDUP_CONFIG``) < ``DEDUP_<SECTION>_<FIELD>``."""
    env = os.environ if env is None else env
    settings = Settings()
    path = config_file or env.get(f"{ENV_PREFIX}CONFIG")
    if path:
        try:
            data = tomllib.loads(Path(path).read_text(encoding="utf-8"))
        except (OSError, tomllib.TOMLDecodeError) as exc:
            raise ConfigError(f"cannot read config file {path}: {exc}") from None
        unknown = set(data) - _SECTIONS - {"data_dir"}
        if unknown:
            raise ConfigError(f"unknown section(s) in {path}: {', '.join(sorted(unknown))}")
        if "data_dir" in data:
            settings = dataclasses.replace(settings, data_dir=str(data["data_dir"]))
        settings = settings.with_overrides(**{k: v for k, v in data.items() if k in _SECTIONS})
    from_env: dict[str, dict[str, str]] = {}
    for section in _SECTIONS:
        prefix = f"{ENV_PREFIX}{section.upper()}_"
        names = {f.name for f in dataclasses.fields(getattr(settings, section))}
        for key, value in env.items():
            if key.startswith(prefix) and key[len(prefix):].lower() in names:
                from_env.setdefault(section, {})[key[len(prefix):].lower()] = value
    if f"{ENV_PREFIX}DATA_DIR" in env:
        settings = dataclasses.replace(settings, data_dir=env[f"{ENV_PREFIX}DATA_DIR"])
    return settings.with_overrides(**from_env)
