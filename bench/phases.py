"""The checkpoint-interval table: ``python -m bench.phases RESULTS.json ... [--out FILE.md]``.

Each results file is one ``python -m bench.run --checkpoint-ms N --live-rates R1,R2,...`` run;
for every exactly-once run in it: the interval, the sustained (broker-timed) rate and CPU per
request over the backlog, the checkpoints' end-to-end duration while saturated, and per fixed-rate
latency phase the produce -> visible p50/p99, the system's CPU (cores and µs per request) and
the checkpoints' duration at that load. Medians over the rounds of one interval, then each run.
"""

from __future__ import annotations

import argparse
import json
import statistics
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from bench.stats import get_path


def _num(value: Any, fmt: str = "{:,.0f}") -> str:
    return "n/a" if value is None else fmt.format(value)


def _median(values: Iterable[float | None]) -> float | None:
    got = [v for v in values if v is not None]
    return statistics.median(got) if got else None


def rows(results: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """One row per run and latency phase (a run without phases: one row for its backlog)."""
    out = []
    for res in results:
        for r in res.get("runs", []):
            if not r.get("exactly_once") or r.get("status") != "ok":
                continue
            base = {
                "system": r["key"], "interval_ms": res["checkpoint_ms"], "round": r.get("round", 0),
                "sustained_rps": get_path(r, "backlog", "sustained_rps"),
                "cpu_us_per_request": get_path(r, "cpu", "cpu_us_per_request"),
                "backlog_cp_p50": get_path(r, "backlog_checkpoints", "duration_ms_p50"),
                "backlog_cp_p99": get_path(r, "backlog_checkpoints", "duration_ms_p99"),
                "exact": get_path(r, "exactness", "exact"), "load": (res.get("machine") or {}).get("loadavg_at_start"),
            }
            for phase in r.get("latency_phases") or [{}]:
                out.append({**base, "rate": phase.get("target_rps"), "p50_ms": phase.get("p50_ms"),
                            "p99_ms": phase.get("p99_ms"), "max_ms": phase.get("max_ms"),
                            "cores": phase.get("cpu_cores"), "phase_us_per_request": phase.get("cpu_us_per_request"),
                            "cp_p50": get_path(phase, "checkpoints", "duration_ms_p50"),
                            "cp_p99": get_path(phase, "checkpoints", "duration_ms_p99"),
                            "cp_every_ms": get_path(phase, "checkpoints", "between_completions_ms_p50")})
    return sorted(out, key=lambda x: (x["system"], -x["interval_ms"], x["rate"] or 0, x["round"]))


HEAD = ("| interval ms | sustained req/s | CPU µs/req (backlog) | checkpoint ms p50/p99 (backlog) "
        "| latency phase req/s | p50 ms | p99 ms | max ms | cores | CPU µs/req | checkpoint ms p50/p99 "
        "| completed every ms |")
RULE = "|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|"


def _line(x: dict[str, Any], interval: str) -> str:
    return (f"| {interval} | {_num(x['sustained_rps'])} | {_num(x['cpu_us_per_request'])} "
            f"| {_num(x['backlog_cp_p50'])} / {_num(x['backlog_cp_p99'])} | {_num(x['rate'])} "
            f"| {_num(x['p50_ms'])} | {_num(x['p99_ms'])} | {_num(x['max_ms'])} | {_num(x['cores'], '{:.2f}')} "
            f"| {_num(x['phase_us_per_request'])} | {_num(x['cp_p50'])} / {_num(x['cp_p99'])} "
            f"| {_num(x['cp_every_ms'])} |")


def markdown(results: Sequence[dict[str, Any]]) -> str:
    table = rows(results)
    groups: dict[tuple[str, int, float | None], list[dict[str, Any]]] = {}
    for x in table:
        groups.setdefault((x["system"], x["interval_ms"], x["rate"]), []).append(x)
    lines = ["Medians over the runs of each interval (the runs below):", "", HEAD, RULE]
    for (system, interval, _rate), xs in groups.items():
        med = {k: _median(x[k] for x in xs) if isinstance(xs[0][k], (int, float)) or xs[0][k] is None else xs[0][k]
               for k in xs[0]}
        lines.append(_line(med, f"{interval} ({system}, {len(xs)} run{'s' if len(xs) > 1 else ''})"))
    lines += ["", "Each run:", "", HEAD.replace("| interval ms |", "| interval ms, round, load at start, exact |"),
              RULE]
    for x in table:
        load = "n/a" if not x["load"] else f"{x['load'][0]:.1f}"
        lines.append(_line(x, f"{x['interval_ms']}, #{x['round']}, {load}, {x['exact']}"))
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.phases", description=__doc__.splitlines()[0])
    parser.add_argument("results", nargs="+", type=Path, help="bench.run results JSON files")
    parser.add_argument("--out", type=Path, help="write the markdown here too")
    args = parser.parse_args(argv)
    text = markdown([json.loads(p.read_text()) for p in args.results])
    if args.out:
        args.out.write_text(text)
    print(text, end="")  # noqa: T201 - the table is the command's output
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
