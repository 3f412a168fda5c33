"""The dedup job: notifications.requests -> per-channel topics, duplicates, late, invalid.

    source (Kafka; each record parsed once, in the JVM: the request's fields, its dedup key and
            shard, or an InvalidRecord with the reason; event time and per-partition watermarks)
      -> carry-watermark (JVM: the last watermark, restored with the job's state)
      -> keyBy(shard)
      -> carry-watermark-keyed (JVM: the same after the shuffle, chained to what follows, so a
         restored job has its watermark before its first record)
      -> batch (JVM: mini-batches per shard, sent before every watermark and barrier)
      -> dedup (Python: lateness, Bloom prefilter, the window rule, RocksDB state, eviction
         timers; only the columns the decision needs go in, one verdict per request comes out)
      -> route (JVM: the records each verdict means, on their topics; invalid records as read)
      -> one exactly-once Kafka sink for every output topic

carry-watermark-keyed, batch, dedup, route and the sink run chained in one task; the schemas and the contract between
the JVM and Python are in schemas/ (contract.json). Run it with ``dedupctl run`` on the local
mini-cluster, or submit this file to a cluster with
``flink run -py jobs/dedup_job.py -pyexec PYTHON --config FILE``.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
from pathlib import Path

from pyflink.common import Configuration
from pyflink.common.typeinfo import Types
from pyflink.datastream import DataStream, KeyedStream, StreamExecutionEnvironment
from pyflink.datastream.connectors import DeliveryGuarantee
from pyflink.datastream.connectors.kafka import (
    KafkaOffsetResetStrategy,
    KafkaOffsetsInitializer,
    KafkaSink,
    KafkaSource,
)
from pyflink.java_gateway import get_gateway

from jobs.dedup_function import BATCH_TYPE, VERDICTS_TYPE, DedupShard
from operators.dedup import DedupOptions
from operators.metric_names import DEDUP_OPERATOR, JOB_NAME, ROUTE_OPERATOR
from settings import REPO_ROOT, Settings, flink_conf, load_settings

logger = logging.getLogger(__name__)

JARS_DIR = REPO_ROOT / ".cache" / "jars" / "flink"
#: stable operator ids: savepoints map state by these; never change them
UID_SOURCE = "requests-source"
UID_CARRY = "carry-watermark"
UID_CARRY_KEYED = "carry-watermark-keyed"
UID_BATCH = "batch-by-shard"
UID_DEDUP = "dedup-by-key"
UID_ROUTE = "route-outcomes"
UID_SINK = "outputs-sink"


def connector_jars() -> list[str]:
    """The connector jars as file URLs; empty on a cluster whose lib/ already has them."""
    jars_dir = Path(os.environ.get("DEDUP_JARS_DIR", JARS_DIR))
    return sorted(p.resolve().as_uri() for p in jars_dir.glob("*.jar")) if jars_dir.is_dir() else []


def submitted_by_cli() -> bool:
    """True when the flink CLI runs this file (``flink run -py``): it hands PyFlink its gateway.
    Otherwise PyFlink starts a JVM, and the job runs on a mini-cluster in it."""
    return "PYFLINK_GATEWAY_PORT" in os.environ


def flink_settings(cfg: Settings, resume_from: str | None = None, *, on_cluster: bool | None = None) -> dict[str, str]:
    """What the job tells Flink (settings/flink_conf.py).

    On the local mini-cluster: everything it needs (``flink_conf.mini_cluster``). Submitted to a
    cluster (``on_cluster``, by default ``submitted_by_cli()``): only the job's own settings
    (``flink_conf.job``), which Flink stacks over the cluster's config.yaml; the cluster's
    addresses, slots and Python come from there and from ``flink run -m ... -pyexec ...``.
    """
    on_cluster = submitted_by_cli() if on_cluster is None else on_cluster
    conf = flink_conf.job(cfg) if on_cluster else flink_conf.mini_cluster(cfg)
    conf["pipeline.name"] = JOB_NAME
    jars = connector_jars()
    if jars:
        conf["pipeline.jars"] = ";".join(jars)
    if resume_from:
        conf["execution.state-recovery.path"] = resume_from
    return flink_conf.as_strings(conf)


def flink_configuration(cfg: Settings, resume_from: str | None = None) -> Configuration:
    """``flink_settings`` as the Configuration the execution environment is created with."""
    conf = Configuration()
    for key, value in flink_settings(cfg, resume_from).items():
        conf.set_string(key, value)
    return conf


def dedup_options(cfg: Settings) -> DedupOptions:
    return DedupOptions(
        window=cfg.dedup.window_config(),
        bloom=cfg.dedup.bloom_config(),
        eviction_grain_ms=cfg.dedup.eviction_grain_ms(),
        fold_every=cfg.dedup.bloom_snapshot_every,
    )


def java_limits(cfg: Settings) -> object:
    """The dedup.* input limits as the JVM's io.notifydedup.flink.Limits."""
    jvm = get_gateway().jvm
    d = cfg.dedup
    fields = jvm.java.util.HashMap()
    for name in ("dedup_key", "notification_id", "user_id", "template_id"):
        fields.put(name, d.max_field_bytes)
    return jvm.io.notifydedup.flink.Limits(
        d.max_record_bytes, fields, d.max_params, d.max_param_bytes, d.max_future_ms, d.invalid_raw_prefix_bytes
    )


def java_map(values: dict[str, str]) -> object:
    out = get_gateway().jvm.java.util.HashMap()
    for k, v in values.items():
        out.put(k, v)
    return out


