"""Run the benchmark: ``python -m bench.run [--quick] [--systems a,b] [--backlog N] ...``.

One local Kafka broker (started here, from the jars `make jars` fetched), one seeded dataset, then:

1. the broker is warmed up (transactions of the ceiling's records written and read back
   read_committed, in rounds, until its CPU per record stops falling), so that its JIT
   warm-up falls in no system's counted window;
2. the latency floor: records produced at the latency phase's highest rate straight to a topic
   the watcher reads, no system in between;
3. every system ``--repeats`` times, interleaved (A B C, A B C, ...; bench/stats.py). Each run:
   its input topic is loaded with the backlog, a read_committed watcher (a process of its own,
   bench/watch.py) reads its output topics, the system is launched, throughput is taken from the
   watcher's clock until the whole backlog's output is visible; then the latency phase (the next
   records produced live, from a process of its own, at 80% of that sustained rate, and each
   request's produce -> first visible output time); after a settle time, its metrics are read,
   it is stopped, what the watcher read is compared with the expected output, its topics are
   deleted;
4. the in-process engines (bench/engines.py), in a process of their own, the broker stopped.

Meanwhile a sampler records CPU seconds and peak RSS of every process of the system, of the
broker, and of the harness (this process, the watcher, the live producer). Results:
bench/results/<date>[-quick].json and .png, and the markdown table on stdout and in
bench/results/latest.md.
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime as dt
import json
import logging
import math
import os
import shlex
import shutil
import subprocess
import sys
import tempfile
import time
import traceback
import uuid
from pathlib import Path
from typing import Any

from confluent_kafka import Producer

from bench import checkpoints, report, stats
from bench.checkpoints import epoch_ms
from bench.dataset import Dataset, DatasetSpec, build, load
from bench.feeds import DatasetFeed, Feed, IndexFeed
from bench.measure import ProcSampler, git_info, machine_info, percentile, sustained_rate
from bench.systems import ALL, QUICK, Context, FlinkSystem, System, delete_topics, ensure_redis_server, make
from bench.watch import CommitClock, LiveProducer, Watcher, produce_live
from harness.local_kafka import LocalBroker
from harness.ports import free_port
from operators.metric_names import KEYS_HELD
from ops import kafka_io
from settings import REPO_ROOT

logger = logging.getLogger("bench")

MODES: dict[str, dict[str, Any]] = {
    # quick: checks the harness and gives rough numbers in about 10 minutes (the job's figures
    # there include most of its warm-up: see bench/README.md, "How long a backlog")
    "quick": {"backlog": 300_000, "ceiling_backlog": 1_000_000, "repeats": 2, "live_s": 5.0,
              "max_live_rate": 10_000, "backlog_timeout_s": 300.0},
    "full": {"backlog": 1_200_000, "ceiling_backlog": 5_000_000, "repeats": 3, "live_s": 30.0,
             "max_live_rate": 25_000, "backlog_timeout_s": 1800.0},
}


@dataclasses.dataclass(frozen=True)
class WarmUp:
    """The broker's warm-up: ``records`` per round in transactions of ``transaction``, at least
    ``min_rounds`` and at most ``max_rounds`` rounds, until a round's broker CPU per record is
    within ``tolerance`` of the round before."""

    records: int = 100_000
    transaction: int = 10_000
    min_rounds: int = 3
    max_rounds: int = 8
    tolerance: float = 0.1


WARMUP = WarmUp()
#: seconds of doing nothing after the warm-up, to measure the broker's idle CPU
IDLE_S = 4.0
#: the parts of the backlog's output rates are taken over (shares of it, bench.measure.sustained_rate):
#: "sustained" is the second half, once the system is warm
RATE_WINDOWS = {"second_half": (0.5, 1.0), "first_half": (0.0, 0.5), "whole": (0.0, 1.0)}
#: commit intervals the second half must span for a sustained rate that holds
MIN_INTERVALS = 3

_T0 = time.monotonic()


def say(text: str) -> None:
    print(f"[bench {time.monotonic() - _T0:6.1f}s] {text}", flush=True)  # noqa: T201 - progress


def mark(sampler: ProcSampler, run: str, name: str) -> None:
    """One mark of the system's processes, the broker's and the harness's."""
    sampler.mark(run, name)
    sampler.mark("broker", f"{run}:{name}")
    sampler.mark("harness", f"{run}:{name}")


