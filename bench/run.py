"""Run the benchmark: ``python -m bench.run [--quick] [--systems a,b] [--backlog N] ...``.

One local Kafka broker (started here, from the jars `make jars` fetched), one seeded dataset, and
each system in turn:

1. its input topic is loaded with the backlog (the same records, partitions and order for every
   system; Avro, or the JSON copy for the Flink SQL peer), and a read_committed watcher starts
   reading its output topics;
2. the system is launched; throughput is taken from the watcher's clock until the whole backlog's
   output is visible (sustained, and including start-up);
3. latency phase: the next records of the stream are produced live at 80% of that sustained rate,
   and each request's produce -> first visible output time is recorded;
4. after a settle time (nothing more may appear), its metrics are read and it is stopped; what the
   watcher read is compared with the reference model's output for the records it was given.

Meanwhile a sampler records CPU seconds and peak RSS of every process of the system, of the
broker, and of this harness. Results: bench/results/<date>[-quick].json and .png, and the
markdown table on stdout and in bench/results/latest.md.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import logging
import math
import os
import shlex
import shutil
import sys
import tempfile
import time
import traceback
from pathlib import Path
from typing import Any

from confluent_kafka import Producer

from bench import report
from bench.dataset import Dataset, DatasetSpec, build, load
from bench.measure import (
    OutputWatcher,
    ProcSampler,
    compare,
    git_info,
    machine_info,
    percentile,
    sustained_rate,
)
from bench.systems import ALL, QUICK, Context, System, ensure_redis_server, make
from harness.local_kafka import LocalBroker
from harness.ports import free_port
from operators.metric_names import KEYS_HELD
from ops import kafka_io
from settings import REPO_ROOT

logger = logging.getLogger("bench")

MODES: dict[str, dict[str, Any]] = {
    # quick: checks the harness and gives rough numbers in under 5 minutes
    "quick": {"backlog": 150_000, "live_s": 5.0, "max_live_rate": 10_000, "backlog_timeout_s": 120.0},
    "full": {"backlog": 600_000, "live_s": 30.0, "max_live_rate": 25_000, "backlog_timeout_s": 1800.0},
}

_T0 = time.monotonic()


def say(text: str) -> None:
    print(f"[bench {time.monotonic() - _T0:6.1f}s] {text}", flush=True)  # noqa: T201 - progress


def live_phase(bootstrap: str, topic: str, ds: Dataset, fmt: str, start: int, count: int,
               rate: float) -> tuple[list[float], float]:
    """Produce records ``start .. start+count`` at ``rate``/s; returns each one's produce time."""
    values = ds.avro if fmt == "avro" else ds.json
    prod = Producer({"bootstrap.servers": bootstrap, "enable.idempotence": "true", "linger.ms": "1",
                     "queue.buffering.max.messages": "1000000"})
    times = [0.0] * count
    clock = time.monotonic
    t0 = clock()
    i = 0
    while i < count:
        due = min(count, int((clock() - t0) * rate) + 1)
        while i < due:
            j = start + i
            times[i] = clock()
            try:
                prod.produce(topic, value=values[j], key=ds.keys[j], partition=ds.partitions[j])
            except BufferError:
                prod.poll(0.01)
                continue
            i += 1
        prod.poll(0)
        delay = t0 + i / rate - clock()
        if delay > 0:
            time.sleep(min(delay, 0.005))
    elapsed = max(1e-6, clock() - t0)
    prod.flush(60)
    return times, count / elapsed


def latency_floor(ctx: Context, ds: Dataset, rate: float, seconds: float) -> dict[str, Any]:
    """Produce -> visible with no system in between: the harness's and broker's own share."""
    topic = f"bench{ctx.run_id}.floor"
    kafka_io.create_topics({"bootstrap.servers": ctx.bootstrap}, [topic], ctx.partitions)
    watcher = OutputWatcher(ctx.bootstrap, [topic],
                            lambda _t, v: ("f", json.loads(v or b"{}").get("notification_id", "")))
    watcher.start_and_wait()
    count = min(len(ds), max(1, int(rate * seconds)))
    times, achieved = live_phase(ctx.bootstrap, topic, ds, "json", 0, count, rate)
    watcher.wait_for(count, 30)
    watcher.stop()
    lat = sorted((watcher.first_seen[ds.nids[i]] - t) * 1000 for i, t in enumerate(times)
                 if ds.nids[i] in watcher.first_seen)
    return {"rate": achieved, "requests": count, "seen": len(lat), "p50_ms": percentile(lat, 50),
            "p99_ms": percentile(lat, 99)}


