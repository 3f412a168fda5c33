"""The API's accept latency: ``python -m bench.api [--rate 1000] [--seconds 30]`` (``make bench``).

A local broker and the API (``dedupctl api run``, its own process) on a throwaway store; then a
load generator in another process sends ``POST /v1/notifications`` open-loop at a fixed rate
(request i is due at start + i/rate, whatever the answers before it), over keep-alive
connections, and times each from when it was due to its answer: a slow answer delays the
requests behind it, and that delay counts (no coordinated omission). Every request has its own
Idempotency-Key and one of 1,000 users. Reported: p50, p90, p99, max, the rate reached, the
answers by status; written to bench/results/api-<date>.json. The design's target: p99 < 50 ms.
"""

from __future__ import annotations

import argparse
import asyncio
import datetime as dt
import json
import math
import os
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
TARGET_P99_MS = 50.0


def percentile(values: list[float], q: float) -> float:
    if not values:
        return math.nan
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, math.ceil(q * len(ordered)) - 1))]


# -- the load generator (its own process) -----------------------------------------------------------


async def _connection(host: str, port: int, token: str, queue: asyncio.Queue[tuple[int, float] | None],
                      results: list[tuple[float, int]], users: int) -> None:
    reader, writer = await asyncio.open_connection(host, port)
    try:
        while True:
            item = await queue.get()
            if item is None:
                return
            n, due = item
            body = json.dumps({"user_id": f"user-{n % users}", "template": "order_shipped",
                               "params": {"order": f"B-{n}"}, "channels": ["sms"]}).encode()
            head = (
                f"POST /v1/notifications HTTP/1.1\r\nHost: {host}:{port}\r\nAuthorization: Bearer {token}\r\n"
                f"Idempotency-Key: bench-{uuid.uuid4().hex}\r\nContent-Type: application/json\r\n"
                f"Content-Length: {len(body)}\r\n\r\n"
            ).encode()
            writer.write(head + body)
            await writer.drain()
            status_line = await reader.readuntil(b"\r\n")
            status = int(status_line.split()[1])
            length = 0
            while True:
                line = await reader.readuntil(b"\r\n")
                if line == b"\r\n":
                    break
                name, _, value = line.decode("latin-1").partition(":")
                if name.lower() == "content-length":
                    length = int(value.strip())
            await reader.readexactly(length)
            results.append(((time.perf_counter() - due) * 1000, status))
    finally:
        writer.close()


async def _load(url: str, token: str, rate: float, seconds: float, connections: int, users: int) -> dict[str, Any]:
    host, port = url.split("//")[1].split(":")
    queue: asyncio.Queue[tuple[int, float] | None] = asyncio.Queue()
    results: list[tuple[float, int]] = []
    workers = [asyncio.create_task(_connection(host, int(port), token, queue, results, users))
               for _ in range(connections)]
    total = int(rate * seconds)
    start = time.perf_counter() + 0.2
    for n in range(total):
        due = start + n / rate
        delay = due - time.perf_counter()
        if delay > 0:
            await asyncio.sleep(delay)
        queue.put_nowait((n, due))
    for _ in workers:
        queue.put_nowait(None)
    await asyncio.gather(*workers)
    elapsed = time.perf_counter() - start
    latencies = [ms for ms, _ in results]
    statuses: dict[str, int] = {}
    for _, status in results:
        statuses[str(status)] = statuses.get(str(status), 0) + 1
    return {
        "requests": len(results), "seconds": round(elapsed, 2), "rate_reached": round(len(results) / elapsed, 1),
        "statuses": statuses, "p50_ms": percentile(latencies, 0.50), "p90_ms": percentile(latencies, 0.90),
        "p99_ms": percentile(latencies, 0.99), "max_ms": max(latencies, default=math.nan),
    }


def load_main(args: argparse.Namespace) -> int:
    summary = asyncio.run(_load(args.load, os.environ["BENCH_API_TOKEN"], args.rate, args.seconds,
                                args.connections, args.users))
    print(json.dumps(summary))
    return 0


# -- the run: broker, API, load generator ------------------------------------------------------------


