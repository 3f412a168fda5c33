"""A short probe of the push adapters alone (no broker, no store, no worker): N calls through the
FCM or APNs adapter, or a bare httpx HTTP/2 client posting the same bytes, to the HTTP provider
stub (bench/stubs/http.py, another process) over h2c, at most ``--in-flight`` at once. Prints
calls/s, this process's CPU per call (the stub's CPU is its own process's, not counted), the
stub's peak calls in flight and its HTTP/2 connections. Run it under ``py-spy record`` to see
where the CPU goes.

    python -m bench.push_probe --protocol fcm|apns|httpx --calls 3000 --latency-ms 200 --in-flight 400
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import tempfile
import time
from collections.abc import Awaitable
from pathlib import Path

import httpx

from bench.push_protocols import push_settings, write_push_keys
from bench.stubs.process import StubProcess
from operators.records import Category, Channel
from senders.providers import build_provider
from senders.runtime.metrics import Metrics
from senders.statuses import Lane
from senders.templates.render import MessageContext, PushContent, Rendered
from settings import Settings


def _message() -> Rendered:
    context = MessageContext(Category("transactional"), False, Lane.NORMAL, int(time.time() * 1000))
    return Rendered("order_shipped", 1, "en", Channel.PUSH, PushContent("Hi", "Your order has shipped."), context)


Run = tuple[int, float, float]  # calls that succeeded, CPU seconds, wall seconds (the calls only)


async def _timed(calls: list[Awaitable[bool]]) -> Run:
    cpu0, t0 = time.process_time(), time.monotonic()
    ok = sum(await asyncio.gather(*calls))
    return ok, time.process_time() - cpu0, time.monotonic() - t0


async def _adapter(protocol: str, origin: str, calls: int, in_flight: int, work: Path) -> Run:
    cfg = Settings().with_overrides(senders={
        **push_settings(protocol, origin, write_push_keys(work, origin)), "max_in_flight": in_flight})
    provider = build_provider(cfg.senders.push_primary, name=protocol, settings=cfg.senders, metrics=Metrics())
    gate = asyncio.Semaphore(in_flight)
    message = _message()

    async def one(i: int) -> bool:
        async with gate:
            try:
                await provider.send(to=f"{i:064x}", message_key=f"m{i}:push", message=message)
            except Exception:
                return False
            return True

    try:
        return await _timed([one(i) for i in range(calls)])
    finally:
        await provider.aclose()


async def _bare(origin: str, calls: int, in_flight: int) -> Run:
    """httpx's AsyncClient (h2c), the same kind of body, no adapter around it."""
    limits = httpx.Limits(max_connections=in_flight, max_keepalive_connections=in_flight)
    gate = asyncio.Semaphore(in_flight)
    async with httpx.AsyncClient(http1=False, http2=True, limits=limits, timeout=30.0) as client:

        async def one(i: int) -> bool:
            body = json.dumps({"message": {"token": f"{i:064x}", "data": {"message_key": f"m{i}:push"}}}).encode()
            async with gate:
                r = await client.post(f"{origin}/push/v1/projects/bench/messages:send", content=body,
                                      headers={"content-type": "application/json", "authorization": "Bearer x"})
                return r.status_code < 300

        return await _timed([one(i) for i in range(calls)])


def _cpu_s(pid: int) -> float:
    """User + system CPU seconds of process ``pid`` so far."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--protocol", choices=("fcm", "apns", "httpx"), default="fcm")
    parser.add_argument("--calls", type=int, default=3000)
    parser.add_argument("--latency-ms", type=float, default=200.0)
    parser.add_argument("--in-flight", type=int, default=400)
    args = parser.parse_args()
    with StubProcess("http", latency_ms=args.latency_ms) as stub, tempfile.TemporaryDirectory() as work:
        origin = f"http://127.0.0.1:{stub.port}"
        stub0 = _cpu_s(stub.pid)
        if args.protocol == "httpx":
            ok, cpu, wall = asyncio.run(_bare(origin, args.calls, args.in_flight))
        else:
            ok, cpu, wall = asyncio.run(_adapter(args.protocol, origin, args.calls, args.in_flight, Path(work)))
        stub_cpu = _cpu_s(stub.pid) - stub0
        summary = stub.summary()
        push = summary["channels"].get("push", {})
        print(json.dumps({
            "protocol": args.protocol, "calls": args.calls, "ok": ok, "latency_ms": args.latency_ms,
            "in_flight": args.in_flight, "calls_per_s": round(ok / wall, 1),
            "cpu_us_per_call": round(cpu / max(1, args.calls) * 1e6),
            "stub_cpu_us_per_call": round(stub_cpu / max(1, args.calls) * 1e6),
            "stub_peak_in_flight": push.get("peak_in_flight"),
            "stub_distinct_keys": push.get("distinct_keys"), "h2_connections": summary.get("h2_connections"),
        }))


if __name__ == "__main__":
    main()
