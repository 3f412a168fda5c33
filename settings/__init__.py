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
from operators.contract import Topics
from operators.errors import ConfigError
from operators.records import Channel
from operators.window import LatePolicy, WindowConfig
from senders.policy.breaker import BreakerOptions
from senders.policy.bucket import RateLimit
from senders.policy.retry import RetryPolicy, format_step

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
    :param sink_compression: compression.type of the job's sink (none, lz4, zstd, ...); lz4 or
        zstd trade the TaskManager's CPU for smaller topics
    :param sink_linger_ms: linger.ms of the job's sink: bigger producer batches, at most this
        much more latency
    :param sink_max_request_bytes: max.request.size of the job's sink: must hold the largest
        output record the dedup.* limits allow, and no output topic may take less (checked at start)
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
    sink_compression: str = "none"
    sink_linger_ms: int = 10
    sink_max_request_bytes: int = 1_048_576

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
    :param max_future_ms: a request whose event time is more than this far ahead of the wall clock
        is invalid and never moves the watermark (the clock skew tolerated between producers and
        the job)
    :param max_record_bytes: a serialized request longer than this is invalid
    :param max_field_bytes: the longest ``dedup_key``, ``notification_id``, ``user_id`` and
        ``template_id`` (UTF-8 bytes each)
    :param max_params: the most entries in a request's params
    :param max_param_bytes: the longest key or value of a params entry (UTF-8 bytes)
    :param invalid_raw_prefix_bytes: how many bytes of a rejected record its InvalidRecord keeps
        (with the record's length and SHA-256)
    :param shards: keyed-state shards the dedup keys are spread over (the key of key_by)
    :param bloom_expected_keys: keys the whole job is expected to hold over one default window
    :param bloom_fp_rate: target false-positive rate of the prefilter
    :param bloom_segments_per_window: event-time segments one default window is split into
    :param bloom_snapshot_every: keys added to a shard between two snapshots of its filter
    :param batch_max_requests: requests buffered (over all shards of a subtask) before they go to
        the Python dedup operator as one mini-batch per shard
    :param batch_max_bytes: about the bytes of requests buffered before the mini-batches are sent
    :param batch_max_delay_ms: the longest a request waits for its mini-batch; batches are also
        sent before every watermark and checkpoint barrier
    """

    default_window_sec: int = 7 * 86_400
    max_window_sec: int = 30 * 86_400
    allowed_lateness_ms: int = 0
    late_policy: str = LatePolicy.SIDE_OUTPUT.value
    out_of_orderness_ms: int = 60_000
    idleness_ms: int = 30_000
    max_future_ms: int = 5 * 60_000
    max_record_bytes: int = 64 * 1024
    max_field_bytes: int = 512
    max_params: int = 64
    max_param_bytes: int = 4 * 1024
    invalid_raw_prefix_bytes: int = 4 * 1024
    shards: int = 128
    bloom_expected_keys: int = 1_000_000
    bloom_fp_rate: float = 0.01
    bloom_segments_per_window: int = 4
    bloom_snapshot_every: int = 512
    batch_max_requests: int = 2_000
    batch_max_bytes: int = 4 * 1024 * 1024
    batch_max_delay_ms: int = 50

    def window_config(self) -> WindowConfig:
        return WindowConfig(
            default_window_ms=self.default_window_sec * 1000,
            max_window_ms=self.max_window_sec * 1000,
            allowed_lateness_ms=self.allowed_lateness_ms,
            late_policy=LatePolicy(self.late_policy),
        )

    def eviction_grain_ms(self) -> int:
        """State outlives its window by at most this: 1/256 of the window, 1 s to 1 h."""
        return min(3_600, max(1, self.default_window_sec // 256)) * 1000

    def bloom_config(self) -> BloomConfig:
        # whole eviction grains, so a segment is dropped only after every key in it was evicted
        grain = self.eviction_grain_ms()
        span = max(1, -(-self.default_window_sec * 1000 // self.bloom_segments_per_window // grain)) * grain
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
class SendersSettings:
    """The sender workers: retries, providers, rate limits, the status store, their topics.

    A provider is named by a string: an ``http://`` or ``https://`` URL (JSON POST), ``smtp``
    (the ``smtp_*`` settings), or ``fake`` (the scripted fake: nothing leaves the process).
    An empty primary means the channel has no provider and its workers refuse to start.

    :param group_prefix: consumer groups are ``<prefix>.<channel>.<lane>``
    :param instance_id: names this process's transactional producers
        (``<prefix>.<channel>.<lane>.<instance_id>.<n>``); a stable id lets a restarted process
        fence its dead predecessor's open transaction at once; empty: a fresh random id. Two live
        processes never share one: the second is refused at start
    :param status_topic: every status change, keyed by message key
    :param dlq_topic: the dead-letter topic
    :param delay_topic_template: the delay topics of a channel topic, one per delay step;
        ``{topic}`` is the channel topic, ``{step}`` the step (``30s``)
    :param max_attempts: provider attempts per message, the first included
    :param base_backoff_ms: wait after the first failed attempt; doubles after each further one
    :param max_backoff_ms: upper bound of the wait
    :param jitter_ratio: up to this fraction of the wait is added at random
    :param batch_size: records a worker takes per poll (one Kafka transaction)
    :param poll_timeout_ms: how long a poll waits for records
    :param lease_ms: a claim is its worker's for this long; must exceed the longest send deadline
        (``http_timeout_ms``, ``smtp_timeout_ms`` of the providers in use) by a second, or the
        workers refuse to start
    :param session_timeout_ms: consumer session timeout (how soon a dead worker's partitions move)
    :param transaction_timeout_ms: the broker aborts a dead worker's open transaction after this
    :param kafka_timeout_ms: how long a worker waits on the broker (init_transactions, the topics'
        metadata, a commit) before it gives up, backs off and reconnects
    :param restart_backoff_ms: a failed worker (broker or store unreachable, producer fenced)
        starts again after this; the wait doubles with each failure in a row
    :param restart_backoff_max_ms: upper bound of that wait; a worker that ran this long without
        failing starts again from ``restart_backoff_ms``
    :param instance_ttl_ms: a ``senders run`` process records itself (instance id, host, pid) in
        the status store and renews that every third of this; another process may take its
        instance id over only once it is this old (at once when its pid is gone on this host)
    :param status_store: empty: SQLite in ``<data_dir>/senders/status.sqlite3``; a path or
        ``sqlite:///path``; or a ``postgresql://`` DSN (needs psycopg)
    :param status_store_password: password for the PostgreSQL DSN (a secret)
    :param sqlite_synchronous: SQLite ``synchronous`` pragma (FULL survives power loss, NORMAL
        survives a crash of the process)
    :param sqlite_busy_timeout_ms: how long a SQLite transaction waits for the store's write lock
        before the worker backs off
    :param address_book: JSON file ``{"user_id": {"sms": "+4420...", "email": "..."}}``;
        empty: the user id is the address (providers that resolve users themselves)
    :param push_primary: push provider
    :param push_secondary: push failover provider (empty: none)
    :param sms_primary: SMS provider
    :param sms_secondary: SMS failover provider
    :param email_primary: email provider
    :param email_secondary: email failover provider
    :param push_rate_per_sec: rate limit of each push provider
    :param sms_rate_per_sec: rate limit of each SMS provider
    :param email_rate_per_sec: rate limit of each email provider
    :param rate_burst: token-bucket size of each provider
    :param http_timeout_ms: the deadline of one HTTP send, connect to last byte (a timeout is a
        transient failure); ``lease_ms`` must exceed it
    :param http_token: bearer token sent to HTTP providers (a secret)
    :param http_ca_file: PEM file of the CAs that HTTPS providers' certificates are verified
        against; empty: the system's CAs (verification is never off)
    :param smtp_host: SMTP relay host
    :param smtp_port: SMTP relay port
    :param smtp_starttls: upgrade the SMTP connection with STARTTLS (verified)
    :param smtp_implicit_tls: speak TLS from the start (SMTPS, port 465), verified
    :param smtp_ca_file: PEM file of the CAs the SMTP relay's certificate is verified against;
        empty: the system's CAs
    :param smtp_username: SMTP login; needs smtp_starttls or smtp_implicit_tls
    :param smtp_password: SMTP password (a secret)
    :param smtp_from: envelope and header sender of emails
    :param smtp_timeout_ms: the deadline of one SMTP send (connect, TLS, login, the message);
        ``lease_ms`` must exceed it
    :param http_invalid_recipient: the HTTP answers that say the address itself is invalid, the
        only ones that deactivate it: a status (``410``), or ``STATUS:CODE`` when the reply's
        body must contain CODE (``400:invalid_recipient``); comma-separated
    :param smtp_invalid_recipient: the enhanced statuses of a refused recipient that deactivate
        it: ``5.1`` is any 5.1.x (bad mailbox, domain, syntax); comma-separated
    :param invalid_recipient_rules: per provider, rules in place of those two:
        ``LABEL=RULES;LABEL=RULES``, LABEL being the provider's name (a URL's host[:port], or
        ``smtp``), e.g. ``sms-a.example=400:21211,410``
    :param breaker_window: the primary's recent outcomes the failure rate is taken over
    :param breaker_min_calls: outcomes needed before the circuit may open
    :param breaker_failure_rate: failure fraction that opens the circuit (moves to the secondary)
    :param breaker_open_ms: time on the secondary before the primary is probed again
    :param metrics_log_interval_s: how often a running worker logs its metrics (0: never)
    """

    group_prefix: str = "notify-senders"
    instance_id: str = ""
    status_topic: str = "notifications.status"
    dlq_topic: str = "notifications.dlq"
    delay_topic_template: str = "{topic}.retry.{step}"
    max_attempts: int = 5
    base_backoff_ms: int = 30_000
    max_backoff_ms: int = 3_600_000
    jitter_ratio: float = 0.2
    batch_size: int = 200
    poll_timeout_ms: int = 100
    lease_ms: int = 60_000
    session_timeout_ms: int = 45_000
    transaction_timeout_ms: int = 60_000
    kafka_timeout_ms: int = 30_000
    restart_backoff_ms: int = 1_000
    restart_backoff_max_ms: int = 30_000
    instance_ttl_ms: int = 30_000
    status_store: str = ""
    status_store_password: Secret | None = None
    sqlite_synchronous: str = "FULL"
    sqlite_busy_timeout_ms: int = 30_000
    address_book: str = ""
    push_primary: str = ""
    push_secondary: str = ""
    sms_primary: str = ""
    sms_secondary: str = ""
    email_primary: str = ""
    email_secondary: str = ""
    push_rate_per_sec: float = 500.0
    sms_rate_per_sec: float = 50.0
    email_rate_per_sec: float = 50.0
    rate_burst: int = 20
    http_timeout_ms: int = 5_000
    http_token: Secret | None = None
    http_ca_file: str = ""
    smtp_host: str = "127.0.0.1"
    smtp_port: int = 25
    smtp_starttls: bool = False
    smtp_implicit_tls: bool = False
    smtp_ca_file: str = ""
    smtp_username: str | None = None
    smtp_password: Secret | None = None
    smtp_from: str = "notifications@localhost"
    smtp_timeout_ms: int = 10_000
    http_invalid_recipient: str = "400:invalid_recipient,404:invalid_recipient,410"
    smtp_invalid_recipient: str = "5.1"
    invalid_recipient_rules: str = ""
    breaker_window: int = 20
    breaker_min_calls: int = 5
    breaker_failure_rate: float = 0.5
    breaker_open_ms: int = 30_000
    metrics_log_interval_s: float = 60.0

    def retry_policy(self) -> RetryPolicy:
        return RetryPolicy(
            base_ms=self.base_backoff_ms,
            max_attempts=self.max_attempts,
            jitter_ratio=self.jitter_ratio,
            max_backoff_ms=self.max_backoff_ms,
        )

    def breaker_options(self) -> BreakerOptions:
        return BreakerOptions(
            window=self.breaker_window,
            min_calls=self.breaker_min_calls,
            failure_rate=self.breaker_failure_rate,
            open_ms=self.breaker_open_ms,
        )

    def rate_limit(self, channel: Channel) -> RateLimit:
        rate = float(getattr(self, f"{channel.value}_rate_per_sec"))
        return RateLimit(per_second=rate, burst=self.rate_burst)

    def providers(self, channel: Channel) -> tuple[str, str]:
        """The (primary, secondary) provider names of a channel; secondary may be empty."""
        name = channel.value
        return str(getattr(self, f"{name}_primary")), str(getattr(self, f"{name}_secondary"))

    def delay_topics(self, source_topic: str) -> dict[int, str]:
        """Delay step (ms) -> the delay topic of a channel topic for that step."""
        return {
            step: self.delay_topic_template.format(topic=source_topic, step=format_step(step))
            for step in self.retry_policy().steps()
        }


@dataclass(frozen=True)
class Settings:
    kafka: KafkaSettings = field(default_factory=KafkaSettings)
    topics: Topics = field(default_factory=Topics)
    dedup: DedupSettings = field(default_factory=DedupSettings)
    flink: FlinkSettings = field(default_factory=FlinkSettings)
    senders: SendersSettings = field(default_factory=SendersSettings)
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


def _field_names(section: Any) -> set[str]:
    if isinstance(section, Topics):
        return set(section.by_role())
    return {f.name for f in dataclasses.fields(section)}


def _apply(section: Any, values: Mapping[str, Any], where: str) -> Any:
    if isinstance(section, Topics):
        unknown = set(values) - _field_names(section)
        if unknown:
            raise ConfigError(f"unknown setting(s) in [{where}]: {', '.join(sorted(unknown))}")
        return Topics({**section.by_role(), **{k: str(v) for k, v in values.items() if v is not None}})
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
        names = _field_names(getattr(settings, section))
        for key, value in env.items():
            if key.startswith(prefix) and key[len(prefix):].lower() in names:
                from_env.setdefault(section, {})[key[len(prefix):].lower()] = value
    if f"{ENV_PREFIX}DATA_DIR" in env:
        settings = dataclasses.replace(settings, data_dir=env[f"{ENV_PREFIX}DATA_DIR"])
    return settings.with_overrides(**from_env)