def warm_up(ctx: Context, ds: Dataset, sampler: ProcSampler) -> dict[str, Any]:
    """Transactions written and read back read_committed, round after round, until the broker's
    CPU per record stops falling (its JIT compiled the paths every system uses)."""
    w = WARMUP
    topic = f"bench{ctx.run_id}.warmup"
    kafka_io.create_topics({"bootstrap.servers": ctx.bootstrap}, [topic], ctx.partitions)
    feed = IndexFeed(ds, backlog=w.records * w.max_rounds, live_pool=0)
    watcher = Watcher(ctx.bootstrap, [topic], feed.tally())
    sampler.watch("harness", watcher.pid, recursive=False)
    prod = Producer({"bootstrap.servers": ctx.bootstrap, "transactional.id": f"bench-warmup-{uuid.uuid4().hex[:8]}",
                     "linger.ms": "5", "queue.buffering.max.messages": "1000000"})
    prod.init_transactions(30)
    rounds: list[dict[str, float]] = []
    try:
        for k in range(w.max_rounds):
            sampler.mark("broker", f"warmup{k}:start")
            t0 = time.monotonic()
            lo = k * w.records
            for start in range(lo, lo + w.records, w.transaction):
                prod.begin_transaction()
                for value, key, partition in feed.records(start, start + w.transaction):
                    while True:
                        try:
                            prod.produce(topic, value=value, key=key, partition=partition)
                            break
                        except BufferError:
                            prod.poll(0.01)
                prod.commit_transaction(60)
            watcher.wait_for(lo + w.records, 120)
            sampler.mark("broker", f"warmup{k}:end")
            cpu = sum(sampler.cpu_between("broker", f"warmup{k}:start", f"warmup{k}:end").values())
            rounds.append({"broker_us_per_record": cpu / w.records * 1e6, "s": time.monotonic() - t0})
            if k + 1 >= w.min_rounds:
                a, b = rounds[-2]["broker_us_per_record"], rounds[-1]["broker_us_per_record"]
                if a and abs(b - a) <= w.tolerance * a:
                    break
        # and what the broker spends doing nothing (its timers, the watcher's empty fetches)
        sampler.mark("broker", "idle:start")
        time.sleep(IDLE_S)
        sampler.mark("broker", "idle:end")
        idle = sum(sampler.cpu_between("broker", "idle:start", "idle:end").values()) / IDLE_S
    finally:
        watcher.stop()
        delete_topics(ctx.bootstrap, [topic])
    return {**dataclasses.asdict(w), "rounds": rounds, "settled": len(rounds) < w.max_rounds,
            "broker_idle_cpu_per_s": idle}


