"""The results: JSON, a markdown table (stdout and bench/results/latest.md) and a PNG chart."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from bench.stats import get_path
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


_get = get_path


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


def cell(s: dict[str, Any] | None, fmt: str = "{:,.0f}", scale: float = 1.0) -> str:
    """A median, with its spread (min–max) when there was more than one run."""
    if not s:
        return "–"
    med = fmt.format(s["median"] * scale)
    if s["n"] == 1:
        return med
    return f"{med} ({fmt.format(s['min'] * scale)}–{fmt.format(s['max'] * scale)})"


def _fig(s: dict[str, Any], name: str) -> dict[str, Any] | None:
    f: dict[str, Any] | None = _get(s, "figures", name)
    return f


def _exact_runs(s: dict[str, Any]) -> str:
    if not s["runs"]:
        return "–"
    if s["exact_runs"] == s["runs"]:
        return "yes" if s["runs"] == 1 else f"yes ({s['runs']} of {s['runs']})"
    return f"**NO**: {s['exact_runs']} of {s['runs']} runs exact"


def _header(results: dict[str, Any]) -> list[str]:
    m = results["machine"]
    ds = results["dataset"]
    floor = results.get("latency_floor") or {}
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
        f"{ds['spec']['partitions']} partitions, seed {ds['spec']['seed']}"
        + (f"; the ceiling's backlog: {results['ceiling_backlog']:,} records of the same sizes"
           if results.get("ceiling_backlog") else "")
        + f"; checkpoint / commit interval {results['checkpoint_ms']} ms; latency phase {results['live_s']} s "
        f"at {results.get('live_fraction', 0.8):.0%} of each system's sustained rate (at most "
        f"{results['max_live_rate']:,}/s)  ",
        f"Runs: {results.get('repeats', 1)} of each system, interleaved: {' '.join(results.get('order', []))}  ",
    ]
    warm = results.get("warmup")
    if warm:
        lines.append(
            f"Broker warm-up before every counted window: rounds of {warm['records']:,} records in "
            f"transactions of {warm['transaction']:,}, written and read back read_committed, broker µs per record "
            + " → ".join(f"{w['broker_us_per_record']:.1f}" for w in warm["rounds"])
            + ("" if warm.get("settled") else " (**still falling at the last round**)")
            + f"; idle, the broker spends {warm.get('broker_idle_cpu_per_s', 0) * 1000:.0f} ms of CPU per second  ")
    lines.append(
        f"Latency floor (live producer -> broker -> read_committed watcher, each a process of its own, no "
        f"system in between, {_num(floor.get('rate'))}/s): p50 {_num(floor.get('p50_ms'), '{:,.1f}')} ms, "
        f"p99 {_num(floor.get('p99_ms'), '{:,.1f}')} ms, max {_num(floor.get('max_ms'), '{:,.1f}')} ms; the broker "
        f"spent {_num(floor.get('broker_us_per_record'))} µs of CPU per record at that rate"
        + (f" (the same pass during the warm-up: p99 {_num(_get(results, 'warmup', 'floor', 'p99_ms'), '{:,.1f}')} ms, "
           f"{_num(_get(results, 'warmup', 'floor', 'broker_us_per_record'))} µs per record)"
           if _get(results, "warmup", "floor") else ""))
    return lines


def markdown(results: dict[str, Any]) -> str:
    summaries = results.get("systems") or []
    runs = results.get("runs") or []
    lines = _header(results) + [
        "",
        "Median of the runs (min–max):",
        "",
        "| system | guarantee | runs | req/s sustained | share of ceiling | × job-p1 | req/s incl. start-up "
        "| start-up s | p50 ms | p99 ms | latency at req/s | CPU µs/req | broker µs/req | peak RSS MB "
        "| state B/key | exact |",
        "|---|---|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|---|",
    ]
    for s in summaries:
        if not s["runs"]:
            lines.append(f"| {s['title']} | {s['guarantee']} | skipped: "
                         f"{next((r.get('error') for r in runs if r['key'] == s['key']), '')} |||||||||||||| ")
            continue
        status = "" if s["statuses"] == ["ok"] else f" ({', '.join(s['statuses'])})"
        ratios = s.get("ratios") or {}
        lines.append(
            f"| {s['title']}{status} | {s['guarantee']} | {s['runs']} "
            f"| {cell(_fig(s, 'sustained_rps'))} "
            f"| {cell(_get(ratios, 'to_ceiling', 'sustained_rps'), '{:.0f}%', 100)} "
            f"| {cell(_get(ratios, 'to_job', 'sustained_rps'), '{:.2f}')} "
            f"| {cell(_fig(s, 'with_startup_rps'))} | {cell(_fig(s, 'startup_s'), '{:.1f}')} "
            f"| {cell(_fig(s, 'p50_ms'))} | {cell(_fig(s, 'p99_ms'))} | {cell(_fig(s, 'latency_rps'))} "
            f"| {cell(_fig(s, 'cpu_us_per_request'))} | {cell(_fig(s, 'broker_us_per_request'), '{:.1f}')} "
            f"| {cell(_fig(s, 'peak_rss_mb'))} | {cell(_fig(s, 'state_bytes_per_key'))} | {_exact_runs(s)} |"
        )
    with_ratios = [s for s in summaries if s.get("ratios")]
    if with_ratios:
        lines += ["", "Ratios within a round (median, min–max over the rounds):", "",
                  "| system | req/s ÷ ceiling | req/s ÷ job-p1 | CPU µs/req ÷ job-p1 | broker µs/req ÷ job-p1 "
                  "| broker µs/req ÷ ceiling | p99 ÷ job-p1 |",
                  "|---|--:|--:|--:|--:|--:|--:|"]
        for s in with_ratios:
            ra = s["ratios"]
            lines.append(
                f"| {s['title']} | {cell(_get(ra, 'to_ceiling', 'sustained_rps'), '{:.2f}')} "
                f"| {cell(_get(ra, 'to_job', 'sustained_rps'), '{:.2f}')} "
                f"| {cell(_get(ra, 'to_job', 'cpu_us_per_request'), '{:.2f}')} "
                f"| {cell(_get(ra, 'to_job', 'broker_us_per_request'), '{:.2f}')} "
                f"| {cell(_get(ra, 'to_ceiling', 'broker_us_per_request'), '{:.2f}')} "
                f"| {cell(_get(ra, 'to_job', 'p99_ms'), '{:.2f}')} |")
    lines += _runs_table(runs) + _job_table(runs) + _engines_tables(results.get("engines"))
    notes = sorted({f"- {r['title']}: {n}" for r in runs for n in r.get("notes", [])})
    notes += [f"- {r['key']}#{r.get('round', 0)}: {n}" for r in runs for n in r.get("run_notes", [])]
    errors = [f"- {r['key']}#{r.get('round', 0)}: {r['error'].splitlines()[0][:300]}" for r in runs
              if r.get("error") and r.get("status") != "skipped"]
    if notes:
        lines += ["", "Notes:", *notes]
    if errors:
        lines += ["", "Errors:", *errors]
    lines += ["", LEGEND]
    return "\n".join(lines) + "\n"


def _runs_table(runs: list[dict[str, Any]]) -> list[str]:
    ran = [r for r in runs if r.get("status") != "skipped"]
    if not ran:
        return []
    lines = ["", "Every run, in the order they ran:", "",
             "| run | status | req/s sustained (2nd half) | intervals | 1st half | whole backlog | bursts "
             "| incl. start-up | p99 ms | CPU µs/req | ready to end of backlog | broker µs/req | of which idle "
             "| ready to end of backlog | harness µs/req | exact |",
             "|---|---|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|---|"]
    for r in ran:
        lines.append(
            f"| {r['key']}#{r.get('round', 0)} | {r.get('status')} | {_num(_get(r, 'backlog', 'sustained_rps'))} "
            f"| {_num(_get(r, 'backlog', 'intervals'))} | {_num(_get(r, 'backlog', 'first_half_rps'))} "
            f"| {_num(_get(r, 'backlog', 'whole_rps'))} | {_num(_get(r, 'backlog', 'bursts'))} "
            f"| {_num(_get(r, 'backlog', 'with_startup_rps'))} | {_num(_get(r, 'latency', 'p99_ms'))} "
            f"| {_num(_get(r, 'cpu', 'cpu_us_per_request'))} | {_num(_get(r, 'cpu', 'cpu_us_per_request_backlog'))} "
            f"| {_num(_get(r, 'broker', 'us_per_request'), '{:.1f}')} "
            f"| {_num(_get(r, 'broker', 'idle_us_per_request'), '{:.1f}')} "
            f"| {_num(_get(r, 'broker', 'us_per_request_backlog'), '{:.1f}')} "
            f"| {_num(_get(r, 'harness', 'us_per_request'), '{:.1f}')} | {exact_cell(r)} |")
    return lines


def _job_table(runs: list[dict[str, Any]]) -> list[str]:
    jobs = [r for r in runs if _get(r, "system_metrics", "bloom")]
    if not jobs:
        return []
    lines = ["", "| this job | keys held | Bloom bits/key | Bloom FP rate | state reads skipped "
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
            f"| {r['key']}#{r.get('round', 0)} | {held} "
            f"| {_num(b['bits_per_key'], '{:.1f}')} "
            f"| {_pct(b['fp_rate'], '{:.2f}%')} | {_pct(b['reads_skipped_share'], '{:.1f}%')} "
            f"| {_num(cp.get('latest_state_size'))} | {cp.get('completed')} ({cp.get('failed')}) "
            f"| {_num(cp.get('restarts'))} |"
        )
    lines += ["", "Bloom bits/key = the bloom_bits metric over keys_held. FP rate = bloom_false_positives / "
              "(state_reads_skipped + bloom_false_positives); reads skipped = state_reads_skipped / "
              "(state_reads + skipped)."]
    return lines


def _engines_tables(e: dict[str, Any] | None) -> list[str]:
    if not e:
        return []
    if e.get("error"):
        return ["", f"In-process engines: not measured ({e['error'].splitlines()[0][:300]})"]
    km = e["key_mix"]
    lines = ["", f"In-process engines (bench/engines.py; {km['checks']:,} checks of ~{km['mean_key_chars']:.0f}-char "
             f"keys, {km['new_share']:.0%} new, the rest repeats of the {km['repeats_of']:,} newest; Redis: "
             f"{km['redis_checks']:,} checks; target: {e['target_checks_per_s']:,} checks/s on one thread "
             "in process):", "",
             "| engine | keys as / call | threads | checks/s | vs target | client CPU µs/check "
             "| Redis server CPU µs/check | exact |",
             "|---|---|--:|--:|--:|--:|--:|---|"]
    for r in e["rates"]:
        vs = (f"{r['checks_per_s'] / e['target_checks_per_s']:.0%}" if r["engine"] == "MemoryDedup" else "")
        lines.append(
            f"| {r['engine']} | {r['variant']} | {r['threads']} | {_num(r['checks_per_s'])} | {vs} "
            f"| {_num(r['cpu_us_per_check'], '{:.2f}')} | {_num(r.get('server_cpu_us_per_check'), '{:.1f}')} "
            f"| {'yes' if r.get('exact') else '**NO**'} |")
    lines += ["", f"| engine | keys as | keys held | bytes/key (tracemalloc) | bytes/key (RSS growth) "
              f"| bytes/key (Redis used_memory) | vs the design's ~{e['design_bytes_per_key']} |",
              "|---|---|--:|--:|--:|--:|--:|"]
    for r in e["memory"]:
        main = r.get("bytes_per_key_tracemalloc") or r.get("bytes_per_key_used_memory")
        lines.append(
            f"| {r['engine']} | {r['variant']} | {_num(r['keys'])} | {_num(r.get('bytes_per_key_tracemalloc'))} "
            f"| {_num(r.get('bytes_per_key_rss'))} | {_num(r.get('bytes_per_key_used_memory'))} "
            f"| {_num(main / e['design_bytes_per_key'] if main else None, '{:.1f}×')} |")
    if e.get("redis_error"):
        lines += ["", f"RedisDedup: not measured ({e['redis_error']})"]
    return lines


LEGEND = """\
*req/s sustained*: the backlog's rate from the times its output became visible (the output
topics' last stable offsets, polled every 100 ms): exactly-once
systems between the end of the first committed burst and the end of the second-to-last (whole
commit intervals only), the others between 10% and 90% of the backlog's output. *share of
ceiling*: that rate over the exactly-once pass-through's (the ceiling) in the same round; *×
job-p1*: over the job's at parallelism 1 in the same round. *incl. start-up*: the backlog over the
time from launching the system to its last backlog output. *start-up*: launch to ready (Flink:
every task RUNNING; Python peers: imported and about to consume). *p50/p99*: produce -> first
output of that request visible to a read_committed consumer, while producing at the rate shown
(the latency floor above is the same path with no system in between). *CPU*: user+system seconds
of every process of the system from ready to the end of the backlog, per backlog request.
*broker µs/req*: the broker's CPU over the same window per backlog request (its share of the
system's input, output, transactions and of the watcher's reads); *harness µs/req* the same for
the harness (this process, the watcher). *peak RSS*: the sum of each process's peak. *state
B/key*: checkpoint size (Flink) or store size (Quix: RocksDB files; Redis: used_memory growth;
dict: getsizeof) over the keys in state. *exact*: every accepted request on each of its channels
and lanes once and every duplicate notice (with its original) once, nothing else, against the
reference model; the ceiling: every input record once in its output. Details: bench/README.md."""


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
    rows = [s for s in results.get("systems") or [] if s["runs"]]
    if not rows:
        return False
    names = [s["key"] for s in rows]
    eos = [s.get("exactly_once") for s in rows]
    target_ms = results["checkpoint_ms"] + 1000
    panels = [
        ("requests/s sustained (backlog)", "sustained_rps", (TARGET_RPS, f"target {TARGET_RPS:,}/s at p=2")),
        ("p99 latency, ms (produce -> visible)", "p99_ms",
         (target_ms, f"target: checkpoint interval + 1 s = {target_ms:,} ms")),
        ("CPU µs per request (all processes)", "cpu_us_per_request", None),
        ("broker CPU µs per request (same window)", "broker_us_per_request", None),
    ]
    fig, axes = plt.subplots(2, 2, figsize=(12, 7.5))
    for ax, (title, name, line) in zip(axes.flat, panels, strict=True):
        if line is not None:
            ax.axhline(line[0], color="#c53030", linestyle="--", linewidth=1)
            ax.annotate(line[1], (0, line[0]), xycoords=("axes fraction", "data"), xytext=(2, 2),
                        textcoords="offset points", fontsize=7, color="#c53030")
        figs = [_fig(s, name) for s in rows]
        vals = [f["median"] if f else 0 for f in figs]
        err = [[f["median"] - f["min"] if f else 0 for f in figs],
               [f["max"] - f["median"] if f else 0 for f in figs]]
        bars = ax.bar(names, vals, color=["#2b6cb0" if e else "#a0aec0" for e in eos], yerr=err, capsize=3,
                      ecolor="#4a5568")
        for bar, e, f in zip(bars, eos, figs, strict=True):
            if not e:
                bar.set_hatch("//")
            ax.annotate("n/a" if f is None else f"{f['median']:,.0f}",
                        (bar.get_x() + bar.get_width() / 2, bar.get_height()), ha="center", va="bottom",
                        fontsize=8, xytext=(8, 0), textcoords="offset points")
        ax.set_title(title, fontsize=10)
        ax.tick_params(axis="x", labelrotation=20, labelsize=8)
    m = results["machine"]
    fig.suptitle(f"notify-dedup vs peers, {results['started_at']} ({results['mode']}), "
                 f"{results['dataset']['backlog_records']:,} requests, {results.get('repeats', 1)} run(s) each; "
                 f"{m.get('nproc')} CPUs {m.get('cpu_model')}\n"
                 "median, bars min..max; blue: exactly-once; grey hatched: NOT exactly-once", fontsize=10)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return True
