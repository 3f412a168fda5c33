"""The delivery benchmark's arithmetic and its table (pure: no Kafka, no processes).

Times: the stubs record arrivals on the wall clock (epoch seconds) and the senders stamp their
``sending`` status records on it too (epoch ms), so claim-to-provider is a difference of two wall
clocks of one machine. CPU is sampled on the monotonic clock; :func:`to_monotonic` converts.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Mapping, Sequence
from typing import Any


def nearest_rank(sorted_values: Sequence[float], q: float) -> float | None:
    """The q-th percentile (0..100) of sorted values by nearest rank: the smallest value with at
    least q% of the values at or below it."""
    if not sorted_values:
        return None
    return sorted_values[min(len(sorted_values) - 1, max(0, math.ceil(q / 100 * len(sorted_values)) - 1))]


def delivery_window(arrivals: Iterable[float]) -> dict[str, Any]:
    """Messages/s at the stub from the first to the last delivery (``rate``), and between 10% and
    90% of them (``rate_10_90``: the ramp at the start and the tail left out)."""
    times = sorted(arrivals)
    n = len(times)
    out: dict[str, Any] = {"delivered": n, "first": times[0] if times else None, "last": times[-1] if times else None,
                           "window_s": None, "rate": None, "rate_10_90": None}
    if n < 2 or times[-1] <= times[0]:
        return out
    out["window_s"] = times[-1] - times[0]
    out["rate"] = (n - 1) / out["window_s"]
    lo, hi = int(0.1 * (n - 1)), int(0.9 * (n - 1))
    if hi > lo and times[hi] > times[lo]:
        out["rate_10_90"] = (hi - lo) / (times[hi] - times[lo])
    return out


def latency_ms(starts_ms: Mapping[str, float], arrivals_s: Mapping[str, float]) -> list[float]:
    """Per message key found in both: its arrival at the stub less its start (ms), sorted."""
    return sorted(arrivals_s[k] * 1000 - t for k, t in starts_ms.items() if k in arrivals_s)


def latency_summary(values: Sequence[float], missing: int = 0) -> dict[str, Any]:
    """p50, p99 and max of sorted latencies (ms); ``missing`` messages never arrived, and count as
    slower than any that did (a p99 they reach is None: not met within the run)."""
    total = len(values) + missing
    if total == 0:
        return {"n": 0, "missing": 0, "p50": None, "p99": None, "max": None}
    ranked = list(values) + [math.inf] * missing

    def pick(q: float) -> float | None:
        v = nearest_rank(ranked, q)
        return None if v is None or math.isinf(v) else round(v, 1)

    return {"n": len(values), "missing": missing, "p50": pick(50), "p99": pick(99),
            "max": round(values[-1], 1) if values and not missing else None}


def per_message(total: float | None, messages: int) -> float | None:
    if total is None or messages <= 0:
        return None
    return total / messages


def to_monotonic(epoch_s: float, offset_s: float) -> float:
    """A wall-clock time on the monotonic clock, ``offset_s`` being ``time.time() - time.monotonic()``."""
    return epoch_s - offset_s


def prometheus_sum(text: str, metric: str, **labels: str) -> float | None:
    """The sum of a metric's samples (those with every label given), or None when absent."""
    pattern = re.compile(rf"^{re.escape(metric)}(\{{[^}}]*\}})?\s+(\S+)\s*$", re.M)
    total, found = 0.0, False
    for match in pattern.finditer(text):
        inner = match.group(1) or ""
        if all(f'{k}="{v}"' in inner for k, v in labels.items()):
            total += float(match.group(2))
            found = True
    return total if found else None


def mean_in_flight(series: Sequence[tuple[float, int]], t0: float, t1: float) -> float | None:
    """The stub's mean calls in flight over [t0, t1] from its samples."""
    inside = [n for t, n in series if t0 <= t <= t1]
    return sum(inside) / len(inside) if inside else None


# -- the table ----------------------------------------------------------------------------------


def _f(value: float | None, digits: int = 0, unit: str = "") -> str:
    if value is None:
        return "n/a"
    return f"{value:,.{digits}f}{unit}"


def store_label(store: str, processes: int) -> str:
    return f"{store} x{processes}" if processes > 1 else store


def _header(head: str) -> list[str]:
    return [head, "|" + "|".join(["---"] * (head.count("|") - 1)) + "|"]


def channel_label(r: Mapping[str, Any]) -> str:
    """The run's channel, with the push protocol it was sent by (``push (fcm)``) where one was chosen."""
    protocol = r.get("protocol")
    return f"{r['channel']} ({protocol})" if protocol else str(r["channel"])


