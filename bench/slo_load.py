"""The load generator of ``python -m bench.slo``, a process of its own:
``python -m bench.slo_load URL OUT --run NAME --stream KIND:RATE [--stream ...] --seconds S``
(the token in ``BENCH_API_TOKEN``).

Open loop, as ``bench.api_load``: request i of a stream is due at start + i/rate, whatever the
answers before it, and is timed from when it was due (a request waiting for a free connection is
still timed from then). Streams (``KIND``):

- ``order``: an order update (``order_shipped``, transactional, the normal lane) to one of
  ``--users`` campaign users ``u-N``, on ``--order-channels``;
- ``code``: a one-time code (``otp``, priority high: the priority lane, SMS) to a user of its own
  (``otp-N`` from ``--code-offset`` on: a recipient gets at most a few codes an hour);
- ``mix``: by the request's index n: a code when n % 10 == 0, a repeat of order n - 1004 (the
  same Idempotency-Key and body, about a second earlier at 1,000/s: the API answers 200 with the
  first answer) when n % 10 == 5, an order otherwise (:func:`mix_kind`).

Each answered request is one JSON line in OUT: ``[stream, kind, key, due (epoch s), latency ms,
status, dedup_key, sent late ms, queued late ms]`` (the dedup key from the answer's body, null when
it had none; how long after it was due the request was written: waiting for a free connection or
for this process to be run; and of that, how long after it was due this process queued it for
the connections: its own delay, the scheduler's turns included): the harness matches them to the
provider stubs' arrivals. An answer slower than ``--timeout`` is status 0.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

from bench.api_load import PROGRESS_S, Connection

REPEAT_DISTANCE = 1004  # a mix's repeat repeats the request this many before it (an order)
MIX_PERIOD = 10


def mix_kind(n: int) -> str:
    """The kind of request n of a ``mix`` stream: ``code``, ``repeat`` or ``order``."""
    if n % MIX_PERIOD == 0:
        return "code"
    if n % MIX_PERIOD == 5 and n >= REPEAT_DISTANCE:
        return "repeat"
    return "order"


def codes_in(kind: str, total: int) -> int:
    """How many one-time codes (so code users) ``total`` requests of a stream of ``kind`` send."""
    if kind == "code":
        return total
    if kind == "mix":
        return (total + MIX_PERIOD - 1) // MIX_PERIOD
    return 0


def body(kind: str, n: int, run: str, stream: str, args: argparse.Namespace) -> tuple[str, dict[str, Any]]:
    """Request n of a stream: (Idempotency-Key, JSON body). A repeat is its original's."""
    if stream == "mix":
        kind = mix_kind(n)
        if kind == "repeat":
            return body("order", n - REPEAT_DISTANCE, run, stream, args)
    key = f"{run}-{stream}-{n}"
    if kind == "code":
        code_no = n // MIX_PERIOD if stream == "mix" else n
        return key, {"user_id": f"otp-{args.code_offset + code_no}", "template": "otp",
                     "params": {"code": f"{(n * 7919) % 1_000_000:06d}"}, "priority": "high", "channels": ["sms"]}
    return key, {"user_id": f"u-{(n * 7) % args.users}", "template": "order_shipped",
                 "params": {"order": f"{run}-{n}"}, "channels": args.order_channels.split(",")}


def _head(host: str, port: int, token: str, key: str, length: int) -> bytes:
    return (f"POST /v1/notifications HTTP/1.1\r\nHost: {host}:{port}\r\nAuthorization: Bearer {token}\r\n"
            f"Idempotency-Key: {key}\r\nContent-Type: application/json\r\nContent-Length: {length}\r\n\r\n").encode()


def _dedup_key(status: int, answer: bytes) -> str | None:
    if status not in (200, 202):
        return None
    try:
        return str(json.loads(answer)["dedup_key"])
    except (ValueError, KeyError, TypeError):
        return None


Item = tuple[str, str, str, float, bytes, bytes, float]  # stream, kind, key, due, head, body, queued (perf_counter)


