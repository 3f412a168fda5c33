"""The in-process engines (operators/inprocess): checks per second, and bytes per key held.

``python -m bench.engines [--quick] [--json FILE]`` (``make bench`` runs it after the systems).

The key mix: ``checks`` keys of about 40 characters, 80% new and 20% repeats of one of the
10,000 newest keys, with one millisecond of event time between checks (every request has the
default 7-day window, so nothing expires during a run and every new key stays held). The lists
are built before the clock starts. Each figure is taken on a fresh engine.

* **MemoryDedup**: ``should_send(key, now_ms)`` in its two modes (keys held as strings; as 64-bit
  hashes), on one thread and on several threads sharing one engine (each thread its own slice of
  the mix, started together). Checks per second are wall-clock; CPU µs per check are this
  process's user+system time over the same interval, so several threads show what the GIL
  leaves of them (one core at most for pure Python).
* **RedisDedup**: ``check`` (one round trip per check) on one and on several threads (redis-py's
  connection pool: a connection per thread), and ``check_many`` in pipelined batches, against a
  throwaway ``redis-server`` on loopback (harness/local_redis.py, append-only file synced every
  second, as a platform team would run it); the server's CPU per check is given too.
* **Bytes per key held**: MemoryDedup: the growth of Python's traced allocations
  (``tracemalloc``: what the engine holds alive, the key strings included, without the
  allocator's slack) and of the process's RSS (with it), over ``keys`` new keys inserted into a
  fresh engine in a fresh process; RedisDedup: the growth of Redis's ``used_memory``.

Every run also checks the engine's answers: the number of checks it called new must be the number
of distinct keys in the mix (with several threads too, or a lock would be missing).
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import random
import shutil
import sys
import tempfile
import threading
import time
import tracemalloc
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from operators.inprocess import MemoryDedup, RedisDedup

#: the engines' target (issue 16): checks per second on one thread, in process
TARGET_CHECKS_PER_S = 500_000
#: the design's estimate of what a key costs in a Python process
DESIGN_BYTES_PER_KEY = 100
T0_MS = 1_796_115_600_000

MODES: dict[str, dict[str, Any]] = {
    "quick": {"checks": 400_000, "redis_checks": 20_000, "keys": 200_000, "threads": (1, 2, 4),
              "batch": 100},
    "full": {"checks": 2_000_000, "redis_checks": 100_000, "keys": 1_000_000, "threads": (1, 2, 4),
             "batch": 100},
}


def key_of(rng: random.Random, n: int) -> str:
    """A key of 40 characters, unique by ``n``: ``u<14 hex>:order.shipped:<10 digits>``."""
    return f"u{rng.getrandbits(56):014x}:order.shipped:{n:010d}"


def key_mix(checks: int, seed: int = 16, new_share: float = 0.8, recent: int = 10_000) -> list[str]:
    """``checks`` keys: ``new_share`` of them new, the rest repeats of one of the ``recent``
    newest keys (the first check is always new)."""
    rng = random.Random(seed)
    out: list[str] = []
    fresh: list[str] = []
    for _ in range(checks):
        if fresh and rng.random() >= new_share:
            out.append(fresh[-1 - rng.randrange(min(recent, len(fresh)))])
        else:
            key = key_of(rng, len(fresh))
            fresh.append(key)
            out.append(key)
    return out


def _timed(workers: Sequence[Callable[[], int]]) -> tuple[float, float, int]:
    """Run the workers on threads of their own, started together: (wall s, CPU s, sum of results)."""
    results = [0] * len(workers)
    barrier = threading.Barrier(len(workers) + 1)

    def run(i: int) -> None:
        barrier.wait()
        results[i] = workers[i]()

    threads = [threading.Thread(target=run, args=(i,)) for i in range(len(workers))]
    for t in threads:
        t.start()
    cpu0 = time.process_time()
    t0 = time.perf_counter()
    barrier.wait()
    for t in threads:
        t.join()
    return time.perf_counter() - t0, time.process_time() - cpu0, sum(results)


def _slices(n: int, parts: int) -> list[range]:
    step = -(-n // parts)
    return [range(i, min(n, i + step)) for i in range(0, n, step)]


def memory_rate(keys: list[str], threads: int, hashed: bool) -> dict[str, Any]:
    engine = MemoryDedup(hashed=hashed)

    def worker(part: range) -> Callable[[], int]:
        def run() -> int:
            send = engine.should_send
            new = 0
            for i in part:
                if send(keys[i], T0_MS + i):
                    new += 1
            return new
        return run

    wall, cpu, new = _timed([worker(p) for p in _slices(len(keys), threads)])
    return {"engine": "MemoryDedup", "variant": "hashed" if hashed else "strings", "call": "should_send",
            "threads": threads, "checks": len(keys), "checks_per_s": len(keys) / wall,
            "cpu_us_per_check": cpu / len(keys) * 1e6, "new": new, "held": len(engine)}


def _rss() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def _fill(engine: MemoryDedup, n: int, seed: int) -> None:
    rng = random.Random(seed)
    send = engine.should_send
    for i in range(n):
        send(key_of(rng, i), T0_MS + i)


def memory_bytes(n: int, hashed: bool) -> dict[str, Any]:
    """Run in a fresh process: RSS growth over ``n`` keys, then tracemalloc's over ``n`` more in a
    second engine."""
    rss0 = _rss()
    first = MemoryDedup(hashed=hashed)
    _fill(first, n, 1)
    rss = _rss() - rss0
    tracemalloc.start()
    before = tracemalloc.get_traced_memory()[0]
    second = MemoryDedup(hashed=hashed)
    _fill(second, n, 2)
    traced = tracemalloc.get_traced_memory()[0] - before
    tracemalloc.stop()
    assert len(first) == len(second) == n
    return {"engine": "MemoryDedup", "variant": "hashed" if hashed else "strings", "keys": n,
            "bytes_per_key_tracemalloc": traced / n, "bytes_per_key_rss": rss / n}


def _in_fresh_process(fn: Callable[..., dict[str, Any]], *args: Any) -> dict[str, Any]:
    with multiprocessing.get_context("spawn").Pool(1) as pool:
        return dict(pool.apply(fn, args))


def _proc_cpu(pid: int) -> float:
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def redis_figures(keys: list[str], threads: Sequence[int], batch: int, n_bytes: int) -> list[dict[str, Any]]:
    import redis

    from harness.local_redis import LocalRedis

    home = Path(tempfile.mkdtemp(prefix="bench-engines-redis-"))
    server = LocalRedis(home, durable=True).start()
    rows: list[dict[str, Any]] = []
    try:
        pool = redis.ConnectionPool(host="127.0.0.1", port=server.port, max_connections=max(threads) + 2)
        client: Any = redis.Redis(connection_pool=pool)
        engine = RedisDedup(client)
        info: dict[str, Any] = client.info("server")
        pid = int(info["process_id"])

        def measure(call: str, n_threads: int, workers: list[Callable[[], int]]) -> None:
            client.flushall()
            cpu0 = _proc_cpu(pid)
            wall, cpu, new = _timed(workers)
            rows.append({"engine": "RedisDedup", "variant": call, "call": call, "threads": n_threads,
                         "checks": len(keys), "checks_per_s": len(keys) / wall,
                         "cpu_us_per_check": cpu / len(keys) * 1e6,
                         "server_cpu_us_per_check": (_proc_cpu(pid) - cpu0) / len(keys) * 1e6, "new": new})

        def one_by_one(part: range) -> Callable[[], int]:
            def run() -> int:
                check = engine.check
                return sum(1 for i in part if check(keys[i], f"n{i}").new)
            return run

        def pipelined(part: range) -> Callable[[], int]:
            def run() -> int:
                new = 0
                for lo in range(part.start, part.stop, batch):
                    hi = min(part.stop, lo + batch)
                    new += sum(1 for c in engine.check_many([(keys[i], f"n{i}", None) for i in range(lo, hi)])
                               if c.new)
                return new
            return run

        for t in threads:
            measure("check", t, [one_by_one(p) for p in _slices(len(keys), t)])
        measure(f"check_many({batch})", 1, [pipelined(range(len(keys)))])
        # bytes per key: used_memory growth over n_bytes new keys, pipelined
        client.flushall()
        mem: dict[str, Any] = client.info("memory")
        base = int(mem["used_memory"])
        rng = random.Random(3)
        for lo in range(0, n_bytes, 1000):
            engine.check_many([(key_of(rng, i), f"n{i}", None) for i in range(lo, min(n_bytes, lo + 1000))])
        held = int(client.dbsize())
        mem = client.info("memory")
        grown = int(mem["used_memory"]) - base
        rows.append({"engine": "RedisDedup", "variant": "SET NX GET PX", "keys": held,
                     "bytes_per_key_used_memory": grown / held if held else None})
    finally:
        server.stop()
        shutil.rmtree(home, ignore_errors=True)
    return rows


def run(mode: str = "quick", seed: int = 16, redis: bool = True) -> dict[str, Any]:
    m = MODES[mode]
    keys = key_mix(m["checks"], seed)
    distinct = len(set(keys))
    rates: list[dict[str, Any]] = []
    for hashed in (False, True):
        for t in m["threads"]:
            rates.append(memory_rate(keys, t, hashed))
    memory = [_in_fresh_process(memory_bytes, m["keys"], hashed) for hashed in (False, True)]
    redis_rows: list[dict[str, Any]] = []
    redis_error = None
    if redis and shutil.which("redis-server"):
        rkeys = key_mix(m["redis_checks"], seed)
        rdistinct = len(set(rkeys))
        try:
            redis_rows = redis_figures(rkeys, m["threads"], m["batch"], min(m["keys"], 200_000))
        except Exception as exc:  # noqa: BLE001 - the memory engine's figures stand without it
            redis_error = f"{type(exc).__name__}: {exc}"
        for r in redis_rows:
            if "new" in r:
                r["exact"] = r["new"] == rdistinct
    elif redis:
        redis_error = "redis-server is not installed"
    for r in rates:
        r["exact"] = r["new"] == distinct == r["held"]
    return {
        "mode": mode,
        "key_mix": {"checks": len(keys), "distinct": distinct, "new_share": 0.8, "repeats_of": 10_000,
                    "mean_key_chars": sum(map(len, keys[:1000])) / min(1000, len(keys)),
                    "redis_checks": m["redis_checks"]},
        "target_checks_per_s": TARGET_CHECKS_PER_S, "design_bytes_per_key": DESIGN_BYTES_PER_KEY,
        "rates": rates + [r for r in redis_rows if "checks_per_s" in r],
        "memory": memory + [r for r in redis_rows if "keys" in r],
        "redis_error": redis_error,
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.engines", description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true")
    p.add_argument("--no-redis", action="store_true")
    p.add_argument("--json", help="write the figures here (default: stdout)")
    a = p.parse_args(argv)
    out = run("quick" if a.quick else "full", redis=not a.no_redis)
    text = json.dumps(out, indent=2)
    if a.json:
        Path(a.json).write_text(text + "\n")
    else:
        sys.stdout.write(text + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
