"""The names of the job's metrics: one place for the job, ``dedupctl status``, the benchmarks and
the checks of the Grafana dashboard and the alert rules (tests/deploy)."""

from __future__ import annotations

#: the Python dedup operator (``.name(...)`` in jobs/dedup_job.py): its counters and levels
DEDUP_OPERATOR = "dedup"
#: the JVM operator after it that writes each outcome's records; it counts them per topic
#: (``route.topic.<topic>.emitted``), invalid input included
ROUTE_OPERATOR = "route"
#: the per-topic counter of the route operator
EMITTED = "emitted"
#: counters of the dedup operator, per outcome and prefilter result
DEDUP_COUNTERS = (
    "accepted", "duplicates", "late", "state_reads", "state_reads_skipped", "bloom_false_positives", "evicted",
)
#: levels of the dedup operator, reported through counters set to the current value
DEDUP_LEVELS = ("keys_held", "bloom_keys_estimate", "bloom_bits", "bloom_fill_ratio_pct", "newest_event_time")
#: counters of the route operator: invalid input (rejected where it was read, in the JVM)
ROUTE_COUNTERS = ("invalid",)
#: RocksDB's native metrics the job switches on (``state.backend.rocksdb.metrics.<property>``),
#: reported per column family (state) of the dedup operator as ``<state>.rocksdb_<property>``
ROCKSDB_PROPERTIES = ("estimate-num-keys", "estimate-live-data-size", "total-sst-files-size")
