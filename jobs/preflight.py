"""What is checked before the job is submitted, so that a mistake is a clear message at start and
not a restart loop: every topic of the contract exists, and no output the job can write is larger
than the sink may send or a topic may take."""

from __future__ import annotations

import time
from collections.abc import Mapping

from confluent_kafka import KafkaException
from confluent_kafka.admin import AdminClient, ConfigResource, ResourceType

from operators.errors import ConfigError
from settings import Settings

#: what an output record may add to the request it is made of: the message key and the resolved
#: dedup key (each at most a dedup key, a channel and an epoch), the channel, the watermark and the
#: reason of a late notice, field lengths; and Kafka's own record overhead
OUTPUT_OVERHEAD_BYTES = 2048


def largest_output_bytes(cfg: Settings) -> int:
    """An upper bound of any record the job writes (with its key) under the input limits."""
    d = cfg.dedup
    request = d.max_record_bytes + 2 * d.max_field_bytes + OUTPUT_OVERHEAD_BYTES
    invalid = d.invalid_raw_prefix_bytes + len(cfg.topics.requests) + OUTPUT_OVERHEAD_BYTES
    return max(request, invalid)


def check_sizes(cfg: Settings, topic_max_message_bytes: Mapping[str, int]) -> None:
    """The limits, the sink's ``max.request.size`` and the topics' ``max.message.bytes`` agree."""
    sink = cfg.kafka.sink_max_request_bytes
    largest = largest_output_bytes(cfg)
    if largest > sink:
        raise ConfigError(
            f"an output record can be {largest} bytes under the dedup.* limits (dedup.max_record_bytes"
            f" {cfg.dedup.max_record_bytes}), more than the sink may send: kafka.sink_max_request_bytes is {sink}"
        )
    small = {t: n for t, n in topic_max_message_bytes.items() if n < sink}
    if small:
        listed = ", ".join(f"{t} ({n})" for t, n in sorted(small.items()))
        raise ConfigError(
            f"the sink may send records of up to kafka.sink_max_request_bytes = {sink} bytes, but these output"
            f" topics take less (max.message.bytes): {listed}. Raise their max.message.bytes or lower the setting"
        )


def missing_topics(admin: AdminClient, names: list[str], wait_s: float) -> list[str]:
    """The topics not there; a topic created a moment ago may take a metadata refresh to show."""
    deadline = time.monotonic() + wait_s
    while True:
        try:
            existing = admin.list_topics(timeout=10).topics
        except KafkaException as exc:
            raise ConfigError(f"cannot reach Kafka: {exc}") from None
        missing = [t for t in names if t not in existing or not existing[t].partitions]
        if not missing or time.monotonic() >= deadline:
            return missing
        time.sleep(0.5)


def preflight(cfg: Settings, timeout_s: float = 15.0) -> None:
    """Every topic of the contract exists; the sizes agree (:func:`check_sizes`)."""
    admin = AdminClient(dict[str, str | int | float | bool](cfg.kafka.client_config()))
    missing = missing_topics(admin, cfg.topics.all(), wait_s=5.0)
    if missing:
        raise ConfigError(
            f"no topic {', '.join(missing)} on {cfg.kafka.bootstrap_servers}: create them first"
            " (`dedupctl topics create`), or rename them in [topics]"
        )
    resources = [ConfigResource(ResourceType.TOPIC, t) for t in cfg.topics.outputs()]
    sizes: dict[str, int] = {}
    for resource, future in admin.describe_configs(resources, request_timeout=timeout_s).items():
        try:
            entries = future.result()
        except KafkaException as exc:
            raise ConfigError(f"cannot read the configuration of topic {resource.name}: {exc}") from None
        sizes[resource.name] = int(entries["max.message.bytes"].value)
    check_sizes(cfg, sizes)