def latency_floor(ctx: Context, ds: Dataset, sampler: ProcSampler, rate: float, seconds: float,
                  name: str = "floor") -> dict[str, Any]:
    """Produce -> visible with no system in between (the live producer, the broker, the
    watcher): the harness's and the broker's own share of every latency figure; and the broker's
    CPU per record at that rate."""
    topic = f"bench{ctx.run_id}.{name}"
    kafka_io.create_topics({"bootstrap.servers": ctx.bootstrap}, [topic], ctx.partitions)
    count = max(1, int(rate * seconds))
    feed = IndexFeed(ds, backlog=0, live_pool=count)
    watcher = Watcher(ctx.bootstrap, [topic], feed.tally())
    try:
        producer = LiveProducer(ctx.bootstrap, topic, list(feed.records(0, count)), rate,
                                prime_topic=ctx.prime_topic)
        for pid in (watcher.pid, producer.pid):
            sampler.watch("harness", pid, recursive=False)
        watcher.live()
        sampler.mark("broker", f"{name}:start")
        produce_live(producer, watcher, seconds * 3 + 60)
        watcher.wait_for(count, 30)
        sampler.mark("broker", f"{name}:end")
    finally:
        watcher.stop()
        delete_topics(ctx.bootstrap, [topic])
    lat = latencies(producer.times, watcher.first_seen, feed, 0)
    broker = sum(sampler.cpu_between("broker", f"{name}:start", f"{name}:end").values())
    return {"rate": producer.achieved, "target_rps": rate, "requests": count, "seen": len(lat),
            "p50_ms": percentile(lat, 50), "p99_ms": percentile(lat, 99), "max_ms": lat[-1] if lat else None,
            "broker_us_per_record": broker / count * 1e6 if broker else None,
            "producer_errors": producer.errors[:3], "watcher_error": watcher.error}


def latencies(times: Any, first_seen: dict[Any, float], feed: Feed, start: int) -> list[float]:
    """Sorted ms from each live record's produce() to its first output read."""
    out = []
    for i, t_sent in enumerate(times):
        seen = first_seen.get(feed.ident(start + i))
        if seen is not None:
            out.append((seen - t_sent) * 1000)
    out.sort()
    return out