def build_pipeline(env: StreamExecutionEnvironment, cfg: Settings) -> None:
    """Wire source, operators and sink onto ``env``."""
    jvm = get_gateway().jvm
    flink = jvm.io.notifydedup.flink
    kafka = cfg.kafka

    source_builder = (
        KafkaSource.builder()
        .set_bootstrap_servers(kafka.bootstrap_servers)
        .set_topics(cfg.topics.requests)
        .set_group_id(kafka.group_id)
        .set_starting_offsets(KafkaOffsetsInitializer.committed_offsets(KafkaOffsetResetStrategy.EARLIEST))
    )
    for key, value in flink_conf.kafka_source(cfg).items():
        source_builder.set_property(key, value)
    # each request is parsed here, once: fields, dedup key and shard, or an InvalidRecord
    source_builder._j_builder.setDeserializer(flink.RequestDeserializer(java_limits(cfg), cfg.dedup.shards))
    watermarks = flink.EventTimeAssigner.strategy(cfg.dedup.out_of_orderness_ms, cfg.dedup.idleness_ms)
    j_env = env._j_stream_execution_environment
    j_source = j_env.fromSource(source_builder.build().get_java_function(), watermarks, "requests").uid(UID_SOURCE)
    # watermarks are not checkpointed: carry the last one across a restore (WatermarkCarry.java)
    j_carried = j_source.transform("carry-watermark", j_source.getType(), flink.WatermarkCarry()).uid(UID_CARRY)
    # keyed by shard the way PyFlink's keyed operators expect (Row(key, payload), KeyByKeySelector)
    key_selector = jvm.org.apache.flink.streaming.api.functions.python.KeyByKeySelector
    key_type = Types.ROW([Types.INT()]).get_java_type_info()
    j_keyed = j_carried.keyBy(key_selector(), key_type)
    # and again after the shuffle, chained to the Python operator: on restore it gets the carried
    # watermark before any record, whichever upstream channel delivers first
    j_keyed_carried = j_keyed.transform(
        "carry-watermark-keyed", j_keyed.getType(), flink.WatermarkCarry()
    ).uid(UID_CARRY_KEYED)
    # one call into Python per shard and mini-batch, never across a watermark or barrier
    d = cfg.dedup
    j_batched = j_keyed_carried.transform(
        "batch", flink.Boundary.batch(),
        flink.ShardBatcher(d.batch_max_requests, d.batch_max_bytes, d.batch_max_delay_ms),
    ).uid(UID_BATCH)
    # still partitioned by shard: the Python operator is chained to the batcher, no second shuffle
    j_rekeyed = jvm.org.apache.flink.streaming.api.datastream.DataStreamUtils.reinterpretAsKeyedStream(
        j_batched, key_selector(), key_type
    )
    verdicts = (
        KeyedStream(j_rekeyed, BATCH_TYPE, DataStream(j_batched))
        .process(DedupShard(dedup_options(cfg), cfg.telemetry), VERDICTS_TYPE)
        .name(DEDUP_OPERATOR)
        .uid(UID_DEDUP)
    )
    # the records each verdict means, encoded in the JVM (RouteOutcomes.java)
    topic_names = java_map(cfg.topics.by_role())
    j_routed = verdicts._j_data_stream.flatMap(
        flink.RouteOutcomes(topic_names, d.allowed_lateness_ms), flink.Boundary.routed()
    ).name(ROUTE_OPERATOR).uid(UID_ROUTE)

    sink_builder = (
        KafkaSink.builder()
        .set_bootstrap_servers(kafka.bootstrap_servers)
        .set_delivery_guarantee(DeliveryGuarantee.EXACTLY_ONCE)
        .set_transactional_id_prefix(cfg.flink.transactional_id_prefix)
    )
    for key, value in flink_conf.kafka_sink(cfg).items():
        sink_builder.set_property(key, value)
    # pooling reuses a few transactional ids (flink.transaction_naming); it finds what a failed
    # run left open through the serializer's topics, the same names RouteOutcomes writes to
    naming = jvm.org.apache.flink.connector.kafka.sink.TransactionNamingStrategy
    sink_builder._j_builder.setTransactionNamingStrategy(getattr(naming, cfg.flink.transaction_naming.upper()))
    sink_builder._j_builder.setRecordSerializer(flink.RoutedRecordSerializer(topic_names))
    DataStream(j_routed).sink_to(sink_builder.build()).name("outputs").uid(UID_SINK)


def export_python_path() -> None:
    """Thread mode runs Python inside the JVM: it must find pemja, pyflink and this project.

    Must run before the first call to the JVM gateway, which inherits this environment.
    """
    paths = [p for p in sys.path if p.endswith("site-packages")] + [str(REPO_ROOT)]
    current = os.environ.get("PYTHONPATH", "")
    merged = [*paths, *[p for p in current.split(os.pathsep) if p and p not in paths]]
    os.environ["PYTHONPATH"] = os.pathsep.join(merged)


def create_environment(cfg: Settings, resume_from: str | None = None) -> StreamExecutionEnvironment:
    export_python_path()
    env = StreamExecutionEnvironment.get_execution_environment(flink_configuration(cfg, resume_from))
    env.set_parallelism(cfg.flink.parallelism)
    return env


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", help="TOML configuration file")
    parser.add_argument("--parallelism", type=int)
    parser.add_argument("--resume", help="checkpoint or savepoint path to restore from")
    args, _ = parser.parse_known_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s %(message)s")
    cfg = load_settings(args.config)
    if args.parallelism:
        cfg = cfg.with_overrides(flink={"parallelism": args.parallelism})
    from jobs.preflight import preflight

    preflight(cfg)
    env = create_environment(cfg, args.resume)
    build_pipeline(env, cfg)
    env.execute(JOB_NAME)


if __name__ == "__main__":
    main()
