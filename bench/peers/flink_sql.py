"""The same dedup in Flink SQL on the PyFlink mini-cluster: Kafka in, Kafka out, exactly-once.

Input is the dataset as JSON (the benchmark loads a JSON copy of it for this peer: Flink SQL has
no reader for our schemaless Avro without a schema registry); ``params`` arrives as its canonical
JSON string, so SQL derives the dedup key itself, as the job does:
``COALESCE(NULLIF(dedup_key, ''), SUBSTRING(SHA256(user_id || '|' || template_id || '|' || params), 1, 32))``.

``--variant rownumber`` (default): the accepted requests are Flink's deduplication pattern,
``ROW_NUMBER() OVER (PARTITION BY k ORDER BY proc_time) ... WHERE rn = 1`` (keep first row),
fanned out per channel with ``CROSS JOIN UNNEST(channels)``. SQL's deduplication cannot emit the
rows it drops (``rn > 1`` is refused), so the duplicate notices come from an over-aggregation
(``COUNT(*)`` and ``FIRST_VALUE(notification_id)`` over ``ROWS UNBOUNDED PRECEDING``) with
``cnt > 1``: two keyed operators over one source scan. ``--variant over``: the over-aggregation
alone gives both outputs (``cnt = 1`` accepted). Both: RocksDB state with
``table.exec.state.ttl`` = the default window (processing time), exactly-once Kafka sinks
(transactions committed on checkpoint), JSON out; the mini-cluster configured as the job's
(settings/flink_conf.py).
"""

from __future__ import annotations

import argparse
import logging

from settings import REPO_ROOT, Settings, flink_conf

CONNECTOR_JAR = REPO_ROOT / ".cache" / "jars" / "flink" / "flink-sql-connector-kafka-5.0.0-2.2.jar"


def statements(a: argparse.Namespace) -> tuple[list[str], list[str]]:
    kafka = f"'connector' = 'kafka', 'properties.bootstrap.servers' = '{a.bootstrap}'"
    sink = (f"{kafka}, 'format' = 'json', 'sink.delivery-guarantee' = 'exactly-once', "
            f"'properties.transaction.timeout.ms' = '{a.transaction_timeout_ms}'")
    ddl = [
        f"""CREATE TABLE requests (
              notification_id STRING, user_id STRING, template_id STRING, params STRING,
              channels ARRAY<STRING>, priority STRING, category STRING, event_time BIGINT,
              dedup_key STRING, dedup_ttl_sec BIGINT, proc_time AS PROCTIME()
            ) WITH ({kafka}, 'topic' = '{a.input}', 'properties.group.id' = '{a.group}',
              'scan.startup.mode' = 'earliest-offset', 'properties.isolation.level' = 'read_committed',
              'format' = 'json', 'json.fail-on-missing-field' = 'false')""",
        f"""CREATE TABLE accepted (
              message_key STRING, channel STRING, notification_id STRING, user_id STRING,
              template_id STRING, params STRING, channels ARRAY<STRING>, priority STRING,
              category STRING, event_time BIGINT, dedup_key STRING, dedup_ttl_sec BIGINT
            ) WITH ({sink}, 'topic' = '{a.accepted}',
                    'sink.transactional-id-prefix' = '{a.txn_prefix}-a')""",
        f"""CREATE TABLE duplicates (
              notification_id STRING, dedup_key STRING, original_notification_id STRING,
              event_time BIGINT, occurrence BIGINT
            ) WITH ({sink}, 'topic' = '{a.duplicates}',
                    'sink.transactional-id-prefix' = '{a.txn_prefix}-d')""",
        """CREATE TEMPORARY VIEW keyed AS
             SELECT *, COALESCE(NULLIF(dedup_key, ''),
                      SUBSTRING(SHA256(CONCAT(user_id, '|', template_id, '|', params)) FROM 1 FOR 32)) AS k
             FROM requests""",
        """CREATE TEMPORARY VIEW counted AS
             SELECT notification_id, user_id, template_id, params, channels, priority, category,
                    event_time, dedup_ttl_sec, k,
                    COUNT(*) OVER w AS cnt, FIRST_VALUE(notification_id) OVER w AS first_id
             FROM keyed
             WINDOW w AS (PARTITION BY k ORDER BY proc_time
                          ROWS BETWEEN UNBOUNDED PRECEDING AND CURRENT ROW)""",
    ]
    if a.variant == "rownumber":
        first = """(SELECT * FROM (SELECT *, ROW_NUMBER() OVER (PARTITION BY k ORDER BY proc_time) AS rn
                                   FROM keyed) WHERE rn = 1)"""
    else:
        first = "(SELECT * FROM counted WHERE cnt = 1)"
    inserts = [
        f"""INSERT INTO accepted
            SELECT CONCAT(f.k, ':', c), c, f.notification_id, f.user_id, f.template_id, f.params,
                   f.channels, f.priority, f.category, f.event_time, f.k, f.dedup_ttl_sec
            FROM {first} AS f CROSS JOIN UNNEST(f.channels) AS u(c)""",
        """INSERT INTO duplicates
            SELECT notification_id, k, first_id, event_time, cnt FROM counted WHERE cnt > 1""",
    ]
    return ddl, inserts


def peer_settings(a: argparse.Namespace) -> dict[str, flink_conf.Value]:
    """The job's mini-cluster settings (settings/flink_conf.py, without Python) for this peer's
    checkpoints, parallelism and REST port, its connector and the state TTL of its SQL."""
    cfg = Settings().with_overrides(flink={
        "parallelism": a.parallelism, "checkpoint_dir": a.checkpoint_dir,
        "checkpoint_interval_ms": a.checkpoint_ms, "rest_port": a.rest_port,
        "restart_attempts": 3, "restart_delay_ms": 2000,
    })
    return flink_conf.mini_cluster(cfg, python=None) | {
        "pipeline.jars": CONNECTOR_JAR.resolve().as_uri(),
        "pipeline.name": f"bench-flink-sql-{a.variant}",
        "table.exec.state.ttl": f"{a.state_ttl_ms} ms",
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--bootstrap", required=True)
    p.add_argument("--input", required=True)
    p.add_argument("--accepted", required=True)
    p.add_argument("--duplicates", required=True)
    p.add_argument("--group", required=True)
    p.add_argument("--txn-prefix", required=True)
    p.add_argument("--checkpoint-dir", required=True)
    p.add_argument("--checkpoint-ms", type=int, default=2000)
    p.add_argument("--rest-port", type=int, required=True)
    p.add_argument("--parallelism", type=int, default=1)
    p.add_argument("--state-ttl-ms", type=int, default=7 * 86_400_000)
    p.add_argument("--transaction-timeout-ms", type=int, default=600_000)
    p.add_argument("--variant", choices=("rownumber", "over"), default="rownumber")
    p.add_argument("--explain", action="store_true", help="print the plan and exit")
    a = p.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s %(message)s")

    from pyflink.common import Configuration
    from pyflink.table import EnvironmentSettings, TableEnvironment

    conf = Configuration()
    for key, value in flink_conf.as_strings(peer_settings(a)).items():
        conf.set_string(key, value)
    env = TableEnvironment.create(
        EnvironmentSettings.new_instance().in_streaming_mode().with_configuration(conf).build()
    )
    ddl, inserts = statements(a)
    for stmt in ddl:
        env.execute_sql(stmt)
    statement_set = env.create_statement_set()
    for stmt in inserts:
        statement_set.add_insert_sql(stmt)
    if a.explain:
        print(statement_set.explain())  # noqa: T201 - the plan is the output asked for
        return 0
    statement_set.execute().wait()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
