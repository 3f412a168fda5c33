"""The results: JSON, a markdown table (stdout and bench/results/latest.md) and a PNG chart."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from operators.metric_names import KEYS_HELD

RESULTS_DIR = Path(__file__).resolve().parent / "results"
#: issue 6: at least 50,000 requests/s sustained, exactly-once, at parallelism 2
TARGET_RPS = 50_000


def _num(value: Any, fmt: str = "{:,.0f}") -> str:
    if value is None:
        return "–"
    return fmt.format(value)


def _pct(value: float | None, fmt: str) -> str:
    return _num(value * 100 if value is not None else None, fmt)


def _get(d: dict[str, Any], *path: str) -> Any:
    for p in path:
        if not isinstance(d, dict):
            return None
        d = d.get(p)  # type: ignore[assignment]
    return d


def exact_cell(r: dict[str, Any]) -> str:
    ex = r.get("exactness")
    if not ex:
        return "–"
    if ex["exact"]:
        return "yes"
    parts = []
    if ex["missing"]:
        parts.append(f"{ex['missing']:,} missing")
    if ex["unexpected"]:
        parts.append(f"{ex['unexpected']:,} unexpected")
    return "**NO**: " + ", ".join(parts)


def markdown(results: dict[str, Any]) -> str:
    m = results["machine"]
    ds = results["dataset"]
    lines = [
        f"## Benchmark {results['started_at']} ({results['mode']} mode)",
        "",
        f"Command: `{results['command']}`  ",
        f"Machine: {m.get('nproc')} CPUs ({m.get('cpu_model')}), {m.get('memory_gib')} GiB, "
        f"{m.get('platform')}, Python {m.get('python')}, {m.get('java')}; load average at start "
        f"{', '.join(f'{x:.2f}' for x in m.get('loadavg_at_start', []))}, at end "
        f"{', '.join(f'{x:.2f}' for x in m.get('loadavg_at_end', []))}  ",
        f"Dataset: {ds['backlog_records']:,} requests in the backlog ({ds['backlog_duplicates']:,} repeats), "
        f"{ds['mean_avro_bytes']:.0f} bytes each as Avro ({ds['mean_json_bytes']:.0f} as JSON), "
        f"{ds['spec']['partitions']} partitions, seed {ds['spec']['seed']}; checkpoint / commit interval "
        f"{results['checkpoint_ms']} ms; latency phase {results['live_s']} s at "
        f"{results.get('live_fraction', 0.8):.0%} of each system's "
        f"sustained rate (at most {results['max_live_rate']:,}/s)  ",
        f"Latency floor (produce -> read_committed consumer through the broker, no system in between, "
        f"{_num(_get(results, 'latency_floor', 'rate'))}/s): "
        f"p50 {_num(_get(results, 'latency_floor', 'p50_ms'))} ms, "
        f"p99 {_num(_get(results, 'latency_floor', 'p99_ms'))} ms",
        "",
        "| system | guarantee | req/s sustained | req/s incl. start-up | start-up s | p50 ms | p99 ms "
        "| latency at req/s | CPU s (backlog) | CPU µs/req | peak RSS MB | state B/key | exact |",
        "|---|---|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|---|",
    ]
    for r in results["systems"]:
        if r.get("status") == "skipped":
            lines.append(f"| {r['title']} | {r['guarantee']} | skipped: {r.get('error', '')} ||||||||||| ")
            continue
        status = "" if r.get("status") == "ok" else f" ({r.get('status')})"
        lines.append(
            f"| {r['title']}{status} | {r['guarantee']} "
            f"| {_num(_get(r, 'backlog', 'sustained_rps'))} "
            f"| {_num(_get(r, 'backlog', 'with_startup_rps'))} "
            f"| {_num(r.get('startup_s'), '{:.1f}')} "
            f"| {_num(_get(r, 'latency', 'p50_ms'))} | {_num(_get(r, 'latency', 'p99_ms'))} "
            f"| {_num(_get(r, 'latency', 'achieved_rps'))} "
            f"| {_num(_get(r, 'cpu', 'cpu_s_backlog'), '{:.1f}')} "
            f"| {_num(_get(r, 'cpu', 'cpu_us_per_request'))} "
            f"| {_num(_get(r, 'cpu', 'peak_rss_mb'))} "
            f"| {_num(_get(r, 'state', 'bytes_per_key'))} | {exact_cell(r)} |"
        )
    jobs = [r for r in results["systems"] if _get(r, "system_metrics", "bloom")]
    if jobs:
        lines += ["", "| this job | keys held | Bloom bits/key | Bloom FP rate | state reads skipped "
                  "| checkpoint bytes | checkpoints (failed) | restarts |",
                  "|---|--:|--:|--:|--:|--:|--:|--:|"]
        for r in jobs:
            sm = r["system_metrics"]
            b = sm["bloom"]
            cp = sm.get("checkpoints", {})
            match = _get(r, "state", "keys_held_matches_model")
            model = f" (**model: {_get(r, 'state', 'keys'):,}**)"
            held = _num(_get(sm, "dedup_metrics", KEYS_HELD)) + (
                "" if match is None else " (= model)" if match else model)
            lines.append(
                f"| {r['title']} | {held} "
                f"| {_num(b['bits_per_key'], '{:.1f}')} "
                f"| {_pct(b['fp_rate'], '{:.2f}%')} | {_pct(b['reads_skipped_share'], '{:.1f}%')} "
                f"| {_num(cp.get('latest_state_size'))} | {cp.get('completed')} ({cp.get('failed')}) "
                f"| {_num(cp.get('restarts'))} |"
            )
    if jobs:
        lines += ["", "Bloom bits/key = the bloom_bits metric over keys_held; the filter is sized for "
                  "`dedup.bloom_expected_keys` (default 1,000,000 over all shards), so it reads high "
                  "when far fewer keys are held. FP rate = bloom_false_positives / (state_reads_skipped + "
                  "bloom_false_positives); reads skipped = state_reads_skipped / (state_reads + skipped)."]
    lines += ["", "Broker (shared, single KRaft node): " + ", ".join(
        f"{r['key']} {_num(_get(r, 'broker', 'cpu_s'), '{:.1f}')} CPU s"
        for r in results["systems"] if r.get("broker"))]
    notes = [f"- {r['title']}: {n}" for r in results["systems"] for n in r.get("notes", [])]
    errors = [f"- {r['title']}: {r['error'].splitlines()[0][:300]}" for r in results["systems"]
              if r.get("error") and r.get("status") != "skipped"]
    if notes:
        lines += ["", "Notes:", *notes]
    if errors:
        lines += ["", "Errors:", *errors]
    lines += ["", LEGEND]
    return "\n".join(lines) + "\n"


LEGEND = """\
*req/s sustained*: the backlog's rate from the times its output became visible: exactly-once
systems between the end of the first committed burst and the end of the second-to-last (whole
commit intervals only), the others between 10% and 90% of the backlog's output. *incl. start-up*:
the backlog over the time from launching the system to its last backlog output. *start-up*: launch
to ready (Flink: every task RUNNING; Python peers: imported and about to consume). *p50/p99*:
produce -> first output of that request visible to a read_committed consumer, while producing at
the rate shown (the latency floor above is the same path with no system in between). *CPU*:
user+system seconds of every process of the system from ready to the end of the backlog, and per
backlog request; the broker is listed separately. *peak RSS*: the sum of each process's peak.
*state B/key*: checkpoint size (Flink) or store size (Quix: RocksDB files; Redis: used_memory
growth; dict: getsizeof) over the keys in state. *exact*: every accepted request on each of its
channels and lanes once and every duplicate notice (with its original) once, nothing else,
against the reference model. Details: bench/README.md."""


def write_json(results: dict[str, Any], path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(results, indent=2, default=str) + "\n")


def chart(results: dict[str, Any], path: Path) -> bool:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    rows = [r for r in results["systems"] if r.get("status") != "skipped"]
    if not rows:
        return False
    names = [r["key"] for r in rows]
    eos = [r.get("exactly_once") for r in rows]
    target_ms = results["checkpoint_ms"] + 1000
    panels = [
        ("requests/s sustained (backlog)", [_get(r, "backlog", "sustained_rps") for r in rows],
         (TARGET_RPS, f"target {TARGET_RPS:,}/s at p=2")),
        ("p99 latency, ms (produce -> visible)", [_get(r, "latency", "p99_ms") for r in rows],
         (target_ms, f"target: checkpoint interval + 1 s = {target_ms:,} ms")),
        ("CPU µs per request (all processes)", [_get(r, "cpu", "cpu_us_per_request") for r in rows], None),
        ("peak RSS, MB (all processes)", [_get(r, "cpu", "peak_rss_mb") for r in rows], None),
    ]
    fig, axes = plt.subplots(2, 2, figsize=(12, 7.5))
    for ax, (title, values, line) in zip(axes.flat, panels, strict=True):
        if line is not None:
            ax.axhline(line[0], color="#c53030", linestyle="--", linewidth=1)
            ax.annotate(line[1], (0, line[0]), xycoords=("axes fraction", "data"), xytext=(2, 2),
                        textcoords="offset points", fontsize=7, color="#c53030")
        vals = [v or 0 for v in values]
        bars = ax.bar(names, vals, color=["#2b6cb0" if e else "#a0aec0" for e in eos])
        for bar, e, v in zip(bars, eos, values, strict=True):
            if not e:
                bar.set_hatch("//")
            ax.annotate("n/a" if v is None else f"{v:,.0f}",
                        (bar.get_x() + bar.get_width() / 2, bar.get_height()), ha="center", va="bottom",
                        fontsize=8)
        ax.set_title(title, fontsize=10)
        ax.tick_params(axis="x", labelrotation=20, labelsize=8)
    m = results["machine"]
    fig.suptitle(f"notify-dedup vs peers, {results['started_at']} ({results['mode']}), "
                 f"{results['dataset']['backlog_records']:,} requests; "
                 f"{m.get('nproc')} CPUs {m.get('cpu_model')}\n"
                 "blue: exactly-once; grey hatched: NOT exactly-once", fontsize=10)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return True
