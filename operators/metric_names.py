"""The names of the job's metrics: one place for the job, ``dedupctl status``, the benchmarks and
the checks of the Grafana dashboard and the alert rules (tests/deploy/test_monitoring.py).

Three kinds: the job's own (counters of the dedup and route operators), Flink's that we read
(watermarks, records in and out, back pressure, checkpoints, uptime), and RocksDB's native metrics
per column family of the dedup operator's state. Flink's REST API lists an operator's metric as
``<operator>.<groups>.<name>`` (``dedup.accepted``, ``route.topic.<topic>.emitted``); its
Prometheus reporter exports it as ``flink_<scope>_<groups>_<name>`` with the operator, the job and
the value of a key-value group as labels (``prometheus_names()``).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping

#: the job's name (``pipeline.name``), the ``job_name`` label of every metric it reports
JOB_NAME = "notify-dedup"

#: the Python dedup operator (``.name(...)`` in jobs/dedup_job.py): its counters and levels
DEDUP_OPERATOR = "dedup"
#: the JVM operator after it that writes each outcome's records; it counts them per topic
#: (``route.topic.<topic>.emitted``), invalid input included
ROUTE_OPERATOR = "route"

# -- the dedup operator (jobs/dedup_function.py) -------------------------------------------------

ACCEPTED = "accepted"
DUPLICATES = "duplicates"
LATE = "late"
#: lookups that read RocksDB
STATE_READS = "state_reads"
#: lookups the Bloom filter answered "definitely new"
STATE_READS_SKIPPED = "state_reads_skipped"
#: state reads that found nothing
BLOOM_FALSE_POSITIVES = "bloom_false_positives"
#: keys removed by their event-time timers
EVICTED = "evicted"
#: what the per-batch decision (operators/dedup.py) counts
DECISION_COUNTERS = (ACCEPTED, DUPLICATES, LATE, STATE_READS, STATE_READS_SKIPPED, BLOOM_FALSE_POSITIVES)
#: counters of the dedup operator, per outcome and prefilter result
DEDUP_COUNTERS = (*DECISION_COUNTERS, EVICTED)

KEYS_HELD = "keys_held"
BLOOM_KEYS_ESTIMATE = "bloom_keys_estimate"
BLOOM_BITS = "bloom_bits"
BLOOM_FILL_RATIO_PCT = "bloom_fill_ratio_pct"
NEWEST_EVENT_TIME = "newest_event_time"
#: levels of the dedup operator, reported through counters set to the current value
DEDUP_LEVELS = (KEYS_HELD, BLOOM_KEYS_ESTIMATE, BLOOM_BITS, BLOOM_FILL_RATIO_PCT, NEWEST_EVENT_TIME)

# -- the route operator (connector/.../RouteOutcomes.java) ---------------------------------------

INVALID = "invalid"
#: counters of the route operator: invalid input (rejected where it was read, in the JVM)
ROUTE_COUNTERS = (INVALID,)
#: the key group of the route operator's per-topic counter: ``topic.<topic>.emitted``
TOPIC_GROUP = "topic"
#: the per-topic counter of the route operator
EMITTED = "emitted"

#: the outcomes of a request: every request read is exactly one of them
OUTCOMES = (ACCEPTED, DUPLICATES, LATE, INVALID)

# -- Flink's own ---------------------------------------------------------------------------------

CURRENT_INPUT_WATERMARK = "currentInputWatermark"
CURRENT_OUTPUT_WATERMARK = "currentOutputWatermark"
NUM_RECORDS_IN = "numRecordsIn"
NUM_RECORDS_OUT = "numRecordsOut"
#: what Flink reports for every operator
OPERATOR_BUILTINS = (CURRENT_INPUT_WATERMARK, CURRENT_OUTPUT_WATERMARK, NUM_RECORDS_IN, NUM_RECORDS_OUT)
BACK_PRESSURED = "backPressuredTimeMsPerSecond"
#: what Flink reports for every task (a chain of operators)
TASK_BUILTINS = (BACK_PRESSURED,)
UPTIME = "uptime"
NUM_RESTARTS = "numRestarts"
#: what the JobManager reports for the job
JOB_BUILTINS = (
    UPTIME, NUM_RESTARTS, "lastCheckpointSize", "lastCheckpointFullSize", "lastCheckpointDuration",
    "lastCheckpointCompletedTimestamp", "numberOfFailedCheckpoints", "numberOfCompletedCheckpoints",
)

# -- RocksDB's native metrics --------------------------------------------------------------------

#: RocksDB's native metrics the job switches on (``state.backend.rocksdb.metrics.<property>``),
#: reported per column family (state) of the dedup operator as ``<state>.rocksdb_<property>``
ESTIMATE_NUM_KEYS = "estimate-num-keys"
ESTIMATE_LIVE_DATA_SIZE = "estimate-live-data-size"
TOTAL_SST_FILES_SIZE = "total-sst-files-size"
ROCKSDB_PROPERTIES = (ESTIMATE_NUM_KEYS, ESTIMATE_LIVE_DATA_SIZE, TOTAL_SST_FILES_SIZE)
#: the column family of the dedup entries (MapStateDescriptor "entries" in jobs/dedup_function.py)
ENTRIES_STATE = "entries"
#: the column family of the Bloom filters' segments (MapStateDescriptor "bloom_segments")
BLOOM_SEGMENTS_STATE = "bloom_segments"
#: the column families whose native metrics are watched (the others are small and fixed)
ROCKSDB_STATES = (ENTRIES_STATE, BLOOM_SEGMENTS_STATE)


def rocksdb_metric(state: str, prop: str) -> str:
    """The id of a native metric within the dedup operator: ``entries.rocksdb_estimate-num-keys``."""
    return f"{state}.rocksdb_{prop}"


# -- the sender workers ---------------------------------------------------------------------------

#: the senders' SLIs (senders/runtime/slis.py): each provider answer's outcome (channel, lane,
#: provider, outcome), the time from accept to the provider taking a message (a histogram:
#: channel, lane, category) and a message's price (channel, provider)
SENDER_DELIVERIES = "sender_deliveries_total"
SENDER_ACCEPT_TO_PROVIDER = "sender_accept_to_provider_seconds"
SENDER_COST = "sender_cost_units_total"
SENDER_DEAD_LETTERS = "sender_dead_letters_total"

#: what the senders' registry (senders/runtime/metrics.py, ``dedupctl senders run --metrics-port``)
#: exports, as Prometheus names; channel and lane label them all but the process's own
#: (``sender_loop_lag_seconds``) and the cost (channel and provider) (docs/senders.md). The
#: senders' code still spells them out: tests/senders/test_metric_names.py holds it to this list
SENDER_METRICS = (
    "sender_retries_total", SENDER_DEAD_LETTERS, "sender_skipped_total",
    "sender_lost_claims_total", "sender_addresses_deactivated_total", "sender_consumer_lag",
    "sender_oldest_waiting_age_seconds", "sender_circuit_state", "sender_circuit_changes_total",
    "provider_calls_total", "provider_call_ms_sum", "sender_provider_rejecting", "sender_retries_moved_total",
    "sender_addresses_reactivated_total", "sender_worker_up", "sender_worker_restarts_total",
    "sender_rule_outcomes_total", "sender_store_pruned_total", "sender_store_transactions_total",
    "sender_store_lock_wait_seconds", "sender_store_lock_held_seconds",
    "sender_calls_in_flight", "sender_loop_lag_seconds", SENDER_DELIVERIES, SENDER_ACCEPT_TO_PROVIDER, SENDER_COST,
    "provider_auth_failures_total",
    # with senders.cpu_idle (senders/runtime/host.py)
    "sender_cpu_idle_group_cores", "sender_cpu_idle_group_waiting_threads", "sender_cpu_idle_group_idle",
    "sender_cpu_idle_group_reliefs_total",
)


# -- as Flink's Prometheus reporter exports them -------------------------------------------------

JOB_SCOPE = "flink_jobmanager_job"
TASK_SCOPE = "flink_taskmanager_job_task"
OPERATOR_SCOPE = "flink_taskmanager_job_task_operator"
#: groups added as key and value: only the key is in the name, the value is a label
KEY_VALUE_GROUPS = frozenset({TOPIC_GROUP, "partition", "split"})
_INVALID_CHARS = re.compile(r"[^a-zA-Z0-9:_]")


def prometheus_filter(text: str) -> str:
    """A name or label value as the reporter writes it: every character outside
    ``[a-zA-Z0-9:_]`` replaced by ``_``."""
    return _INVALID_CHARS.sub("_", text)


def prometheus_name(scope: str, metric_id: str) -> str:
    """The exported name of a metric id (``topic.<t>.emitted`` -> ``<scope>_topic_emitted``)."""
    parts = metric_id.split(".")
    kept: list[str] = []
    skip_value = False
    for part in parts[:-1]:
        if skip_value:
            skip_value = False
            continue
        kept.append(part)
        skip_value = part in KEY_VALUE_GROUPS
    return prometheus_filter("_".join([scope, *kept, parts[-1]]))


def prometheus_names() -> Mapping[str, frozenset[str]]:
    """Every metric this module names, as exported: name -> the ``operator_name`` labels it is
    reported under (empty for job and task metrics)."""
    rocksdb = [rocksdb_metric(s, p) for s in ROCKSDB_STATES for p in ROCKSDB_PROPERTIES]
    by_operator: list[tuple[str, Iterable[str], tuple[str, ...]]] = [
        (OPERATOR_SCOPE, [*DEDUP_COUNTERS, *DEDUP_LEVELS, *rocksdb], (DEDUP_OPERATOR,)),
        (OPERATOR_SCOPE, [*ROUTE_COUNTERS, f"{TOPIC_GROUP}.<topic>.{EMITTED}"], (ROUTE_OPERATOR,)),
        (OPERATOR_SCOPE, OPERATOR_BUILTINS, (DEDUP_OPERATOR, ROUTE_OPERATOR)),
        (TASK_SCOPE, TASK_BUILTINS, ()),
        (JOB_SCOPE, JOB_BUILTINS, ()),
    ]
    out: dict[str, frozenset[str]] = {}
    for scope, names, operators in by_operator:
        for name in names:
            exported = prometheus_name(scope, name)
            out[exported] = out.get(exported, frozenset()) | frozenset(operators)
    return out


# -- the HTTP API ---------------------------------------------------------------------------------

#: what the API serves on its own ``GET /metrics`` (api/metrics.py; docs/operations.md's API
#: metrics). Labels: ``method``, ``route`` (the route's template, never a path), ``status``,
#: ``cause``, ``outcome``, ``bucket``, ``generation``, and ``caller`` (an operator-made name) on
#: the rate-limited answers only: never a user id, a key, a token or anything a caller wrote
API_REQUESTS = "api_requests_total"
API_ACCEPT_SECONDS = "api_accept_seconds"
API_KAFKA_ACK_SECONDS = "api_kafka_ack_seconds"
API_IDEMPOTENT_REPEATS = "api_idempotent_repeats_total"
API_RATE_LIMITED = "api_rate_limited_total"
API_UNAVAILABLE = "api_unavailable_total"
API_LOOP_LAG_SECONDS = "api_event_loop_lag_seconds"
API_STORE_QUEUE_SECONDS = "api_store_queue_seconds"
API_STORE_CALL_SECONDS = "api_store_call_seconds"
API_STORE_LOCK_WAIT_SECONDS = "api_store_lock_wait_seconds"
API_RESERVATION_BATCH = "api_reservation_batch_size"
API_RESERVATION_SECONDS = "api_reservation_seconds"
API_RATE_GRANTS = "api_rate_grants_total"
API_GC_PAUSE_SECONDS = "api_gc_pause_seconds"
API_LEADER = "api_leader"
API_CAMPAIGNS_HELD = "api_campaigns_held"
API_CAMPAIGN_HELD_SECONDS = "api_campaign_held_seconds_total"
API_METRICS = (
    API_REQUESTS, API_ACCEPT_SECONDS, API_KAFKA_ACK_SECONDS, API_IDEMPOTENT_REPEATS, API_RATE_LIMITED,
    API_UNAVAILABLE, API_LOOP_LAG_SECONDS, API_STORE_QUEUE_SECONDS, API_STORE_CALL_SECONDS,
    API_STORE_LOCK_WAIT_SECONDS, API_RESERVATION_BATCH, API_RESERVATION_SECONDS, API_RATE_GRANTS,
    API_GC_PAUSE_SECONDS, API_LEADER, API_CAMPAIGNS_HELD, API_CAMPAIGN_HELD_SECONDS,
)
