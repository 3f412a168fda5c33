"""The API's accept latency: ``python -m bench.api [--rates 1000,2000] [--seconds 30] [--processes N]
[--store sqlite|postgresql] [--brokers 3 --kill-at S] [--label NAME] [--profile]`` (``make bench``).

A local broker, a store (a SQLite file, or a local PostgreSQL server), and the API (``dedupctl api
run``, its own process or processes) on it; then, for each rate, a load generator in a process of
its own (``bench.api_load``) sends ``POST /v1/notifications`` open-loop at that rate over
keep-alive connections and times each request from when it was due to its answer (no
coordinated omission). Every request has its own Idempotency-Key and one of 1,000 users.

Per phase it reports what the caller saw (p50, p90, p99, p99.9, max, the statuses, the errors),
what the API's own ``/metrics`` saw in the same time (its accept latency, Kafka's acknowledgement,
the event loop's lag, the store's queue and calls, the reservations per store transaction, the
garbage collector's pauses), the CPU the API's processes and the broker used per request, and
the machine's load average (the figures of a shared machine are preliminary). ``--profile``
records each API process with py-spy during the phase (wall clock, idle included) and reports
what its threads were doing. Written to ``bench/results/api-<date>-<label>.json``. The
design's targets: p99 < 50 ms at 1,000/s, < 100 ms at 2,000/s, no errors.

``--brokers 3 --kill-at S`` runs on three local brokers (replication 3, min ISR 2) and SIGKILLs,
``S`` seconds into each phase, the node leading most of the requests topic's partitions; it is
started again once the cluster has fenced it. The phase reports when the node was fenced, so the
answers of the outage (503s past ``api.ack_timeout_ms``, or slow 202s) can be read against it.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from bench.measure import thread_comms, thread_cpu

REPO = Path(__file__).resolve().parent.parent
#: rate -> the p99 it must stay under (ms)
TARGETS_P99_MS = {1000.0: 50.0, 2000.0: 100.0}


def _parse_value(text: str) -> Any:
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        return text


def overrides(items: list[str]) -> dict[str, dict[str, Any]]:
    """``--set api.store_threads=8`` -> {"api": {"store_threads": 8}}."""
    out: dict[str, dict[str, Any]] = {}
    for item in items:
        key, sep, value = item.partition("=")
        section, dot, name = key.partition(".")
        if not sep or not dot:
            raise SystemExit(f"--set takes SECTION.KEY=VALUE, not {item!r}")
        out.setdefault(section, {})[name] = _parse_value(value)
    return out


class Processes:
    """The CPU seconds (user + system) of a process and its children, read by psutil."""

    def __init__(self, pid: int) -> None:
        import psutil

        self._root = psutil.Process(pid)

    def tree(self) -> list[Any]:
        import psutil

        try:
            return [self._root, *self._root.children(recursive=True)]
        except psutil.NoSuchProcess:
            return []

    def pids(self) -> list[int]:
        return [int(p.pid) for p in self.tree()]

    def serving(self) -> list[int]:
        """The processes that serve: the root alone, or under ``--processes`` its spawned ones
        (not multiprocessing's resource tracker)."""
        spawned = [int(p.pid) for p in self.tree()[1:] if "spawn_main" in " ".join(p.cmdline())]
        return spawned or [int(self._root.pid)]

    def cpu_s(self) -> float:
        import psutil

        total = 0.0
        for p in self.tree():
            try:
                t = p.cpu_times()
                total += t.user + t.system
            except psutil.NoSuchProcess:
                pass
        return total


def thread_names(pid: int) -> dict[int, str]:
    """OS thread id -> name: Python's threads by py-spy (their names), the others by /proc (the
    main thread is the event loop's; librdkafka names its own ``rdk:...``)."""
    names = {tid: "loop (main)" if tid == pid else comm for tid, comm in thread_comms(pid).items()}
    spy = shutil.which("py-spy") or str(Path(sys.executable).with_name("py-spy"))
    try:
        dump = subprocess.run([spy, "dump", "--pid", str(pid), "--json", "--nonblocking"], capture_output=True,
                              text=True, timeout=30)
        for t in json.loads(dump.stdout or "[]"):
            tid = t.get("os_thread_id")
            if tid and tid != pid and t.get("thread_name"):
                names[int(tid)] = str(t["thread_name"])
    except (OSError, subprocess.TimeoutExpired, json.JSONDecodeError):
        pass
    return names


def cpu_by_thread(pids: list[int], before: dict[int, dict[int, float]], n: int) -> dict[str, float]:
    """ms of CPU per request by thread name, summed over the processes."""
    out: dict[str, float] = {}
    for pid in pids:
        names = thread_names(pid)
        for tid, spent in thread_cpu(pid).items():
            name = names.get(tid, "?")
            name = "rdk (librdkafka)" if name.startswith("rdk:") else name
            name = "api-store (pool)" if name.startswith("api-store_") else name
            out[name] = out.get(name, 0.0) + (spent - before.get(pid, {}).get(tid, 0.0)) * 1000 / n
    return {k: round(v, 3) for k, v in sorted(out.items(), key=lambda kv: -kv[1]) if v >= 0.001}


def _profile(pids: list[int], seconds: float, work: Path, tag: str) -> list[threading.Thread]:
    """py-spy, one per API process (a serving one: the supervisor of several only waits)."""
    spy = shutil.which("py-spy") or str(Path(sys.executable).with_name("py-spy"))
    threads = []
    for pid in pids:
        out = work / f"pyspy-{tag}-{pid}.txt"

        def record(pid: int = pid, out: Path = out) -> None:
            subprocess.run([spy, "record", "-p", str(pid), "-d", str(int(seconds)), "-r", "100", "--threads",
                            "--idle", "-f", "raw", "-o", str(out)], capture_output=True, timeout=seconds + 60)

        t = threading.Thread(target=record, daemon=True)
        t.start()
        threads.append(t)
    return threads


def profile_summary(path: Path, top: int = 12) -> dict[str, Any]:
    """Per thread: its samples, the share not idle in C (waiting on a lock, a socket, epoll),
    and its most frequent innermost Python frames."""
    threads: dict[str, dict[str, int]] = {}
    for line in path.read_text(encoding="utf-8", errors="replace").splitlines():
        stack, _, count = line.rpartition(" ")
        if not count.isdigit():
            continue
        frames = stack.split(";")
        name = frames[0].split(": ", 1)[-1] if frames else "?"
        leaf = frames[-1].split(" (")[0] + " " + frames[-1].rsplit("/", 1)[-1].rstrip(")") if len(frames) > 1 else "?"
        threads.setdefault(name, {})
        threads[name][leaf] = threads[name].get(leaf, 0) + int(count)
    out: dict[str, Any] = {}
    for name, leaves in threads.items():
        total = sum(leaves.values())
        ranked = sorted(leaves.items(), key=lambda kv: -kv[1])[:top]
        out[name] = {"samples": total, "top": [[leaf, round(n / total, 3)] for leaf, n in ranked]}
    return out


def run(args: argparse.Namespace) -> int:
    import psutil

    from api.callers import Caller
    from api.database import open_api_store
    from api.scopes import Scope
    from api.tokens import create_caller
    from bench import api_scrape
    from harness.local_kafka import LocalCluster
    from harness.local_postgres import LocalPostgres
    from harness.ports import free_port
    from harness.settings_file import write_settings
    from operators.records import Category, Channel
    from ops import kafka_io
    from senders.profiles.crypto import generate_key
    from senders.profiles.model import parse_profile
    from senders.runtime.pool import open_profile_store, open_status_store
    from settings import Settings

    home = Path(tempfile.mkdtemp(prefix="bench-api-"))
    cluster = LocalCluster.on_free_ports(home / "kafka", args.brokers)
    postgres: LocalPostgres | None = None
    api_proc: subprocess.Popen[bytes] | None = None
    phases: list[dict[str, Any]] = []
    cluster.start()
    try:
        location = str(home / "status.sqlite3")
        if args.store == "postgresql":
            postgres = LocalPostgres(port=free_port()).start()
            location = postgres.create_database("bench")
        extra = overrides(args.set)
        cfg = Settings().with_overrides(
            kafka={"bootstrap_servers": cluster.bootstrap, "partitions": 3},
            senders={"status_store": location, "contact_encryption_keys": generate_key(),
                     "contact_lookup_keys": generate_key()},
            api={"port": free_port(), "default_rate_per_sec": 1e6,
                 **({"store_threads": args.store_threads} if args.store_threads else {})},
        )
        if extra:
            cfg = cfg.with_overrides(**extra)
        kafka_io.create_topics(cfg.kafka.client_config(), cfg.topics.all(), 3)
        kafka_io.create_topics(cfg.kafka.client_config(), [cfg.senders.status_topic], 3)
        store = open_status_store(cfg)
        api_db = open_api_store(cfg)
        open_profile_store(cfg, store).put_many(
            (f"user-{i}", parse_profile({"contacts": {Channel.SMS.value: [f"+1555{i:07d}"]}}))
            for i in range(args.users)
        )
        token = create_caller(api_db, Caller("bench", frozenset({Scope.SEND}), frozenset({Category.TRANSACTIONAL})),
                              int(time.time() * 1000))
        api_db.close()
        store.close()
        config = write_settings(cfg, home / "api.toml")
        log = (home / "api.log").open("wb")
        command = [sys.executable, "-m", "dedupctl.cli", "--config", str(config), "api", "run"]
        if args.processes > 1:
            command += ["--processes", str(args.processes)]
        api_proc = subprocess.Popen(command, cwd=REPO, stdout=log, stderr=subprocess.STDOUT)
        url = f"http://127.0.0.1:{cfg.api.port}"
        _wait_ready(url, api_proc, home / "api.log")
        api_tree = Processes(api_proc.pid)
        broker_pid = cluster.nodes[0].pid()
        broker_tree = Processes(broker_pid) if broker_pid and cluster.size == 1 else None
        sys.stdout.write(f"the API is ready at {url}\n")
        if args.warmup:
            sys.stdout.write(f"warm-up: {args.rates[0] / 2:g} requests/s for {args.warmup:g} s\n")
            sys.stdout.flush()
            _generator(url, token, args.rates[0] / 2, args.warmup, args)
        for rate in args.rates:
            load_start = os.getloadavg()[0]
            sys.stdout.write(f"phase: {rate:g} requests/s for {args.seconds:g} s (load average {load_start:.1f})\n")
            sys.stdout.flush()
            before = api_scrape.scrape(url)
            cpu_api, cpu_broker = api_tree.cpu_s(), broker_tree.cpu_s() if broker_tree else 0.0
            serving = api_tree.serving()
            threads_before = {pid: thread_cpu(pid) for pid in serving}
            spies = _profile(serving, args.seconds, home, f"{rate:g}") if args.profile else []
            loss: dict[str, Any] = {}
            killer = threading.Thread(target=_lose_a_broker, args=(cluster, cfg.topics.requests, args.kill_at, loss),
                                      daemon=True) if args.kill_at is not None else None
            if killer is not None:
                killer.start()
            summary = _generator(url, token, rate, args.seconds, args)
            if killer is not None:
                killer.join(300)
            used_api = api_tree.cpu_s() - cpu_api
            used_broker = (broker_tree.cpu_s() if broker_tree else 0.0) - cpu_broker
            after = api_scrape.scrape(url)
            for t in spies:
                t.join()
            metrics = api_scrape.phase_report(before, after)
            # per request the API answered in the phase (what it did; those a caller gave up on count too)
            n = max(1, round(sum(metrics["statuses"].values())))
            phase: dict[str, Any] = {
                "rate": rate, "target_p99_ms": TARGETS_P99_MS.get(rate), **summary,
                "met": summary["errors"] == 0 and rate in TARGETS_P99_MS and summary["p99_ms"] < TARGETS_P99_MS[rate],
                "cpu_ms_per_request": {"api": round(used_api * 1000 / n, 3),
                                       "broker": round(used_broker * 1000 / n, 3),
                                       "api_by_thread": cpu_by_thread(serving, threads_before, n)},
                "load_average": [round(load_start, 2), round(os.getloadavg()[0], 2)],
                "cpus": psutil.cpu_count(),
                "api_metrics": metrics,
                **({"broker_loss": loss} if killer is not None else {}),
            }
            if args.profile:
                phase["profile"] = {str(pid): profile_summary(home / f"pyspy-{rate:g}-{pid}.txt")
                                    for pid in serving if (home / f"pyspy-{rate:g}-{pid}.txt").exists()}
                phase["profile_files"] = str(home)
            phases.append(phase)
            _print_phase(phase)
    finally:
        if api_proc is not None:
            api_proc.terminate()
            api_proc.wait(60)
        cluster.stop()
        if postgres is not None:
            postgres.stop()
        if not args.profile:
            shutil.rmtree(home, ignore_errors=True)
    report = {
        "date": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"), "label": args.label,
        "config": {"processes": args.processes, "store": args.store, "connections": args.connections,
                   "users": args.users, "seconds": args.seconds, "warmup_s": args.warmup, "set": args.set,
                   "store_threads": args.store_threads or None, "brokers": args.brokers,
                   "kill_at_s": args.kill_at},
        "command": "python -m bench.api " + " ".join(sys.argv[1:]),
        "phases": phases,
    }
    name = f"api-{dt.date.today().isoformat()}" + (f"-{args.label}" if args.label else "") + ".json"
    out = REPO / "bench" / "results" / name
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(report, indent=2) + "\n", encoding="utf-8")
    sys.stdout.write(f"-> {out.relative_to(REPO)}\n")
    return 0 if all(p["errors"] == 0 for p in phases) else 1


