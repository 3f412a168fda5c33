"""The ``[kafka]`` section: the connection, the local broker and the job's sink."""

from __future__ import annotations

from typing import Self

from pydantic import Field, model_validator
from pydantic_core import PydanticCustomError

from settings.base import OptionalInt, OptionalSecret, OptionalStr, Section

#: from this replication factor on, two replicas must have a record before it is acknowledged
SAFE_REPLICATION = 3


def default_min_insync(replication: int) -> int:
    """``min.insync.replicas`` for a replication factor: 2 from 3 replicas on (one broker may be
    lost without refusing a write or risking an acknowledged one), else 1."""
    return 2 if replication >= SAFE_REPLICATION else 1


def local_replication(brokers: int) -> int:
    """The replication factor a local cluster of ``brokers`` nodes gives new and internal topics."""
    return min(brokers, SAFE_REPLICATION)


def jaas_quoted(value: str) -> str:
    """``value`` as a double-quoted JAAS option value.

    Kafka's JAAS parser (``JaasConfig``, a ``StreamTokenizer``) reads backslash escapes inside
    quotes and ends a quoted value at a quote or a line break: those are escaped, the backslash
    first. ``;`` and ``=`` are plain characters inside quotes.
    """
    escaped = value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n").replace("\r", "\\r")
    return f'"{escaped}"'


