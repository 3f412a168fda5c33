"""Figures over repeated runs: the order of the runs, medians, spreads, ratios within a round.

Every system runs ``repeats`` times, interleaved (A B C, A B C, ...): one *round* is one run of
each, so slow drifts of the machine (other work, the broker's growing log, the page cache) fall
on every system alike, and a ratio is taken between runs of the same round, minutes apart.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable, Iterable, Sequence
from typing import Any

#: a run's figure, from its result (None: not measured in that run)
Getter = Callable[[dict[str, Any]], float | None]


def schedule(keys: Sequence[str], repeats: int) -> list[tuple[int, str]]:
    """(round, system) in the order they run: every system once per round, rounds in turn."""
    return [(r, key) for r in range(repeats) for key in keys]


def summary(values: Iterable[float | None]) -> dict[str, Any] | None:
    """Median and spread (min, max) of the measured values; None when none was."""
    vals = sorted(v for v in values if v is not None)
    if not vals:
        return None
    return {"median": statistics.median(vals), "min": vals[0], "max": vals[-1], "n": len(vals),
            "values": vals}


def paired_ratios(runs: Sequence[dict[str, Any]], base: Sequence[dict[str, Any]], get: Getter) -> list[float]:
    """``get(run) / get(base run)`` for each round both have a measured figure in."""
    by_round = {b.get("round"): get(b) for b in base}
    out = []
    for r in runs:
        v, b = get(r), by_round.get(r.get("round"))
        if v is not None and b:
            out.append(v / b)
    return out


def rel_spread(s: dict[str, Any] | None) -> float | None:
    """(max - min) / median: how far apart the runs were, as a share of the median."""
    if not s or not s["median"]:
        return None
    return float((s["max"] - s["min"]) / s["median"])


def get_path(d: Any, *path: str) -> Any:
    """``d[path[0]][path[1]]...``, None where a step is missing."""
    for p in path:
        if not isinstance(d, dict):
            return None
        d = d.get(p)
    return d


#: every figure of a run that is summarized over the runs of a system, and where it is
FIGURES: dict[str, tuple[str, ...]] = {
    "sustained_rps": ("backlog", "sustained_rps"),
    "with_startup_rps": ("backlog", "with_startup_rps"),
    "startup_s": ("startup_s",),
    "p50_ms": ("latency", "p50_ms"),
    "p99_ms": ("latency", "p99_ms"),
    "latency_rps": ("latency", "achieved_rps"),
    "cpu_us_per_request": ("cpu", "cpu_us_per_request"),
    "cpu_us_per_request_backlog": ("cpu", "cpu_us_per_request_backlog"),
    "broker_us_per_request": ("broker", "us_per_request"),
    "broker_us_per_request_backlog": ("broker", "us_per_request_backlog"),
    "harness_us_per_request": ("harness", "us_per_request"),
    "peak_rss_mb": ("cpu", "peak_rss_mb"),
    "state_bytes_per_key": ("state", "bytes_per_key"),
    "bloom_bits_per_key": ("system_metrics", "bloom", "bits_per_key"),
    "bloom_fp_rate": ("system_metrics", "bloom", "fp_rate"),
    "reads_skipped_share": ("system_metrics", "bloom", "reads_skipped_share"),
}
#: the figures also given as ratios, within a round, to the bases
RATIO_FIGURES = ("sustained_rps", "cpu_us_per_request", "broker_us_per_request", "p99_ms")
BASES = {"ceiling": "ceiling", "job": "job-p1"}


def figure(name: str) -> Getter:
    path = FIGURES[name]

    def get(run: dict[str, Any]) -> float | None:
        v = get_path(run, *path)
        return float(v) if isinstance(v, int | float) and not isinstance(v, bool) else None

    return get


def summarize(runs: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per system (in the order they first ran): its runs, the median and spread of every
    figure, and of every ratio to the bases' runs of the same round."""
    keys = list(dict.fromkeys(r["key"] for r in runs))
    by_key = {k: [r for r in runs if r["key"] == k] for k in keys}
    out = []
    for key in keys:
        rs = by_key[key]
        first = rs[0]
        ran = [r for r in rs if r.get("status") != "skipped"]
        s: dict[str, Any] = {
            "key": key, "title": first.get("title"), "guarantee": first.get("guarantee"),
            "exactly_once": first.get("exactly_once"), "runs": len(ran),
            "ok_runs": sum(1 for r in ran if r.get("status") == "ok"),
            "exact_runs": sum(1 for r in ran if get_path(r, "exactness", "exact")),
            "statuses": sorted({str(r.get("status")) for r in rs}),
            "figures": {name: summary(figure(name)(r) for r in ran) for name in FIGURES},
            "ratios": {},
        }
        for base_name, base_key in BASES.items():
            base = by_key.get(base_key)
            if not base or base_key == key:
                continue
            s["ratios"][f"to_{base_name}"] = {
                name: summary(paired_ratios(ran, base, figure(name))) for name in RATIO_FIGURES}
        out.append(s)
    return out
