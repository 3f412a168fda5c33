"""What the API's own ``/metrics`` says about a phase of ``bench.api``: the difference of two
scrapes, histograms summarised as count, mean and quantiles (estimated from the buckets as
Prometheus's ``histogram_quantile`` does: linear within the bucket)."""

from __future__ import annotations

import math
import urllib.request
from collections.abc import Mapping
from typing import Any

from prometheus_client.parser import text_string_to_metric_families

from operators import metric_names as names

#: the histograms a phase reports, by a short name
HISTOGRAMS = {
    "accept_202": (names.API_ACCEPT_SECONDS, {"status": "202"}),
    "kafka_ack": (names.API_KAFKA_ACK_SECONDS, {}),
    "loop_lag": (names.API_LOOP_LAG_SECONDS, {}),
    "store_queue": (names.API_STORE_QUEUE_SECONDS, {}),
    "store_call": (names.API_STORE_CALL_SECONDS, {}),
    "lock_wait": (names.API_STORE_LOCK_WAIT_SECONDS, {}),
    "reservation_batch": (names.API_RESERVATION_BATCH, {}),
    "reservation": (names.API_RESERVATION_SECONDS, {}),
    "gc_pause": (names.API_GC_PAUSE_SECONDS, {}),
}

Sample = tuple[str, tuple[tuple[str, str], ...]]


def scrape(url: str, timeout_s: float = 10.0) -> dict[Sample, float]:
    """Every sample of ``url``/metrics: (name, sorted labels) -> value."""
    with urllib.request.urlopen(url + "/metrics", timeout=timeout_s) as reply:
        text = reply.read().decode("utf-8")
    out: dict[Sample, float] = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            key = (s.name, tuple(sorted(s.labels.items())))
            out[key] = out.get(key, 0.0) + float(s.value)
    return out


def _matches(labels: tuple[tuple[str, str], ...], want: Mapping[str, str]) -> bool:
    have = dict(labels)
    return all(have.get(k) == v for k, v in want.items())


def quantile(q: float, buckets: list[tuple[float, float]]) -> float:
    """From cumulative (upper bound, count) pairs, sorted; NaN without observations."""
    if not buckets or buckets[-1][1] <= 0:
        return math.nan
    rank = q * buckets[-1][1]
    lower, below = 0.0, 0.0
    for upper, count in buckets:
        if count >= rank:
            if math.isinf(upper):
                return lower
            inside = count - below
            return lower + (upper - lower) * ((rank - below) / inside if inside else 0.0)
        lower, below = upper, count
    return buckets[-1][0]


def histogram(before: Mapping[Sample, float], after: Mapping[Sample, float], name: str,
              want: Mapping[str, str], scale: float = 1000.0) -> dict[str, float]:
    """count, mean, p50, p90, p99 (times ``scale``: ms for seconds) of what a histogram observed
    between two scrapes, summed over the labels not in ``want``."""
    by_bound: dict[float, float] = {}
    total = count = 0.0
    for (sample, labels), value in after.items():
        if not _matches(labels, want):
            continue
        delta = value - before.get((sample, labels), 0.0)
        if sample == name + "_bucket":
            bound = float(dict(labels)["le"])
            by_bound[bound] = by_bound.get(bound, 0.0) + delta
        elif sample == name + "_sum":
            total += delta
        elif sample == name + "_count":
            count += delta
    buckets = sorted(by_bound.items())
    out = {"count": count, "mean": total / count * scale if count else math.nan}
    for q in (0.5, 0.9, 0.99):
        out[f"p{round(q * 100)}"] = quantile(q, buckets) * scale
    return out


def counter(before: Mapping[Sample, float], after: Mapping[Sample, float], name: str,
            by: str) -> dict[str, float]:
    """A counter's increase between two scrapes, per value of the label ``by``."""
    out: dict[str, float] = {}
    for (sample, labels), value in after.items():
        if sample != name:
            continue
        delta = value - before.get((sample, labels), 0.0)
        if delta:
            key = dict(labels).get(by, "")
            out[key] = out.get(key, 0.0) + delta
    return out


def phase_report(before: Mapping[Sample, float], after: Mapping[Sample, float]) -> dict[str, Any]:
    report: dict[str, Any] = {}
    for short, (name, want) in HISTOGRAMS.items():
        report[short] = histogram(before, after, name, want, 1.0 if short == "reservation_batch" else 1000.0)
    report["statuses"] = counter(before, after, names.API_REQUESTS, "status")
    report["rate_grants"] = counter(before, after, names.API_RATE_GRANTS, "bucket")
    report["gc_pauses_by_generation"] = counter(before, after, names.API_GC_PAUSE_SECONDS + "_count", "generation")
    return report


def store_locks(before: Mapping[Sample, float], after: Mapping[Sample, float]) -> dict[str, dict[str, float]]:
    """The senders' write transactions on the status store between two scrapes of their
    ``/metrics``, per lane (every channel's workers of it): the wait for the file's write lock and
    how long it was then held (ms: count, mean, p50, p90, p99)."""
    out: dict[str, dict[str, float]] = {}
    for lane in ("priority", "normal"):
        for short, name in (("wait", "sender_store_lock_wait_seconds"), ("held", "sender_store_lock_held_seconds")):
            out[f"{lane}_{short}"] = histogram(before, after, name, {"lane": lane})
    return out
