"""The ``[kafka]`` section: the connection, the local broker and the job's sink."""

from __future__ import annotations

from settings.base import OptionalSecret, OptionalStr, Section


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
    sasl_mechanism: OptionalStr = None
    sasl_username: OptionalStr = None
    sasl_password: OptionalSecret = None
    ssl_ca_location: OptionalStr = None
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