def run_system(system: System, ctx: Context, feed: Feed, args: argparse.Namespace,
               sampler: ProcSampler, rnd: int = 0) -> dict[str, Any]:
    key = system.key
    run = f"{key}#{rnd}"
    n = feed.backlog
    r: dict[str, Any] = {"key": key, "round": rnd, "title": system.title, "guarantee": system.guarantee,
                         "exactly_once": system.exactly_once, "input_format": system.input_format,
                         "notes": system.notes, "run_notes": [], "status": "ok"}
    system.prepare(ctx)
    t = time.monotonic()
    load(ctx.bootstrap, system.input_topic, feed.records(0, n))
    r["load_s"] = round(time.monotonic() - t, 2)
    say(f"{run}: loaded {n:,} records into {system.input_topic} in {r['load_s']} s; starting {system.title}")
    watcher = Watcher(ctx.bootstrap, system.output_topics, system.tally(feed))
    sampler.watch("harness", watcher.pid, recursive=False)
    clock = CommitClock(ctx.bootstrap, system.output_topics)
    mark(sampler, run, "start")
    live_count = 0
    phases: list[tuple[dict[str, Any], LiveProducer, int]] = []
    cp_log: checkpoints.CheckpointLog | None = None
    t_launch = time.monotonic()
    try:
        clock.start()
        system.start(ctx)
        for proc in system.procs:
            sampler.watch(run, proc.pid)
        system.wait_ready(timeout_s=240)
        t_ready = time.monotonic()
        mark(sampler, run, "ready")
        if isinstance(system, FlinkSystem):
            cp_log = checkpoints.CheckpointLog(system.checkpoint_history, interval_s=args.checkpoint_poll_s)
            cp_log.start()
        r["startup_s"] = round(t_ready - t_launch, 2)
        idle_s = max(10.0, 4 * ctx.checkpoint_ms / 1000 + 2)
        outcome = watcher.wait_for(feed.outputs(n), args.backlog_timeout_s, system.alive, idle_s)
        backlog_outputs = feed.outputs(n) if outcome == "complete" else watcher.count
        t_marked = time.monotonic()
        mark(sampler, run, "backlog")
        clock.stop()
        r["window_s"] = round(t_marked - t_ready, 3)
        first = watcher.first_time()
        r["first_output_s"] = round(first - t_launch, 2) if first else None
        if outcome == "idle":
            r["status"] = "output differs"
            r["run_notes"] = [*r["run_notes"], f"backlog output stopped at {watcher.count:,} records, "
                          f"{feed.outputs(n):,} expected: rates are over what it wrote; see exact"]
        if outcome not in ("complete", "idle"):
            r["status"] = outcome
            r["error"] = (f"{watcher.count:,} of {feed.outputs(n):,} backlog outputs seen after "
                          f"{t_marked - t_launch:.0f} s; {watcher.error or ''}\n{system.failure()}")
            say(f"{run}: {r['status']}: {r['error'].splitlines()[0]}")
        else:
            t_done = watcher.time_reaching(backlog_outputs) or t_marked
            # the rate from when the broker made the output stable, not from when the watcher got
            # to it (bench.watch.CommitClock); the watcher's times if the clock failed
            timed = clock.batches if clock.error is None and clock.batches else watcher.batches
            r["rate_source"] = "last stable offsets" if timed is clock.batches else "watcher reads"
            if clock.error:
                r["run_notes"] = [*r["run_notes"],
                                  f"the commit clock failed ({clock.error}): rates from the watcher's reads"]
            rates = {part: sustained_rate(timed, backlog_outputs, n, system.exactly_once, window)
                     for part, window in RATE_WINDOWS.items()}
            rate = rates["second_half"]
            r["backlog"] = {
                "requests": n, "outputs": backlog_outputs, "outputs_expected": feed.outputs(n),
                "sustained_rps": rate["rate"], "intervals": rate["intervals"],
                "first_half_rps": rates["first_half"]["rate"], "whole_rps": rates["whole"]["rate"],
                "first_to_last_rps": rate["first_to_last"],
                "span_s": rate["span_s"], "bursts": rate["bursts"],
                "first_burst_outputs": rate.get("first_burst_outputs"),
                "done_s": round(t_done - t_launch, 2),
                "with_startup_rps": n / (t_done - t_launch),
                "burst_ends": [(round(t - t_launch, 3), c) for t, c in rate.get("burst_ends", [])][:300],
            }
            if system.exactly_once and rate["rate"] is not None and rate["intervals"] < MIN_INTERVALS:
                r["run_notes"] = [*r["run_notes"], f"the second half of the backlog spanned {rate['intervals']} commit "
                              f"interval(s), fewer than {MIN_INTERVALS}: use a larger --backlog"]
            counted = rate.get("counted")
            whole = rates["whole"]
            for what, value, window in (("over the whole backlog", whole["rate"], whole.get("counted")),
                                        ("from first to last visible output", rate["first_to_last"], None)):
                if rate["rate"] is None and value is not None:
                    rate["rate"] = r["backlog"]["sustained_rps"] = value
                    counted = window
                    r["run_notes"] = [*r["run_notes"], f"sustained rate taken {what} ({rate['bursts']} bursts): "
                                      "it includes the warm-up; use a larger --backlog"]
            if counted:
                r["counted"] = {"t0": counted[0], "t1": counted[1], "requests": counted[2],
                                "from_s": round(counted[0] - t_launch, 2), "to_s": round(counted[1] - t_launch, 2)}
            if rate["rate"] is None:
                r["run_notes"] = [*r["run_notes"], f"backlog output became visible in {rate['bursts']} burst(s) "
                              "over too short a time to give a sustained rate: use a larger --backlog"]
            base_rate = rate["rate"] or n / max(0.5, t_done - (first or t_launch))
            targets = args.live_rates or [min(args.max_live_rate, args.live_fraction * base_rate)]
            say(f"{run}: backlog done {t_done - t_launch:.1f} s after launch (sustained {_fmt(rate['rate'])} req/s)")
            for k, target in enumerate(targets):
                count = min(args.live_pool - live_count, max(1, int(target * args.live_s)))
                if count <= 0:
                    break
                say(f"{run}: latency phase {k + 1} of {len(targets)}: {count:,} requests at {target:,.0f}/s")
                start = n + live_count
                if k == 0:
                    watcher.live()
                producer = LiveProducer(ctx.bootstrap, system.input_topic, list(feed.records(start, start + count)),
                                        target, prime_topic=ctx.prime_topic)
                sampler.watch("harness", producer.pid, recursive=False)
                mark(sampler, run, f"live{k}:start")
                t_phase = time.monotonic()
                produce_live(producer, watcher, args.live_s * 3 + 60)
                live_count += count
                live_outcome = watcher.wait_for(feed.outputs(n + live_count), args.live_s + 60, system.alive,
                                                idle_s)
                mark(sampler, run, f"live{k}:end")
                phase = {"target_rps": target, "achieved_rps": producer.achieved, "requests": count,
                         "outcome": live_outcome, "producer_errors": producer.errors[:3],
                         "window_s": round(time.monotonic() - t_phase, 2), "loadavg_at_end": os.getloadavg(),
                         "epoch_ms": (epoch_ms(t_phase), epoch_ms(time.monotonic()))}
                phases.append((phase, producer, start))
                if live_outcome not in ("complete", "idle"):
                    r["status"] = f"latency phase: {live_outcome}"
                    break
                if live_outcome == "idle":
                    r["status"] = "output differs"
                    break
        settled = time.monotonic() + ctx.checkpoint_ms / 1000 + 1.5  # anything extra is visible by then
        r["system_metrics"] = system.metrics(n + live_count)
        time.sleep(max(0.0, settled - time.monotonic()))
        watcher.drain()
        mark(sampler, run, "end")
    except Exception as exc:  # noqa: BLE001 - one system failing must not lose the others' results
        r["status"] = "error"
        r["error"] = f"{type(exc).__name__}: {exc}\n{traceback.format_exc()}\n{system.failure()}"
        say(f"{run}: ERROR {type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}")
    finally:
        clock.stop()
        if cp_log is not None:
            cp_log.stop()
        system.stop()
        sampler.unwatch(run)
        watcher.stop()
    if watcher.error and r["status"] == "ok":
        r["status"], r["error"] = "watcher failed", watcher.error
    for k, (phase, producer, start) in enumerate(phases):
        lat = latencies(producer.times, watcher.first_seen, feed, start)
        cpu = _sum(sampler.cpu_between(run, f"live{k}:start", f"live{k}:end"))
        phase.update(seen=len(lat), p50_ms=percentile(lat, 50), p99_ms=percentile(lat, 99),
                     max_ms=lat[-1] if lat else None, cpu_s=cpu,
                     cpu_cores=cpu / phase["window_s"] if phase["window_s"] else None,
                     cpu_us_per_request=cpu / phase["requests"] * 1e6 if phase["requests"] else None,
                     checkpoints=checkpoints.summarize(cp_log, *phase.pop("epoch_ms")))
    if phases:
        r["latency"] = phases[0][0]
        r["latency_phases"] = [phase for phase, _, _ in phases]
    if cp_log is not None:
        counted_window = r.get("counted")
        if counted_window:
            r["backlog_checkpoints"] = checkpoints.summarize(
                cp_log, epoch_ms(counted_window["t0"]), epoch_ms(counted_window["t1"]))
        r["checkpoints_seen"] = {"completed": len(cp_log.completed()), "failed": len(cp_log.failed()),
                                 "poll_errors": cp_log.errors}
    after = system.after_stop()
    r["after_stop"] = after
    counted = r.get("counted")
    r["cpu"] = cpu_summary(sampler, run, n, counted)
    r["broker"] = window_cpu(sampler, "broker", run, n, counted)
    r["harness"] = window_cpu(sampler, "harness", run, n, counted)
    if counted and args.broker_idle_cpu_per_s:
        idle = args.broker_idle_cpu_per_s * (counted["t1"] - counted["t0"])
        r["broker"]["idle_us_per_request"] = idle / counted["requests"] * 1e6
    processed = n + live_count
    r["state"] = state_summary(r, after, feed.keys(processed), evicting=feed.evicting)
    r["exactness"] = feed.exactness(watcher.tally, processed).as_dict()
    r["exactness"]["requests"] = processed
    try:
        system.cleanup(ctx)
    except Exception as exc:  # noqa: BLE001 - leftover topics only cost disk
        logger.warning("deleting %s's topics: %s", run, exc)
    return r


