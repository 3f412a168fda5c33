"""The load generator of ``python -m bench.api``, a process of its own:
``python -m bench.api_load URL --rate R --seconds S`` (the token in ``BENCH_API_TOKEN``).

Open loop: request i is due at start + i/rate, whatever the answers before it, and is timed from
when it was due to its answer, so a slow answer delays the requests behind it and that delay
counts (no coordinated omission). Requests go over ``--connections`` keep-alive connections; a
request waiting for a free connection is still timed from when it was due. An answer that takes
longer than ``--timeout`` counts as an error (status 0) and its connection is opened again; so
does every request still unanswered ``--timeout`` after the phase's last one was due.
``--repeat-share``: that share of the requests repeats an earlier request (same key and body:
the API answers 200). Prints one JSON line: the latencies' percentiles and the statuses.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import os
import random
import sys
import time
import uuid
from typing import Any

#: seconds between the progress lines of a benchmark's long waits (this module's phases, and
#: bench.slo's, bench.slo_load's and bench.senders')
PROGRESS_S = 5.0


def percentile(values: list[float], q: float) -> float:
    if not values:
        return math.nan
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, math.ceil(q * len(ordered)) - 1))]


class Connection:
    def __init__(self, host: str, port: int) -> None:
        self.host, self.port = host, port
        self.reader: asyncio.StreamReader | None = None
        self.writer: asyncio.StreamWriter | None = None

    async def request(self, head: bytes, body: bytes) -> int:
        return (await self.exchange(head, body))[0]

    async def exchange(self, head: bytes, body: bytes) -> tuple[int, bytes]:
        """One request on the connection: the answer's status and body."""
        if self.writer is None:
            self.reader, self.writer = await asyncio.open_connection(self.host, self.port)
        assert self.reader is not None
        self.writer.write(head + body)
        await self.writer.drain()
        # the head in one search of the buffer, not a coroutine step for each of its lines
        lines = (await self.reader.readuntil(b"\r\n\r\n")).split(b"\r\n")
        status = int(lines[0].split()[1])
        length = 0
        for line in lines[1:]:
            name, _, value = line.partition(b":")
            if name.strip().lower() == b"content-length":
                length = int(value.strip())
        return status, await self.reader.readexactly(length)

    def close(self) -> None:
        if self.writer is not None:
            self.writer.close()
        self.reader = self.writer = None


def _request(n: int, host: str, port: int, token: str, users: int, key: str) -> tuple[bytes, bytes]:
    body = json.dumps({"user_id": f"user-{n % users}", "template": "order_shipped",
                       "params": {"order": f"B-{n}"}, "channels": ["sms"]}).encode()
    head = (
        f"POST /v1/notifications HTTP/1.1\r\nHost: {host}:{port}\r\nAuthorization: Bearer {token}\r\n"
        f"Idempotency-Key: {key}\r\nContent-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n"
    ).encode()
    return head, body


async def _worker(conn: Connection, queue: asyncio.Queue[tuple[bytes, bytes, float] | None],
                  results: list[tuple[float, int]], timeout_s: float) -> None:
    try:
        while True:
            item = await queue.get()
            if item is None:
                return
            head, body, due = item
            try:
                status = await asyncio.wait_for(conn.request(head, body), timeout_s)
            except (TimeoutError, OSError, asyncio.IncompleteReadError, ValueError, IndexError):
                conn.close()
                status = 0
            results.append(((time.perf_counter() - due) * 1000, status))
    finally:
        conn.close()


async def load(url: str, token: str, rate: float, seconds: float, connections: int, users: int,
               timeout_s: float = 10.0, repeat_share: float = 0.0, seed: int = 7) -> dict[str, Any]:
    host, port_text = url.split("//")[1].split(":")
    port = int(port_text)
    rng = random.Random(seed)
    queue: asyncio.Queue[tuple[bytes, bytes, float] | None] = asyncio.Queue()
    results: list[tuple[float, int]] = []
    workers = [asyncio.create_task(_worker(Connection(host, port), queue, results, timeout_s))
               for _ in range(connections)]
    total = int(rate * seconds)
    run = uuid.uuid4().hex[:8]
    start = time.perf_counter() + 0.2
    said = start
    for n in range(total):
        due = start + n / rate
        if due - said >= PROGRESS_S:  # on stderr: stdout is the summary
            said = due
            failed = sum(1 for _, status in results if status not in (200, 202))
            sys.stderr.write(f"  ... {n:,} of {total:,} requests sent, {len(results):,} answered ({failed:,} not 2xx)"
                             f" after {due - start:.0f} s\n")
            sys.stderr.flush()
        delay = due - time.perf_counter()
        if delay > 0:
            await asyncio.sleep(delay)
        m = rng.randrange(n) if n and rng.random() < repeat_share else n
        head, body = _request(m, host, port, token, users, f"bench-{run}-{m}")
        queue.put_nowait((head, body, due))
    for _ in workers:
        queue.put_nowait(None)
    # the phase is over: what is not answered within the timeout is an error, answered or not
    _, late = await asyncio.wait(workers, timeout=timeout_s)
    now = time.perf_counter()
    while not queue.empty():
        item = queue.get_nowait()
        if item is not None:
            results.append(((now - item[2]) * 1000, 0))
    for task in late:
        task.cancel()
        results.append((timeout_s * 1000, 0))
    elapsed = time.perf_counter() - start
    latencies = [ms for ms, _ in results]
    statuses: dict[str, int] = {}
    for _, status in results:
        statuses[str(status)] = statuses.get(str(status), 0) + 1
    ok = sum(v for k, v in statuses.items() if k in ("200", "202"))
    return {
        "requests": len(results), "seconds": round(elapsed, 2), "rate_reached": round(ok / elapsed, 1),
        "statuses": statuses, "errors": len(results) - ok,
        "p50_ms": percentile(latencies, 0.50), "p90_ms": percentile(latencies, 0.90),
        "p99_ms": percentile(latencies, 0.99), "p999_ms": percentile(latencies, 0.999),
        "max_ms": max(latencies, default=math.nan),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.api_load", description=__doc__.split("\n")[0])
    parser.add_argument("url")
    parser.add_argument("--rate", type=float, required=True)
    parser.add_argument("--seconds", type=float, required=True)
    parser.add_argument("--connections", type=int, default=64)
    parser.add_argument("--users", type=int, default=1000)
    parser.add_argument("--timeout", type=float, default=10.0)
    parser.add_argument("--repeat-share", type=float, default=0.0)
    args = parser.parse_args(argv)
    try:
        import uvloop
    except ImportError:  # the standard loop: a little more of the generator's CPU per request
        runner = asyncio.run
    else:
        runner = uvloop.run
    summary = runner(load(args.url, os.environ["BENCH_API_TOKEN"], args.rate, args.seconds, args.connections,
                          args.users, args.timeout, args.repeat_share))
    sys.stdout.write(json.dumps(summary) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
