"""Metric ids as Flink's REST API lists them, mapped to the names its PrometheusReporter exports.

The reporter (flink-metrics-prometheus, ``AbstractPrometheusReporter``; the mapping is
``operators.metric_names.prometheus_name``) names a metric
``flink_<logical scope>_<metric name>``, every character outside ``[a-zA-Z0-9:_]`` replaced by
``_``. The logical scope of a job metric is ``jobmanager_job``, of a task metric
``taskmanager_job_task``, of an operator metric ``taskmanager_job_task_operator`` followed by
the operator's user groups. A group added as a key and a value (``add_group("topic", name)``)
puts only its key into the scope; the value becomes a label (``topic="notifications_push"``),
as do the scope variables (``job_name``, ``operator_name``, ``subtask_index``, ...). A
histogram is exported as a summary (``name{quantile=...}``) plus ``name_count``.

The REST API lists a vertex's metric ids as ``<operator>.<groups>.<name>`` for operator metrics
and ``<groups>.<name>`` for task metrics, with ' ', '.', ':' and ',' inside each part replaced by
'_'; a histogram as ``<name>_min``, ``_max``, ``_p99`` and so on.
"""

from __future__ import annotations

import re
from collections.abc import Iterable

from operators.metric_names import JOB_SCOPE, OPERATOR_SCOPE, TASK_SCOPE, prometheus_filter, prometheus_name
from ops.flink_rest import RestClient
from ops.status_probe import operator_names, rest_name

HISTOGRAM_SUFFIXES = (
    "_min", "_max", "_mean", "_median", "_stddev", "_p75", "_p90", "_p95", "_p98", "_p99", "_p999",
)
#: a metric name in a PromQL expression: every one this project uses is Flink's
METRIC_IN_PROMQL = re.compile(r"\bflink_[A-Za-z0-9_:]+")
LABEL_MATCHER = re.compile(r'\b([a-zA-Z_][a-zA-Z0-9_]*)\s*(=|!=|=~|!~)\s*"([^"]*)"')


def names_for(scope: str, metric_id: str) -> set[str]:
    """The exported name(s) of one metric id of ``scope`` (without the operator prefix); the
    naming itself is operators/metric_names.py's (``prometheus_name``)."""
    parts = metric_id.split(".")
    last = parts[-1]
    for suffix in HISTOGRAM_SUFFIXES:
        if last.endswith(suffix):
            base = prometheus_name(scope, ".".join([*parts[:-1], last[: -len(suffix)]]))
            return {base, f"{base}_count"}
    return {prometheus_name(scope, metric_id)}


def vertex_metric_names(vertex_name: str, metric_ids: Iterable[str]) -> dict[str, set[str]]:
    """Metric id -> exported names, for one vertex; also returns which operator each belongs to."""
    operators = {rest_name(n) for n in operator_names(vertex_name)}
    out: dict[str, set[str]] = {}
    for mid in metric_ids:
        head, _, rest = mid.partition(".")
        if rest and head in operators:
            out[mid] = names_for(OPERATOR_SCOPE, rest)
        else:
            out[mid] = names_for(TASK_SCOPE, mid)
    return out


def exported_names(rest: RestClient, job_id: str) -> tuple[set[str], set[str]]:
    """(every name the job's metrics export, every operator name as a label value)."""
    names: set[str] = set()
    operators: set[str] = set()
    for m in rest.call("GET", f"/jobs/{job_id}/metrics") or []:
        names |= names_for(JOB_SCOPE, m["id"])
    for vertex in rest.call("GET", f"/jobs/{job_id}")["vertices"]:
        ids = [m["id"] for m in rest.call("GET", f"/jobs/{job_id}/vertices/{vertex['id']}/subtasks/metrics")]
        for found in vertex_metric_names(vertex["name"], ids).values():
            names |= found
        operators |= {prometheus_filter(n) for n in operator_names(vertex["name"])}
    return names, operators


def operator_metric_names(rest: RestClient, job_id: str) -> dict[str, set[str]]:
    """Exported operator metric name -> the ``operator_name`` labels it has in the running job."""
    out: dict[str, set[str]] = {}
    for vertex in rest.call("GET", f"/jobs/{job_id}")["vertices"]:
        labels = {rest_name(n): prometheus_filter(n) for n in operator_names(vertex["name"])}
        ids = [m["id"] for m in rest.call("GET", f"/jobs/{job_id}/vertices/{vertex['id']}/subtasks/metrics")]
        for mid, found in vertex_metric_names(vertex["name"], ids).items():
            head = mid.partition(".")[0]
            if head in labels:
                for name in found:
                    out.setdefault(name, set()).add(labels[head])
    return out


def promql_metric_names(expr: str) -> set[str]:
    return set(METRIC_IN_PROMQL.findall(expr))


def promql_label_values(expr: str, label: str) -> set[str]:
    """Values an expression matches ``label`` against with = (not regex matchers)."""
    return {value for name, op, value in LABEL_MATCHER.findall(expr) if name == label and op == "="}