def run_system(system: System, ctx: Context, ds: Dataset, args: argparse.Namespace,
               sampler: ProcSampler) -> dict[str, Any]:
    key = system.key
    n = ds.spec.backlog
    r: dict[str, Any] = {"key": key, "title": system.title, "guarantee": system.guarantee,
                         "exactly_once": system.exactly_once, "input_format": system.input_format,
                         "notes": system.notes, "status": "ok"}
    system.prepare(ctx)
    t = time.monotonic()
    load(ctx.bootstrap, system.input_topic, ds, system.input_format, range(n))
    r["load_s"] = round(time.monotonic() - t, 2)
    say(f"{key}: loaded {n:,} records into {system.input_topic} in {r['load_s']} s; starting {system.title}")
    watcher = OutputWatcher(ctx.bootstrap, system.output_topics, system.parser())
    watcher.start_and_wait()
    for group in ("broker", "harness"):
        sampler.mark(group, f"{key}:start")
    live_count = 0
    t_launch = time.monotonic()
    try:
        system.start(ctx)
        for proc in system.procs:
            sampler.watch(key, proc.pid)
        system.wait_ready(timeout_s=240)
        t_ready = time.monotonic()
        sampler.mark(key, "ready")
        r["startup_s"] = round(t_ready - t_launch, 2)
        idle_s = max(10.0, 4 * ctx.checkpoint_ms / 1000 + 2)
        outcome = watcher.wait_for(ds.outputs_cum[n], args.backlog_timeout_s, system.alive, idle_s)
        backlog_outputs = ds.outputs_cum[n] if outcome == "complete" else watcher.count
        t_marked = time.monotonic()
        sampler.mark(key, "backlog")
        for group in ("broker", "harness"):
            sampler.mark(group, f"{key}:backlog")
        first = watcher.first_time()
        r["first_output_s"] = round(first - t_launch, 2) if first else None
        if outcome == "idle":
            r["status"] = "output differs"
            r["notes"] = [*r["notes"], f"backlog output stopped at {watcher.count:,} records, "
                          f"{ds.outputs_cum[n]:,} expected: rates are over what it wrote; see exact"]
        if outcome not in ("complete", "idle"):
            r["status"] = outcome
            r["error"] = (f"{watcher.count:,} of {ds.outputs_cum[n]:,} backlog outputs seen after "
                          f"{t_marked - t_launch:.0f} s; {watcher.error or ''}\n{system.failure()}")
            say(f"{key}: {r['status']}: {r['error'].splitlines()[0]}")
        else:
            t_done = watcher.time_reaching(backlog_outputs) or t_marked
            rate = sustained_rate(watcher.batches, backlog_outputs, n, bursty=system.exactly_once)
            r["backlog"] = {
                "requests": n, "outputs": backlog_outputs, "outputs_expected": ds.outputs_cum[n],
                "sustained_rps": rate["rate"], "first_to_last_rps": rate["first_to_last"],
                "span_s": rate["span_s"], "bursts": rate["bursts"],
                "first_burst_outputs": rate.get("first_burst_outputs"),
                "done_s": round(t_done - t_launch, 2),
                "with_startup_rps": n / (t_done - t_launch),
            }
            if rate["rate"] is None and rate["first_to_last"] is not None:
                rate["rate"] = rate["first_to_last"]
                r["backlog"]["sustained_rps"] = rate["rate"]
                r["notes"] = [*r["notes"], "sustained rate taken from first to last visible output "
                              f"({rate['bursts']} bursts): biased low; use a larger --backlog"]
            if rate["rate"] is None:
                r["notes"] = [*r["notes"], f"backlog output became visible in {rate['bursts']} burst(s) "
                              "over too short a time to give a sustained rate: use a larger --backlog"]
            base_rate = rate["rate"] or n / max(0.5, t_done - (first or t_launch))
            target = min(args.max_live_rate, args.live_fraction * base_rate)
            live_count = min(args.live_pool, max(1, int(target * args.live_s)))
            say(f"{key}: backlog done {t_done - t_launch:.1f} s after launch "
                f"(sustained {_fmt(rate['rate'])} req/s); "
                f"latency phase: {live_count:,} requests at {target:,.0f}/s")
            times, achieved = live_phase(ctx.bootstrap, system.input_topic, ds, system.input_format,
                                         n, live_count, target)
            live_outcome = watcher.wait_for(ds.outputs_cum[n + live_count], args.live_s + 60, system.alive,
                                            idle_s)
            lat = []
            for i, t_sent in enumerate(times):
                seen = watcher.first_seen.get(ds.nids[n + i])
                if seen is not None:
                    lat.append((seen - t_sent) * 1000)
            lat.sort()
            r["latency"] = {
                "target_rps": target, "achieved_rps": achieved, "requests": live_count, "seen": len(lat),
                "p50_ms": percentile(lat, 50), "p99_ms": percentile(lat, 99),
                "max_ms": lat[-1] if lat else None,
                "outcome": live_outcome,
            }
            if live_outcome not in ("complete", "idle"):
                r["status"] = f"latency phase: {live_outcome}"
            elif live_outcome == "idle":
                r["status"] = "output differs"
        settled = time.monotonic() + ctx.checkpoint_ms / 1000 + 1.5  # anything extra is visible by then
        r["system_metrics"] = system.metrics(n + live_count)
        time.sleep(max(0.0, settled - time.monotonic()))
        sampler.mark(key, "end")
        for group in ("broker", "harness"):
            sampler.mark(group, f"{key}:end")
    except Exception as exc:  # noqa: BLE001 - one system failing must not lose the others' results
        r["status"] = "error"
        r["error"] = f"{type(exc).__name__}: {exc}\n{traceback.format_exc()}\n{system.failure()}"
        say(f"{key}: ERROR {type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}")
    finally:
        system.stop()
        sampler.unwatch(key)
        watcher.stop()
    after = system.after_stop()
    r["after_stop"] = after
    r["cpu"] = cpu_summary(sampler, key, n)
    r["broker"] = {"cpu_s": _sum(sampler.cpu_between("broker", f"{key}:start", f"{key}:end")),
                   "cpu_s_backlog": _sum(sampler.cpu_between("broker", f"{key}:start", f"{key}:backlog"))}
    r["harness"] = {"cpu_s": _sum(sampler.cpu_between("harness", f"{key}:start", f"{key}:end"))}
    processed = n + live_count
    r["state"] = state_summary(r, after, ds.new_cum[processed], evicting=ds.spec.ttl_mix)
    r["exactness"] = compare(ds.expected_counter(processed), watcher.seen).as_dict()
    r["exactness"]["requests"] = processed
    return r