def per_request(sampler: ProcSampler, group: str, counted: dict[str, Any] | None) -> float | None:
    """``group``'s CPU µs per request over the time the sustained rate was counted over."""
    if not counted or not counted["requests"]:
        return None
    cpu = sampler.cpu_in(group, counted["t0"], counted["t1"])
    return None if cpu is None else cpu / counted["requests"] * 1e6


def window_cpu(sampler: ProcSampler, group: str, run: str, n: int, counted: dict[str, Any] | None) -> dict[str, Any]:
    """A shared group's (the broker's, the harness's) CPU per request over the system's counted
    window (that of its sustained rate), its CPU from ready to the backlog's end, and over the run."""
    backlog = _sum(sampler.cpu_between(group, f"{run}:ready", f"{run}:backlog"))
    return {"cpu_s": _sum(sampler.cpu_between(group, f"{run}:start", f"{run}:end")), "cpu_s_backlog": backlog,
            "us_per_request": per_request(sampler, group, counted),
            "us_per_request_backlog": backlog / n * 1e6 if backlog and n else None}


def cpu_summary(sampler: ProcSampler, key: str, n: int, counted: dict[str, Any] | None = None) -> dict[str, Any]:
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
        "cpu_us_per_request": per_request(sampler, key, counted),
        "cpu_us_per_request_backlog": cpu_backlog / n * 1e6 if cpu_backlog else None,
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


