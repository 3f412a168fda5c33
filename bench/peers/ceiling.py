"""The ceiling: an exactly-once pass-through, raw bytes Kafka -> Kafka, on the job's mini-cluster.

What this machine can move exactly once with Flink, and no more: Flink SQL, ``INSERT INTO out
SELECT data FROM in`` with the ``raw`` format (each record's value as bytes, untouched), JVM only
(no Python operator, no parse). It runs with the job's own configuration file (the benchmark
writes one job.toml for both) and so the job's settings from their one source:
``settings/flink_conf.mini_cluster`` (checkpoint interval, exactly-once checkpoints, parallelism,
restarts, REST port; without Python) and ``flink_conf.kafka_source`` / ``kafka_sink`` (read
committed, offsets committed on checkpoint, the sink's transaction timeout, idempotence,
compression, linger, batch.size and max.request.size), ``flink.transactional_id_prefix``,
``kafka.group_id``, and ``topics.requests`` as its input.
"""

from __future__ import annotations

import argparse
import logging

from bench.peers.flink_sql import CONNECTOR_JAR
from settings import Settings, flink_conf, load_settings


def _options(props: dict[str, str]) -> str:
    return ", ".join(f"'properties.{k}' = '{v}'" for k, v in props.items())


def statements(cfg: Settings, output: str) -> tuple[list[str], str]:
    kafka = f"'connector' = 'kafka', 'properties.bootstrap.servers' = '{cfg.kafka.bootstrap_servers}', 'format' = 'raw'"
    source = {k: v for k, v in flink_conf.kafka_source(cfg).items() if k != "partition.discovery.interval.ms"}
    discovery = int(flink_conf.kafka_source(cfg)["partition.discovery.interval.ms"])
    ddl = [
        f"""CREATE TABLE requests (data BYTES) WITH ({kafka}, 'topic' = '{cfg.topics.requests}',
              'properties.group.id' = '{cfg.kafka.group_id}', 'scan.startup.mode' = 'group-offsets',
              'properties.auto.offset.reset' = 'earliest',
              'scan.topic-partition-discovery.interval' = '{flink_conf.duration(discovery)}',
              {_options(source)})""",
        f"""CREATE TABLE passthrough (data BYTES) WITH ({kafka}, 'topic' = '{output}',
              'sink.delivery-guarantee' = 'exactly-once',
              'sink.transactional-id-prefix' = '{cfg.flink.transactional_id_prefix}',
              {_options(flink_conf.kafka_sink(cfg))})""",
    ]
    return ddl, "INSERT INTO passthrough SELECT data FROM requests"


def peer_settings(cfg: Settings) -> dict[str, flink_conf.Value]:
    return flink_conf.mini_cluster(cfg, python=None) | {
        "pipeline.jars": CONNECTOR_JAR.resolve().as_uri(),
        "pipeline.name": "bench-ceiling-passthrough",
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--config", required=True, help="the job's TOML configuration (bench/systems.py writes it)")
    p.add_argument("--output", required=True, help="the topic every input record is copied to")
    p.add_argument("--parallelism", type=int)
    p.add_argument("--explain", action="store_true", help="print the plan and exit")
    a = p.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s %(message)s")
    cfg = load_settings(a.config)
    if a.parallelism:
        cfg = cfg.with_overrides(flink={"parallelism": a.parallelism})

    from pyflink.common import Configuration
    from pyflink.table import EnvironmentSettings, TableEnvironment

    conf = Configuration()
    for key, value in flink_conf.as_strings(peer_settings(cfg)).items():
        conf.set_string(key, value)
    env = TableEnvironment.create(
        EnvironmentSettings.new_instance().in_streaming_mode().with_configuration(conf).build()
    )
    ddl, insert = statements(cfg, a.output)
    for stmt in ddl:
        env.execute_sql(stmt)
    if a.explain:
        print(env.explain_sql(insert))  # noqa: T201 - the plan is the output asked for
        return 0
    env.execute_sql(insert).wait()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