def cpu_summary(sampler: ProcSampler, key: str, n: int) -> dict[str, Any]:
    startup = sampler.cpu_between(key, None, "ready")
    backlog = sampler.cpu_between(key, "ready", "backlog")
    total = sampler.cpu_between(key, None, None)
    procs: list[dict[str, Any]] = []
    for p in sampler.processes(key):
        procs.append({"pid": p.pid, "name": p.name, "cmd": p.cmd, "cpu_s": round(total.get(p.pid, 0), 2),
                      "cpu_s_startup": round(startup.get(p.pid, 0), 2),
                      "cpu_s_backlog": round(backlog.get(p.pid, 0), 2),
                      "peak_rss_mb": round(p.rss_peak / 2**20, 1)})
    cpu_backlog = _sum(backlog)
    return {
        "processes": procs,
        "cpu_s": _sum(total), "cpu_s_startup": _sum(startup), "cpu_s_backlog": cpu_backlog,
        "cpu_us_per_request": cpu_backlog / n * 1e6 if cpu_backlog else None,
        "peak_rss_mb": round(sum(p["peak_rss_mb"] for p in procs), 1) if procs else None,
    }


def state_summary(r: dict[str, Any], after: dict[str, Any], keys_expected: int,
                  evicting: bool) -> dict[str, Any]:
    """State bytes over keys; ``keys_expected`` = accepted requests (exact unless ``evicting``)."""
    sm = r.get("system_metrics") or {}
    size = after.get("state_bytes")
    source = after.get("state_source")
    cp = sm.get("checkpoints") or {}
    if size is None and cp.get("latest_state_size"):
        size, source = cp["latest_state_size"], "latest completed checkpoint (full size)"
    keys_held = (sm.get("dedup_metrics") or {}).get(KEYS_HELD)
    out = {"bytes": size, "source": source, "keys": keys_expected,
           "bytes_per_key": size / keys_expected if size and keys_expected else None}
    if keys_held is not None:
        out["keys_held_reported"] = keys_held
        if not evicting:  # with 7-day windows nothing is evicted: every accepted key is held
            out["keys_held_matches_model"] = int(keys_held) == keys_expected
    return out