def _rates(text: str) -> list[float]:
    rates = [float(part) for part in text.split(",") if part.strip()]
    if not rates or min(rates) <= 0:
        raise argparse.ArgumentTypeError("give one or more positive rates, comma-separated")
    return rates


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m bench.run", description="notify-dedup against its peers, side by side")
    p.add_argument("--quick", action="store_true", help="smaller backlogs, short phases, fewer repeats")
    p.add_argument("--systems", help=f"comma-separated subset of {','.join(ALL)} "
                   f"(default: all; quick: {','.join(QUICK)})")
    p.add_argument("--repeats", type=int, help="runs of each system, interleaved (quick 2, full 3)")
    p.add_argument("--backlog", type=int, help="requests loaded before each system starts")
    p.add_argument("--ceiling-backlog", type=int, help="records loaded before the ceiling starts "
                   "(it runs several times faster than the job: a longer backlog for as many commit intervals)")
    p.add_argument("--live-s", type=float, help="length of the latency phase (and of the latency floor)")
    p.add_argument("--max-live-rate", type=int, help="cap of the latency phase's produce rate "
                   "(the latency floor is measured at it)")
    p.add_argument("--live-fraction", type=float, default=0.8,
                   help="latency phase rate as a fraction of the system's sustained rate")
    p.add_argument("--live-rates", type=_rates, metavar="R1,R2,...",
                   help="latency phases at these fixed produce rates, one after another (instead of one "
                        "at --live-fraction of the sustained rate): each with its latency, CPU and checkpoints")
    p.add_argument("--checkpoint-poll-s", type=float, default=0.2,
                   help="how often the Flink systems' checkpoint history is read (REST keeps the last 10)")
    p.add_argument("--backlog-timeout-s", type=float)
    p.add_argument("--checkpoint-ms", type=int, default=2000,
                   help="checkpoint interval of the Flink systems and Quix's commit interval")
    p.add_argument("--partitions", type=int, default=4)
    p.add_argument("--seed", type=int, default=7)
    p.add_argument("--param-bytes", type=int, default=240, help="240: about 300-byte Avro requests")
    p.add_argument("--ttl-mix", action="store_true",
                   help="per-request windows of 2 s .. 1 h instead of 7 days (see bench/dataset.py)")
    p.add_argument("--sql-variant", choices=("rownumber", "over"), default="rownumber")
    p.add_argument("--no-engines", action="store_true", help="skip the in-process engines (bench/engines.py)")
    p.add_argument("--no-warmup", action="store_true", help="skip the broker's warm-up (figures of the "
                   "first runs then include its JIT compiling)")
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
    if args.live_rates:
        args.max_live_rate = max(args.max_live_rate, *args.live_rates)
        args.live_pool = sum(int(math.ceil(rate * args.live_s)) for rate in args.live_rates)
    else:
        args.live_pool = int(math.ceil(args.max_live_rate * args.live_s))
    args.broker_idle_cpu_per_s = None  # measured by the warm-up
    return args


