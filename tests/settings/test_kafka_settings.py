"""The [kafka] section's local cluster: the nodes' ports, the bootstrap list derived from them,
and the replication settings."""

from __future__ import annotations

import pytest

from operators.errors import ConfigError
from settings import Settings, load_settings
from settings.kafka import default_min_insync, local_replication


def test_one_node_keeps_the_ports_and_address_of_the_single_broker() -> None:
    kafka = load_settings(env={}).kafka
    assert kafka.local_brokers == 1
    assert kafka.local_nodes() == [(9092, 9093)]
    assert kafka.bootstrap_servers == "127.0.0.1:9092"
    assert kafka.replication_factor is None and kafka.min_insync_replicas is None


def test_three_nodes_give_clients_every_address() -> None:
    kafka = load_settings(env={"DEDUP_KAFKA_LOCAL_BROKERS": "3"}).kafka
    assert kafka.local_nodes() == [(9092, 9093), (9094, 9095), (9096, 9097)]
    assert kafka.bootstrap_servers == "127.0.0.1:9092,127.0.0.1:9094,127.0.0.1:9096"
    assert kafka.client_config()["bootstrap.servers"] == kafka.bootstrap_servers
    moved = load_settings(env={"DEDUP_KAFKA_LOCAL_BROKERS": "3", "DEDUP_KAFKA_LOCAL_PORT": "19092",
                               "DEDUP_KAFKA_LOCAL_CONTROLLER_PORT": "29092"}).kafka
    assert moved.local_nodes() == [(19092, 29092), (19094, 29094), (19096, 29096)]
    assert moved.bootstrap_servers == "127.0.0.1:19092,127.0.0.1:19094,127.0.0.1:19096"


def test_given_bootstrap_servers_win_and_a_derived_one_follows_overrides() -> None:
    given = load_settings(env={"DEDUP_KAFKA_LOCAL_BROKERS": "3", "DEDUP_KAFKA_BOOTSTRAP_SERVERS": "kafka-1:9092"})
    assert given.kafka.bootstrap_servers == "kafka-1:9092"
    assert given.with_overrides(kafka={"local_port": 1000}).kafka.bootstrap_servers == "kafka-1:9092"
    derived = Settings().with_overrides(kafka={"local_brokers": 3})
    assert derived.kafka.bootstrap_servers == "127.0.0.1:9092,127.0.0.1:9094,127.0.0.1:9096"
    again = derived.with_overrides(kafka={"local_port": 10000, "local_controller_port": 10001})
    assert again.kafka.bootstrap_servers == "127.0.0.1:10000,127.0.0.1:10002,127.0.0.1:10004"
    # an empty variable is "unset" too
    assert load_settings(env={"DEDUP_KAFKA_BOOTSTRAP_SERVERS": ""}).kafka.bootstrap_servers == "127.0.0.1:9092"


def test_overlapping_node_ports_are_refused_naming_the_settings() -> None:
    with pytest.raises(ConfigError, match="local_port and local_controller_port give the 3 local nodes overlapping"):
        load_settings(env={"DEDUP_KAFKA_LOCAL_BROKERS": "3", "DEDUP_KAFKA_LOCAL_CONTROLLER_PORT": "9094"})
    with pytest.raises(ConfigError, match="local_port and local_controller_port"):
        load_settings(env={"DEDUP_KAFKA_LOCAL_CONTROLLER_PORT": "9092"})
    with pytest.raises(ConfigError, match=r"kafka\.local_brokers"):
        load_settings(env={"DEDUP_KAFKA_LOCAL_BROKERS": "0"})


def test_replication_settings() -> None:
    kafka = load_settings(env={"DEDUP_KAFKA_REPLICATION_FACTOR": "3", "DEDUP_KAFKA_MIN_INSYNC_REPLICAS": "2"}).kafka
    assert (kafka.replication_factor, kafka.min_insync_replicas) == (3, 2)
    assert load_settings(env={"DEDUP_KAFKA_REPLICATION_FACTOR": ""}).kafka.replication_factor is None
    with pytest.raises(ConfigError, match=r"min_insync_replicas \(2\) is above replication_factor \(1\)"):
        load_settings(env={"DEDUP_KAFKA_REPLICATION_FACTOR": "1", "DEDUP_KAFKA_MIN_INSYNC_REPLICAS": "2"})
    with pytest.raises(ConfigError, match=r"kafka\.replication_factor"):
        load_settings(env={"DEDUP_KAFKA_REPLICATION_FACTOR": "0"})


@pytest.mark.parametrize(("replicas", "min_isr"), [(1, 1), (2, 1), (3, 2), (5, 2)])
def test_min_insync_default(replicas: int, min_isr: int) -> None:
    assert default_min_insync(replicas) == min_isr


@pytest.mark.parametrize(("brokers", "replicas"), [(1, 1), (2, 2), (3, 3), (5, 3)])
def test_local_replication(brokers: int, replicas: int) -> None:
    assert local_replication(brokers) == replicas