def _sum(values: dict[int, float]) -> float:
    return round(sum(values.values()), 2)


def _fmt(v: float | None) -> str:
    return "n/a" if v is None else f"{v:,.0f}"


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m bench.run", description="notify-dedup against its peers, side by side")
    p.add_argument("--quick", action="store_true", help="small dataset, short phases (under 5 minutes)")
    p.add_argument("--systems", help=f"comma-separated subset of {','.join(ALL)} "
                   f"(default: all; quick: {','.join(QUICK)})")
    p.add_argument("--backlog", type=int, help="requests loaded before each system starts")
    p.add_argument("--live-s", type=float, help="length of the latency phase")
    p.add_argument("--max-live-rate", type=int, help="cap of the latency phase's produce rate")
    p.add_argument("--live-fraction", type=float, default=0.8,
                   help="latency phase rate as a fraction of the system's sustained rate")
    p.add_argument("--backlog-timeout-s", type=float)
    p.add_argument("--checkpoint-ms", type=int, default=2000,
                   help="checkpoint interval of the Flink systems and Quix's commit interval")
    p.add_argument("--partitions", type=int, default=4)
    p.add_argument("--seed", type=int, default=7)
    p.add_argument("--param-bytes", type=int, default=240, help="240: about 300-byte Avro requests")
    p.add_argument("--ttl-mix", action="store_true",
                   help="per-request windows of 2 s .. 1 h instead of 7 days (see bench/dataset.py)")
    p.add_argument("--sql-variant", choices=("rownumber", "over"), default="rownumber")
    p.add_argument("--work", help="working directory (default: a fresh temporary one, removed after)")
    p.add_argument("--keep-work", action="store_true", help="keep logs, checkpoints and broker data")
    p.add_argument("--results-dir", default=str(report.RESULTS_DIR))
    args = p.parse_args(argv)
    args.mode = "quick" if args.quick else "full"
    if args.systems is None:
        args.systems = ",".join(QUICK if args.quick else ALL)
    for name, value in MODES[args.mode].items():
        if getattr(args, name, None) is None:
            setattr(args, name, value)
    args.live_pool = int(math.ceil(args.max_live_rate * args.live_s))
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(levelname)s %(name)s %(message)s")
    started = dt.datetime.now().astimezone()
    keys = [k.strip() for k in args.systems.split(",") if k.strip()]
    systems = [make(k, args.sql_variant) for k in keys]
    results: dict[str, Any] = {
        "started_at": started.isoformat(timespec="seconds"), "mode": args.mode,
        "command": " ".join(shlex.quote(a) for a in
                            [Path(sys.executable).name, "-m", "bench.run", *(argv or sys.argv[1:])]),
        "machine": machine_info(), "git": git_info(REPO_ROOT), "checkpoint_ms": args.checkpoint_ms,
        "live_s": args.live_s, "max_live_rate": args.max_live_rate, "live_fraction": args.live_fraction,
        "systems": [],
    }
    skipped: dict[str, str] = {}
    if "redis" in keys and ensure_redis_server(say) is None:
        skipped["redis"] = "redis-server not installed"
    work = Path(args.work) if args.work else Path(tempfile.mkdtemp(prefix="notify-dedup-bench-"))
    work.mkdir(parents=True, exist_ok=True)
    say(f"{args.mode} mode; systems {', '.join(keys)}; work dir {work}")
    spec = DatasetSpec(backlog=args.backlog, live_pool=args.live_pool, partitions=args.partitions,
                       seed=args.seed, param_bytes=args.param_bytes, ttl_mix=args.ttl_mix)
    ds = build(spec)
    results["dataset"] = ds.summary()
    say(f"dataset: {len(ds):,} records generated in {ds.generate_s:.1f} s "
        f"(backlog {spec.backlog:,}, live pool {spec.live_pool:,}), "
        f"{results['dataset']['mean_avro_bytes']:.0f} B Avro / "
        f"{results['dataset']['mean_json_bytes']:.0f} B JSON")
    broker = LocalBroker(home=work / "kafka", port=free_port(), controller_port=free_port(), heap_mb=1024)
    broker.start()
    say(f"broker on {broker.bootstrap}")
    sampler = ProcSampler()
    sampler.start()
    broker_pid = broker.pid()
    if broker_pid:
        sampler.watch("broker", broker_pid)
    sampler.watch("harness", os.getpid(), recursive=False)
    run_id = started.strftime("%H%M%S")
    ctx = Context(bootstrap=broker.bootstrap, work=work, run_id=run_id, partitions=args.partitions,
                  checkpoint_ms=args.checkpoint_ms)
    try:
        results["latency_floor"] = latency_floor(ctx, ds, rate=5000, seconds=3)
        say("latency floor (produce -> read_committed consumer, no system in between, 5,000/s): "
            f"p50 {_fmt(results['latency_floor']['p50_ms'])} ms, "
            f"p99 {_fmt(results['latency_floor']['p99_ms'])} ms")
        for system in systems:
            if system.key in skipped:
                results["systems"].append({"key": system.key, "title": system.title, "status": "skipped",
                                           "guarantee": system.guarantee, "exactly_once": system.exactly_once,
                                           "error": skipped[system.key]})
                continue
            try:
                r = run_system(system, ctx, ds, args, sampler)
            except Exception as exc:  # noqa: BLE001 - e.g. its topics could not be made or loaded
                say(f"{system.key}: ERROR {type(exc).__name__}: {exc}")
                r = {"key": system.key, "title": system.title, "guarantee": system.guarantee,
                     "exactly_once": system.exactly_once, "status": "error",
                     "error": f"{type(exc).__name__}: {exc}\n{traceback.format_exc()}",
                     "exactness": compare(ds.expected_counter(0), ds.expected_counter(0)).as_dict(),
                     "cpu": {"cpu_s_backlog": None}}
            results["systems"].append(r)
            ex = r["exactness"]
            say(f"{system.key}: {r['status']}; "
                f"sustained {_fmt((r.get('backlog') or {}).get('sustained_rps'))} req/s, "
                f"p99 {_fmt((r.get('latency') or {}).get('p99_ms'))} ms, "
                f"CPU {r['cpu']['cpu_s_backlog']} s, exact: {ex['exact']} "
                f"(missing {ex['missing']}, unexpected {ex['unexpected']})")
    finally:
        sampler.stop()
        broker.stop(timeout_s=10)
        results["machine"]["loadavg_at_end"] = os.getloadavg()
        results["wall_s"] = round(time.monotonic() - _T0, 1)
        stem = started.strftime("%Y-%m-%d") + ("-quick" if args.quick else "")
        out_dir = Path(args.results_dir)
        report.write_json(results, out_dir / f"{stem}.json")
        charted = report.chart(results, out_dir / f"{stem}.png")
        table = report.markdown(results)
        if charted:
            table += f"\n![chart]({stem}.png)\n"
        (out_dir / "latest.md").write_text(table)
        print(table, flush=True)  # noqa: T201 - the table is the command's output
        say(f"results: {out_dir / (stem + '.json')}" + (f", {out_dir / (stem + '.png')}" if charted else "")
            + f", {out_dir / 'latest.md'}; wall time {results['wall_s']} s")
        if args.keep_work or args.work:
            say(f"work dir kept: {work}")
        else:
            shutil.rmtree(work, ignore_errors=True)
    # a peer whose output differs from the model is a result; a harness failure or an inexact job is not
    bad = [r["key"] for r in results["systems"]
           if r.get("status") not in ("ok", "skipped", "output differs")
           or (r["key"].startswith("job-") and not (r.get("exactness") or {}).get("exact"))]
    if bad:
        say(f"FAILED: {', '.join(bad)} (see the errors above and in the JSON)")
    return 1 if bad else 0


if __name__ == "__main__":
    raise SystemExit(main())