class KafkaSettings(Section):
    """Kafka connection and the local broker.

    :param bootstrap_servers: brokers the job and the tools talk to, comma-separated; unset (or
        empty), every node of the local cluster (``local_brokers`` nodes from ``local_port``)
    :param security_protocol: PLAINTEXT, SSL, SASL_PLAINTEXT or SASL_SSL
    :param sasl_mechanism: PLAIN, SCRAM-SHA-256 or SCRAM-SHA-512 when SASL is used
    :param sasl_username: SASL user
    :param sasl_password: SASL password (a secret)
    :param ssl_ca_location: PEM file of the CA that signed the brokers' certificates
    :param partitions: partitions of each topic ``dedupctl topics create`` makes
    :param replication_factor: replicas of each topic the tools make (``topics create``, the
        senders' and the API's topics); unset, the cluster's own ``default.replication.factor``
        (read from a broker): what its operator chose, and never a count of the brokers that
        happen to be alive while one is down
    :param min_insync_replicas: ``min.insync.replicas`` of each topic they make: how many replicas
        must have a record before an ``acks=all`` producer (the job's sink, the API) is told it is
        written; unset, 2 with a replication factor of 3 or more, else 1
    :param group_id: consumer group of the dedup job's source
    :param local_brokers: nodes of the local cluster ``dedupctl kafka start`` runs (KRaft, each
        node broker and controller); 3 gives topics 3 replicas and a min.insync.replicas of 2
    :param local_port: client port of the local cluster's first node; node k (from 1) listens
        on ``local_port + 2(k-1)``
    :param local_controller_port: KRaft controller port of the first node; node k's is
        ``local_controller_port + 2(k-1)``
    :param sink_compression: compression.type of the job's sink (none, lz4, zstd, ...); lz4 or
        zstd trade the TaskManager's CPU for smaller topics
    :param sink_linger_ms: linger.ms of the job's sink: bigger producer batches, at most this
        much more latency
    :param sink_retry_backoff_ms: retry.backoff.ms of the job's sink. Each checkpoint the sink
        starts its next transaction under another transactional id
        (``flink.transaction_naming``), and the producer it recycles still knows the coordinator
        of its old one: on a cluster of several brokers the InitProducerId often goes to the
        wrong one, is refused (NOT_COORDINATOR), and the client sleeps this long before sending
        it again to the right one, inside the checkpoint's synchronous phase. Kafka's 100 ms was
        most of a checkpoint on three brokers (bench/README.md); a produce retry still backs off
        exponentially from here up to ``retry.backoff.max.ms`` (1 s)
    :param sink_max_request_bytes: max.request.size of the job's sink: must hold the largest
        output record the dedup.* limits allow, and no output topic may take less (checked at start)
    :param source_fetch_min_bytes: fetch.min.bytes of the job's source: the broker answers a
        fetch once this much is there, or after ``source_fetch_max_wait_ms``. With 1 (Kafka's
        default) every produce request wakes a fetch of its few records: at 1,000 requests/s that
        fetch loop was a third of the job's CPU and half the broker's (bench/README.md)
    :param source_fetch_max_wait_ms: fetch.max.wait.ms of the job's source: the most a request
        waits in the broker for that fetch (the job's mini-batches wait ``dedup.batch_max_delay_ms``
        after it)
    """

    bootstrap_servers: str = ""
    security_protocol: str = "PLAINTEXT"
    sasl_mechanism: OptionalStr = None
    sasl_username: OptionalStr = None
    sasl_password: OptionalSecret = None
    ssl_ca_location: OptionalStr = None
    partitions: int = 3
    replication_factor: OptionalInt = Field(default=None, ge=1)
    min_insync_replicas: OptionalInt = Field(default=None, ge=1)
    group_id: str = "notify-dedup"
    local_brokers: int = Field(default=1, ge=1)
    local_port: int = 9092
    local_controller_port: int = 9093
    sink_compression: str = "none"
    sink_linger_ms: int = 10
    sink_retry_backoff_ms: int = Field(default=10, ge=0)
    sink_max_request_bytes: int = 1_048_576
    source_fetch_min_bytes: int = Field(default=65_536, ge=1)
    source_fetch_max_wait_ms: int = Field(default=50, ge=0)

    @model_validator(mode="after")
    def _local_cluster(self) -> Self:
        ports = [p for node in self.local_nodes() for p in node]
        if len(set(ports)) != len(ports):
            raise PydanticCustomError(
                "local_ports",
                "local_port and local_controller_port give the {n} local nodes overlapping ports (node k"
                " listens on local_port + 2(k-1) and local_controller_port + 2(k-1))",
                {"n": self.local_brokers},
            )
        if self.replication_factor is not None and self.min_insync_replicas is not None \
                and self.min_insync_replicas > self.replication_factor:
            raise PydanticCustomError(
                "min_insync",
                "min_insync_replicas ({isr}) is above replication_factor ({rf}): no write could be acknowledged",
                {"isr": self.min_insync_replicas, "rf": self.replication_factor},
            )
        if not self.bootstrap_servers:
            # derived, not given: left out of the fields set, so that overrides derive it again
            object.__setattr__(self, "bootstrap_servers", self.local_bootstrap())
        return self

    def local_nodes(self, brokers: int | None = None) -> list[tuple[int, int]]:
        """(client port, controller port) of each node of the local cluster, node 1 first."""
        n = self.local_brokers if brokers is None else brokers
        return [(self.local_port + 2 * k, self.local_controller_port + 2 * k) for k in range(n)]

    def local_bootstrap(self, brokers: int | None = None) -> str:
        """Every node of the local cluster, as ``bootstrap.servers``."""
        return ",".join(f"127.0.0.1:{port}" for port, _ in self.local_nodes(brokers))

    def client_config(self) -> dict[str, str]:
        """librdkafka (confluent-kafka) settings."""
        conf = {"bootstrap.servers": self.bootstrap_servers, "security.protocol": self.security_protocol}
        if self.sasl_mechanism:
            conf["sasl.mechanism"] = self.sasl_mechanism
        if self.sasl_username:
            conf["sasl.username"] = self.sasl_username
        if self.sasl_password:
            conf["sasl.password"] = self.sasl_password.get_secret_value()
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
            user = jaas_quoted(self.sasl_username or "")
            secret = jaas_quoted(self.sasl_password.get_secret_value() if self.sasl_password else "")
            props["sasl.jaas.config"] = f"{module} required username={user} password={secret};"
        if self.ssl_ca_location:
            props["ssl.truststore.type"] = "PEM"
            props["ssl.truststore.location"] = self.ssl_ca_location
        return props