def run(args: argparse.Namespace) -> int:
    from api.callers import Caller
    from api.scopes import Scope
    from api.tables import prepare
    from api.tokens import create_caller
    from harness.local_kafka import LocalBroker
    from harness.ports import free_port
    from harness.settings_file import write_settings
    from operators.records import Category, Channel
    from ops import kafka_io
    from senders.profiles.crypto import generate_key
    from senders.profiles.model import parse_profile
    from senders.runtime.pool import open_profile_store, open_status_store
    from settings import Settings

    home = Path(tempfile.mkdtemp(prefix="bench-api-"))
    broker = LocalBroker(home=home / "kafka", port=free_port(), controller_port=free_port())
    broker.start()
    api_proc: subprocess.Popen[bytes] | None = None
    try:
        cfg = Settings().with_overrides(
            kafka={"bootstrap_servers": broker.bootstrap, "partitions": 3},
            senders={"status_store": str(home / "status.sqlite3"), "contact_encryption_keys": generate_key(),
                     "contact_lookup_keys": generate_key()},
            api={"port": free_port(), "default_rate_per_sec": 1e6, "store_threads": args.store_threads or None},
        )
        kafka_io.create_topics(cfg.kafka.client_config(), cfg.topics.all(), 3)
        kafka_io.create_topics(cfg.kafka.client_config(), [cfg.senders.status_topic], 3)
        store = open_status_store(cfg)
        prepare(store.db)
        open_profile_store(cfg, store).put_many(
            (f"user-{i}", parse_profile({"contacts": {Channel.SMS.value: [f"+1555{i:07d}"]}}))
            for i in range(args.users)
        )
        token = create_caller(store.db, Caller("bench", frozenset({Scope.SEND}), frozenset({Category.TRANSACTIONAL})),
                              int(time.time() * 1000))
        store.close()
        config = write_settings(cfg.with_overrides(), home / "api.toml")
        log = (home / "api.log").open("wb")
        api_proc = subprocess.Popen([sys.executable, "-m", "dedupctl.cli", "--config", str(config), "api", "run"],
                                    cwd=REPO, stdout=log, stderr=subprocess.STDOUT)
        url = f"http://127.0.0.1:{cfg.api.port}"
        _wait_ready(url, api_proc, home / "api.log")
        if args.warmup:
            _generator(url, token, args.rate / 2, args.warmup, args)
        summary = _generator(url, token, args.rate, args.seconds, args)
    finally:
        if api_proc is not None:
            api_proc.terminate()
            api_proc.wait(30)
        broker.stop()
    report = {"date": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"), "rate": args.rate,
              "seconds": args.seconds, "connections": args.connections, "target_p99_ms": TARGET_P99_MS, **summary}
    out = REPO / "bench" / "results" / f"api-{dt.date.today().isoformat()}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(report, indent=2) + "\n", encoding="utf-8")
    print(f"API accept latency at {args.rate:g}/s for {args.seconds:g} s ({summary['requests']} requests,"
          f" {summary['rate_reached']}/s reached, statuses {summary['statuses']}):")
    print(f"  p50 {summary['p50_ms']:.1f} ms  p90 {summary['p90_ms']:.1f} ms  p99 {summary['p99_ms']:.1f} ms"
          f"  max {summary['max_ms']:.1f} ms  (target p99 < {TARGET_P99_MS:g} ms)  -> {out.relative_to(REPO)}")
    ok = summary["statuses"].get("202", 0) == summary["requests"]
    return 0 if ok else 1


def _generator(url: str, token: str, rate: float, seconds: float, args: argparse.Namespace) -> dict[str, Any]:
    done = subprocess.run(
        [sys.executable, "-m", "bench.api", "--load", url, "--rate", str(rate), "--seconds", str(seconds),
         "--connections", str(args.connections), "--users", str(args.users)],
        cwd=REPO, env={**os.environ, "BENCH_API_TOKEN": token}, capture_output=True, text=True,
        timeout=seconds * 3 + 60,
    )
    if done.returncode != 0:
        raise RuntimeError(f"the load generator failed: {done.stderr[-2000:]}")
    return dict(json.loads(done.stdout.strip().splitlines()[-1]))


def _wait_ready(url: str, proc: subprocess.Popen[bytes], log: Path, timeout_s: float = 60.0) -> None:
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
    raise RuntimeError("the API was not ready within a minute")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.api", description=__doc__.split("\n")[0])
    parser.add_argument("--rate", type=float, default=1000.0, help="requests per second (default 1000)")
    parser.add_argument("--seconds", type=float, default=30.0, help="how long (default 30)")
    parser.add_argument("--warmup", type=float, default=3.0, help="seconds at half the rate first (not measured)")
    parser.add_argument("--connections", type=int, default=64, help="keep-alive connections of the generator")
    parser.add_argument("--users", type=int, default=1000)
    parser.add_argument("--store-threads", type=int, default=0, help="api.store_threads (default: the setting)")
    parser.add_argument("--load", metavar="URL", help=argparse.SUPPRESS)  # the generator process itself
    args = parser.parse_args(argv)
    return load_main(args) if args.load else run(args)


if __name__ == "__main__":
    sys.exit(main())
