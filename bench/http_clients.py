"""CPU per provider call of the HTTP clients the senders could use, against a local stub in
another process (so only the client's CPU is counted): the senders' own HTTP/1.1 connections
(``senders.providers.http1``), httpx's AsyncClient, and aiohttp when it is installed.

    python -m bench.http_clients [--calls 5000] [--in-flight 200] [--default-loop]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing
import time
from collections.abc import Awaitable, Callable

from bench.senders_probe import _stub
from harness.ports import free_port

BODY = json.dumps(
    {"message_key": "k1:sms", "channel": "sms", "to": "+15550000001", "template": "otp", "template_version": 1,
     "locale": "en", "text": "Your code is 123456", "encoding": "gsm7", "segments": 1}
).encode()
HEADERS = [("Content-Type", "application/json"), ("Idempotency-Key", "k1:sms")]


async def _measure(call: Callable[[], Awaitable[None]], calls: int, in_flight: int) -> tuple[float, float]:
    limit = asyncio.Semaphore(in_flight)

    async def one() -> None:
        async with limit, asyncio.timeout(60):
            await call()

    await asyncio.gather(*(one() for _ in range(in_flight)))  # connections made, warm
    cpu, wall = time.process_time(), time.monotonic()
    await asyncio.gather(*(one() for _ in range(calls)))
    return (time.process_time() - cpu) / calls * 1e6, calls / (time.monotonic() - wall)


async def ours(port: int, calls: int, in_flight: int) -> tuple[float, float]:
    from senders.providers.http1 import Http1Pool

    pool = Http1Pool(host="127.0.0.1", port=port, tls=None, max_connections=in_flight, max_body=65536)

    async def call() -> None:
        reply = await pool.post("/v1/send", HEADERS, BODY)
        json.loads(reply.body)

    try:
        return await _measure(call, calls, in_flight)
    finally:
        await pool.aclose()


async def httpx_client(port: int, calls: int, in_flight: int) -> tuple[float, float]:
    import httpx

    limits = httpx.Limits(max_connections=in_flight, max_keepalive_connections=in_flight)
    async with httpx.AsyncClient(limits=limits, timeout=httpx.Timeout(60.0)) as client:

        async def call() -> None:
            (await client.post(f"http://127.0.0.1:{port}/v1/send", content=BODY, headers=HEADERS)).json()

        return await _measure(call, calls, in_flight)


async def aiohttp_client(port: int, calls: int, in_flight: int) -> tuple[float, float]:
    import aiohttp

    connector = aiohttp.TCPConnector(limit=in_flight)
    async with aiohttp.ClientSession(connector=connector, cookie_jar=aiohttp.DummyCookieJar()) as session:

        async def call() -> None:
            url = f"http://127.0.0.1:{port}/v1/send"
            async with session.post(url, data=BODY, headers=dict(HEADERS), allow_redirects=False) as reply:
                json.loads(await reply.read())

        return await _measure(call, calls, in_flight)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--calls", type=int, default=5000)
    parser.add_argument("--in-flight", type=int, default=200)
    parser.add_argument("--default-loop", action="store_true", help="asyncio's own loop, not uvloop")
    args = parser.parse_args()
    port = free_port()
    ours_end, stub_end = multiprocessing.Pipe()
    stub = multiprocessing.Process(target=_stub, args=(port, 0.0, stub_end), daemon=True)
    stub.start()
    assert ours_end.recv() == "ready"
    clients = {"senders http1": ours, "httpx": httpx_client}
    try:
        import aiohttp  # noqa: F401

        clients["aiohttp"] = aiohttp_client
    except ImportError:
        pass
    for name, client in clients.items():
        loop = asyncio.new_event_loop()
        if not args.default_loop:
            import uvloop

            loop = uvloop.new_event_loop()
        try:
            calls = args.calls if name != "httpx" else max(500, args.calls // 10)  # it is slow
            cpu_us, rate = loop.run_until_complete(client(port, calls, args.in_flight))
        finally:
            loop.close()
        print(f"{name:14s} {cpu_us:7.0f} us CPU per call  {rate:8.0f} calls/s  ({calls} calls, {args.in_flight} open)")
    ours_end.send("stop")
    ours_end.recv()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