def _lose_a_broker(cluster: Any, topic: str, after_s: float, into: dict[str, Any], which: str = "leader") -> None:
    """SIGKILL a node ``after_s`` into the phase (``which``: ``harness.broker_loss.victim``; by
    default the one leading most of ``topic``'s partitions, the active controller or not, as it
    falls), time until the cluster fences it, then start it again and wait until every replica
    is in sync."""
    from harness.broker_loss import lose_and_restore, victim

    time.sleep(after_s)
    lost = victim(cluster, topic, which)
    outage = lose_and_restore(cluster, lost.node)
    into.update(node=lost.node, was_controller=lost.was_controller, led_partitions=lost.led_partitions,
                killed_at_s=after_s, fenced_after_s=outage.fenced_after_s,
                back_in_sync_after_s=outage.back_in_sync_after_s)


def _print_phase(p: dict[str, Any]) -> None:
    m = p["api_metrics"]
    target = f"target p99 < {p['target_p99_ms']:g} ms" if p["target_p99_ms"] else "no target"

    def h(name: str) -> str:
        v = m[name]
        return f"p50 {v['p50']:.1f} p99 {v['p99']:.1f}"

    lines = [
        f"API accept latency at {p['rate']:g}/s ({p['requests']} requests, {p['rate_reached']}/s reached, statuses"
        f" {p['statuses']}, load average {p['load_average']}):",
        f"  caller: p50 {p['p50_ms']:.1f} ms  p90 {p['p90_ms']:.1f}  p99 {p['p99_ms']:.1f}  p99.9 {p['p999_ms']:.1f}"
        f"  max {p['max_ms']:.1f}  ({target}: {'met' if p['met'] else 'missed'})",
        f"  API: accept {h('accept_202')}; kafka ack {h('kafka_ack')}; loop lag {h('loop_lag')};"
        f" store queue {h('store_queue')}; store call {h('store_call')} (ms)",
        f"  reservations per transaction: mean {m['reservation_batch']['mean']:.1f}; GC pauses"
        f" {m['gc_pauses_by_generation']} (p99 {m['gc_pause']['p99']:.1f} ms); CPU per request: api"
        f" {p['cpu_ms_per_request']['api']} ms, broker {p['cpu_ms_per_request']['broker']} ms",
        f"  API CPU by thread (ms per request): {p['cpu_ms_per_request']['api_by_thread']}",
    ]
    sys.stdout.write("\n".join(lines) + "\n")
    sys.stdout.flush()