def throughput_table(runs: Sequence[Mapping[str, Any]]) -> str:
    head = ("| channel | store | latency | delivered | msg/s | msg/s 10-90% | claim->provider p50 / p99 |"
            " peak in flight | stub connections (peak / HTTP/2) | store tx/msg (pg / counter) | CPU us/msg senders |"
            " stub us/call | repeated keys |")
    lines = _header(head)
    for r in runs:
        conn = r.get("connections") or {}
        lat = r["claim_to_provider_ms"]
        tx = r["store_tx_per_message"]
        cpu = r["cpu_us_per_message"]
        done = f"{r['delivered']:,}/{r['messages']:,}" + ("" if r["complete"] else " (bound)")
        lines.append(
            f"| {channel_label(r)} | {store_label(r['store'], r['processes'])} | {r['latency_ms']} ms | {done} |"
            f" {_f(r['rate'])} | {_f(r['rate_10_90'])} | {_f(lat['p50'])} / {_f(lat['p99'])} ms |"
            f" {r['peak_in_flight']} | {_f(conn.get('peak_connections'))} / {_f(conn.get('h2_connections'))} |"
            f" {_f(tx['pg_xact_commit'], 2)} / {_f(tx['counter'], 2)} |"
            f" {_f(cpu['senders'])} | {_f(cpu['stub'])} | {r['repeated_key_calls']} |"
        )
    return "\n".join(lines)


def isolation_table(phases: Sequence[Mapping[str, Any]]) -> str:
    head = ("| store | latency | campaign queued | codes | code write -> SMS stub p50 / p99 / max |"
            " campaign msg/s meanwhile | campaign in flight meanwhile (mean / peak) | flood held | target p99 |")
    lines = _header(head)
    for p in phases:
        lat = p["code_latency_ms"]
        lines.append(
            f"| {store_label(p['store'], p['processes'])} | {p['latency_ms']} ms | {p['campaign']:,} |"
            f" {lat['n']}/{p['codes']} | {_f(lat['p50'])} / {_f(lat['p99'])} / {_f(lat['max'])} ms |"
            f" {_f(p['campaign_rate_during_codes'])} | {_f(p['campaign_in_flight_mean'])} /"
            f" {p['campaign_peak_in_flight']} | {'yes' if p['flood_held'] else 'NO'} |"
            f" {'met' if p['target_met'] else 'not met'} (< {p['target_p99_ms']:g} ms) |"
        )
    return "\n".join(lines)


def run_line(r: Mapping[str, Any]) -> str:
    """One throughput run, as printed when it ends."""
    lat = r["claim_to_provider_ms"]
    return (f"{channel_label(r):<5} {store_label(r['store'], r['processes']):<15} {r['latency_ms']:>3} ms:"
            f" {r['delivered']}/{r['messages']} delivered, {_f(r['rate'])} msg/s, claim->provider p50"
            f" {_f(lat['p50'])} p99 {_f(lat['p99'])} ms, peak in flight {r['peak_in_flight']},"
            f" CPU {_f(r['cpu_us_per_message']['senders'])} us/msg, repeated keys {r['repeated_key_calls']},"
            f" stub connections {(r.get('connections') or {}).get('peak_connections')}")


def isolation_line(p: Mapping[str, Any]) -> str:
    """The priority-lane phase, as printed when it ends."""
    lat = p["code_latency_ms"]
    return (f"priority lane ({store_label(p['store'], p['processes'])}, {p['latency_ms']} ms):"
            f" {lat['n']}/{p['codes']} codes, p50 {_f(lat['p50'])} p99 {_f(lat['p99'])} max"
            f" {_f(lat['max'])} ms beside {p['campaign']:,} campaign emails")


def markdown(result: Mapping[str, Any]) -> str:
    """The result file's tables (``senders-<date>[-quick].md``)."""
    m = result["machine"]
    lines = [
        f"# Delivery benchmark, {result['date']} ({result['mode']}{', ' + result['label'] if result['label'] else ''})",
        "",
        f"`{result['command']}` at {result['git'].get('commit', '')[:12]}; {m.get('nproc')} CPUs"
        f" ({m.get('cpu_model')}), load average {_load(m.get('loadavg_at_start'))} at the start,"
        f" {_load(m.get('loadavg_at_end'))} at the end. A shared machine: preliminary figures.",
        "",
        "## Throughput (campaign messages, one per user; `dedupctl senders run` per process)",
        "",
        throughput_table(result["runs"]),
        "",
        "## The priority lane under a campaign flood (one-time codes on notifications.sms.priority)",
        "",
        isolation_table(result["priority_lane"]),
        "",
        "## Profile imports of the runs (`dedupctl users import`, each timed with its process's start)",
        "",
        "| store | imports | profiles | seconds | profiles/s | the largest: profiles, profiles/s |",
        "|---|---|---|---|---|---|",
        *_import_rows(result["imports"]),
    ]
    notes = [f"- {r['run']}: {n}" for r in [*result["runs"], *result["priority_lane"]] for n in r["notes"]]
    if notes:
        lines += ["", "## Notes", "", *notes]
    return "\n".join(lines) + "\n"


def _load(values: Sequence[float] | None) -> str:
    return "n/a" if not values else " ".join(f"{v:.2f}" for v in values)


def _import_rows(imports: Sequence[dict[str, Any]]) -> list[str]:
    rows = []
    for store in dict.fromkeys(i["store"] for i in imports):
        mine = [i for i in imports if i["store"] == store]
        profiles, seconds = sum(i["profiles"] for i in mine), sum(i["seconds"] for i in mine)
        top = max(mine, key=lambda i: i["profiles"])
        rows.append(f"| {store} | {len(mine)} | {profiles:,} | {seconds:,.1f} | {profiles / seconds:,.0f} |"
                    f" {top['profiles']:,}, {top['profiles_per_s']:,.0f} |")
    return rows