async def _worker(conn: Connection, queue: asyncio.Queue[Item | None], out: list[list[Any]], offset: float,
                  timeout_s: float) -> None:
    try:
        while True:
            item = await queue.get()
            if item is None:
                return
            stream, kind, key, due, head, data, queued = item
            sent = time.perf_counter()  # its lateness: waiting for a connection, or for a CPU
            try:
                async with asyncio.timeout(timeout_s):  # not wait_for: in 3.11 it can swallow a cancel
                    status, answer = await conn.exchange(head, data)
            except (TimeoutError, OSError, asyncio.IncompleteReadError, ValueError, IndexError):
                conn.close()
                status, answer = 0, b""
            except asyncio.CancelledError:  # the phase is over and this one still unanswered: an error
                out.append([stream, kind, key, round(due + offset, 6), round((time.perf_counter() - due) * 1000, 3),
                            0, None, round((sent - due) * 1000, 3), round((queued - due) * 1000, 3)])
                raise
            out.append([stream, kind, key, round(due + offset, 6), round((time.perf_counter() - due) * 1000, 3),
                        status, answer, round((sent - due) * 1000, 3),  # the answer read after the phase
                        round((queued - due) * 1000, 3)])
    finally:
        conn.close()


def schedule(streams: list[tuple[str, float]], seconds: float) -> list[tuple[float, str, int]]:
    """(due offset s, stream, index) of every request of the streams, in due order."""
    due = [(i / rate, kind, i) for kind, rate in streams for i in range(int(rate * seconds))]
    return sorted(due)


async def load(url: str, token: str, args: argparse.Namespace) -> list[list[Any]]:
    host, port_text = url.split("//")[1].split(":")
    port = int(port_text)
    streams = [(s.split(":")[0], float(s.split(":")[1])) for s in args.stream]
    plan = schedule(streams, args.seconds)
    # every request made before the first is due: the phase's CPU is the sending's alone
    made = []
    for _, stream, n in plan:
        key, data = body(stream, n, args.run, stream, args)
        raw = json.dumps(data).encode()
        made.append((mix_kind(n) if stream == "mix" else stream, key, _head(host, port, token, key, len(raw)), raw))
    queue: asyncio.Queue[Item | None] = asyncio.Queue()
    out: list[list[Any]] = []
    start = time.perf_counter() + 0.2
    offset = time.time() - time.perf_counter()  # perf_counter -> epoch seconds (the stubs' clock)
    workers = [asyncio.create_task(_worker(Connection(host, port), queue, out, offset, args.timeout))
               for _ in range(args.connections)]
    said = start
    for (at, stream, _), (kind, key, head, raw) in zip(plan, made, strict=True):
        due = start + at
        if due - said >= PROGRESS_S:
            said = due
            failed = sum(1 for r in out if r[5] not in (200, 202))
            sys.stderr.write(f"  ... {args.run}: {len(out):,} of {len(plan):,} requests answered ({failed:,} not 2xx)"
                             f" after {at:.0f} s\n")
            sys.stderr.flush()
        delay = due - time.perf_counter()
        if delay > 0:
            await asyncio.sleep(delay)
        queue.put_nowait((stream, kind, key, due, head, raw, time.perf_counter()))
    for _ in workers:
        queue.put_nowait(None)
    _, late = await asyncio.wait(workers, timeout=args.timeout)
    now = time.perf_counter()
    while not queue.empty():
        item = queue.get_nowait()
        if item is not None:
            out.append([item[0], item[1], item[2], round(item[3] + offset, 6), round((now - item[3]) * 1000, 3), 0,
                        None])
    for task in late:
        queue.put_nowait(None)  # the end again for each late one (the drain above took the first)
        task.cancel()
    await asyncio.gather(*late, return_exceptions=True)
    for r in out:
        r[6] = _dedup_key(r[5], r[6]) if isinstance(r[6], bytes) else r[6]
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.slo_load", description=__doc__.split("\n")[0])
    parser.add_argument("url")
    parser.add_argument("out", type=Path)
    parser.add_argument("--run", required=True, help="named into every Idempotency-Key")
    parser.add_argument("--stream", action="append", required=True, metavar="KIND:RATE")
    parser.add_argument("--seconds", type=float, required=True)
    parser.add_argument("--connections", type=int, default=64)
    parser.add_argument("--users", type=int, default=1000, help="order updates go to u-0 .. u-(N-1)")
    parser.add_argument("--order-channels", default="push")
    parser.add_argument("--code-offset", type=int, default=0, help="the first code user is otp-N")
    parser.add_argument("--timeout", type=float, default=10.0)
    parser.add_argument("--nice", type=int, default=0, help="this process's CPU nice (ops.priority; below 0: root)")
    args = parser.parse_args(argv)
    if args.nice:
        from ops.priority import set_cpu_priority

        sys.stderr.write(f"  load generator: {set_cpu_priority(args.nice)}\n")
    try:
        import uvloop

        runner: Any = uvloop.run
    except ImportError:
        runner = asyncio.run
    records = runner(load(args.url, os.environ["BENCH_API_TOKEN"], args))
    with args.out.open("w", encoding="utf-8") as f:
        for r in records:
            f.write(json.dumps(r) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