def _generator(url: str, token: str, rate: float, seconds: float, args: argparse.Namespace) -> dict[str, Any]:
    done = subprocess.run(
        [sys.executable, "-m", "bench.api_load", url, "--rate", str(rate), "--seconds", str(seconds),
         "--connections", str(args.connections), "--users", str(args.users), "--timeout", str(args.timeout),
         "--repeat-share", str(args.repeat_share)],
        cwd=REPO, env={**os.environ, "BENCH_API_TOKEN": token}, stdout=subprocess.PIPE, text=True,
        timeout=seconds * 3 + args.timeout + 60,
    )  # its stderr (progress, or why it failed) goes to ours as it comes
    if done.returncode != 0:
        raise RuntimeError(f"the load generator failed with exit {done.returncode} (its stderr is above)")
    return dict(json.loads(done.stdout.strip().splitlines()[-1]))


def _wait_ready(url: str, proc: subprocess.Popen[bytes], log: Path, timeout_s: float = 90.0) -> None:
    import urllib.request

    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"the API exited: {log.read_text()[-2000:]}")
        try:
            with urllib.request.urlopen(url + "/readyz", timeout=2) as reply:
                if reply.status == 200:
                    return
        except OSError:
            pass
        time.sleep(0.2)
    raise RuntimeError(f"the API was not ready within {timeout_s:g} s")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.api", description=__doc__.split("\n")[0])
    parser.add_argument("--rates", default="1000,2000", help="requests per second, one phase each (default"
                        " 1000,2000)")
    parser.add_argument("--rate", type=float, help="one phase at this rate (instead of --rates)")
    parser.add_argument("--seconds", type=float, default=30.0, help="each phase's length (default 30)")
    parser.add_argument("--warmup", type=float, default=5.0, help="seconds at half the first rate (not measured)")
    parser.add_argument("--connections", type=int, default=64, help="keep-alive connections of the generator")
    parser.add_argument("--users", type=int, default=1000)
    parser.add_argument("--timeout", type=float, default=10.0, help="an answer slower than this is an error")
    parser.add_argument("--repeat-share", type=float, default=0.0, help="share of requests repeating an earlier one")
    parser.add_argument("--processes", type=int, default=1, help="API processes on the port (api run --processes)")
    parser.add_argument("--store", choices=("sqlite", "postgresql"), default="sqlite")
    parser.add_argument("--brokers", type=int, default=1, help="local brokers (3: replication 3, min ISR 2)")
    parser.add_argument("--kill-at", type=float, default=None, metavar="S",
                        help="SIGKILL the busiest broker S seconds into each phase (needs --brokers 3)")
    parser.add_argument("--store-threads", type=int, default=0, help="api.store_threads (default: the setting)")
    parser.add_argument("--set", action="append", default=[], metavar="SECTION.KEY=VALUE",
                        help="a setting of the run (repeatable): --set api.reservation_batch=1")
    parser.add_argument("--label", default="", help="the results file: bench/results/api-<date>-<label>.json")
    parser.add_argument("--profile", action="store_true", help="py-spy each API process during each phase")
    args = parser.parse_args(argv)
    if args.kill_at is not None and args.brokers < 3:
        parser.error("--kill-at needs --brokers 3: one broker of one is not a partial loss")
    args.rates = [args.rate] if args.rate else [float(r) for r in args.rates.split(",") if r.strip()]
    return run(args)


if __name__ == "__main__":
    sys.exit(main())