def feed_for(system: System, ds: Dataset, args: argparse.Namespace) -> Feed:
    if system.input_format == "index":
        return IndexFeed(ds, backlog=args.ceiling_backlog, live_pool=args.live_pool)
    return DatasetFeed(ds, system.input_format, evicting=ds.spec.ttl_mix)


def run_engines(args: argparse.Namespace, work: Path) -> dict[str, Any]:
    out = work / "engines.json"
    cmd = [sys.executable, "-m", "bench.engines", "--json", str(out)] + (["--quick"] if args.quick else [])
    try:
        done = subprocess.run(cmd, cwd=REPO_ROOT, capture_output=True, text=True, timeout=1200)
    except subprocess.TimeoutExpired:
        return {"error": "bench.engines did not finish in 20 minutes"}
    if done.returncode != 0 or not out.exists():
        return {"error": f"bench.engines exited {done.returncode}: {done.stderr[-1500:]}"}
    return dict(json.loads(out.read_text()))


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(levelname)s %(name)s %(message)s")
    started = dt.datetime.now().astimezone()
    keys = list(dict.fromkeys(k.strip() for k in args.systems.split(",") if k.strip()))
    for k in keys:
        make(k, args.sql_variant)  # an unknown key fails here, before anything starts
    order = stats.schedule(keys, args.repeats)
    results: dict[str, Any] = {
        "started_at": started.isoformat(timespec="seconds"), "mode": args.mode,
        "command": " ".join(shlex.quote(a) for a in
                            [Path(sys.executable).name, "-m", "bench.run", *(argv or sys.argv[1:])]),
        "machine": machine_info(), "git": git_info(REPO_ROOT), "checkpoint_ms": args.checkpoint_ms,
        "live_s": args.live_s,
        "live_rates": args.live_rates, "max_live_rate": args.max_live_rate, "live_fraction": args.live_fraction,
        "repeats": args.repeats, "order": [f"{k}#{r}" for r, k in order],
        "ceiling_backlog": args.ceiling_backlog if "ceiling" in keys else None,
        "runs": [], "systems": [],
    }
    skipped: dict[str, str] = {}
    if "redis" in keys and ensure_redis_server(say) is None:
        skipped["redis"] = "redis-server not installed"
    work = Path(args.work) if args.work else Path(tempfile.mkdtemp(prefix="notify-dedup-bench-"))
    work.mkdir(parents=True, exist_ok=True)
    say(f"{args.mode} mode; systems {', '.join(keys)}, {args.repeats} round(s); work dir {work}")
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
                  checkpoint_ms=args.checkpoint_ms, prime_topic=f"bench{run_id}.prime")
    try:
        kafka_io.create_topics({"bootstrap.servers": ctx.bootstrap}, [ctx.prime_topic], 1)
        if not args.no_warmup:
            results["warmup"] = warm_up(ctx, ds, sampler)
            args.broker_idle_cpu_per_s = results["warmup"]["broker_idle_cpu_per_s"]
            say("broker warm-up: " + ", ".join(f"{w['broker_us_per_record']:.1f}"
                                               for w in results["warmup"]["rounds"])
                + f" broker µs per record in rounds of {WARMUP.records:,}; idle "
                f"{results['warmup']['broker_idle_cpu_per_s'] * 1000:.0f} ms CPU per s")
        if not args.no_warmup:  # the same path once before, so that its JIT warm-up is not in the floor
            results["warmup"]["floor"] = latency_floor(ctx, ds, sampler, args.max_live_rate, args.live_s, "floor0")
        floor = results["latency_floor"] = latency_floor(ctx, ds, sampler, args.max_live_rate, args.live_s)
        say(f"latency floor (produce -> read_committed watcher, no system in between, "
            f"{floor['rate']:,.0f}/s): p50 {_fmt(floor['p50_ms'])} ms, p99 {_fmt(floor['p99_ms'])} ms; "
            f"broker {_fmt(floor['broker_us_per_record'])} µs per record")
        for rnd, key in order:
            system = make(key, args.sql_variant)
            if key in skipped:
                results["runs"].append({"key": key, "round": rnd, "title": system.title, "status": "skipped",
                                        "guarantee": system.guarantee, "exactly_once": system.exactly_once,
                                        "error": skipped[key]})
                continue
            run_ctx = dataclasses.replace(ctx, run_id=f"{run_id}r{rnd}", work=work / f"r{rnd}")
            try:
                r = run_system(system, run_ctx, feed_for(system, ds, args), args, sampler, rnd)
            except Exception as exc:  # noqa: BLE001 - e.g. its topics could not be made or loaded
                say(f"{key}#{rnd}: ERROR {type(exc).__name__}: {exc}")
                r = {"key": key, "round": rnd, "title": system.title, "guarantee": system.guarantee,
                     "exactly_once": system.exactly_once, "status": "error",
                     "error": f"{type(exc).__name__}: {exc}\n{traceback.format_exc()}"}
            results["runs"].append(r)
            ex = r.get("exactness") or {}
            say(f"{key}#{rnd}: {r['status']}; "
                f"sustained {_fmt(stats.get_path(r, 'backlog', 'sustained_rps'))} req/s, "
                f"p99 {_fmt(stats.get_path(r, 'latency', 'p99_ms'))} ms, "
                f"CPU {_fmt(stats.get_path(r, 'cpu', 'cpu_us_per_request'))} µs/req, "
                f"broker {_fmt(stats.get_path(r, 'broker', 'us_per_request'))} µs/req, exact: {ex.get('exact')} "
                f"(missing {ex.get('missing')}, unexpected {ex.get('unexpected')})")
        sampler.stop()
        broker.stop(timeout_s=10)
        if not args.no_engines:
            say("in-process engines (bench/engines.py), the broker stopped")
            results["engines"] = run_engines(args, work)
    finally:
        sampler.stop()
        broker.stop(timeout_s=10)
        results["harness_peak_rss_mb"] = {
            "this process": round(max((p.rss_peak for p in sampler.processes("harness") if p.pid == os.getpid()),
                                      default=0) / 2**20, 1),
            "largest watcher or producer": round(max((p.rss_peak for p in sampler.processes("harness")
                                                      if p.pid != os.getpid()), default=0) / 2**20, 1)}
        results["systems"] = stats.summarize(results["runs"])
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
    # a peer whose output differs from the model is a result; a harness failure, an inexact job or
    # an inexact ceiling is not
    bad = sorted({f"{r['key']}#{r.get('round', 0)}" for r in results["runs"]
                  if r.get("status") not in ("ok", "skipped", "output differs")
                  or (r["key"].startswith("job-") or r["key"] == "ceiling")
                  and not (r.get("exactness") or {}).get("exact")})
    if bad:
        say(f"FAILED: {', '.join(bad)} (see the errors above and in the JSON)")
    return 1 if bad else 0


if __name__ == "__main__":
    raise SystemExit(main())
