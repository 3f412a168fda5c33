"""The push adapters' HTTP/2 calls spread over connections (senders/providers/h2_pool.py): more calls
than one connection's streams open another connection, and a call that finds every stream taken
waits for one, within its deadline, without being sent."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from pathlib import Path

import pytest

from harness.provider_servers.apns import ApnsServer
from harness.provider_servers.h2 import Clock
from senders.providers import ApnsProvider, Receipt, build_provider
from senders.providers.credentials import ApnsSigningKey
from senders.providers.h2_pool import StreamPool
from senders.providers.http1 import HttpReply
from senders.runtime.metrics import Metrics
from settings import Settings
from tests.senders.push_helpers import push, send_all


def test_250_calls_against_a_server_of_100_streams_use_several_connections_each_key_once() -> None:
    clock = Clock()
    server = ApnsServer(pki=None, clock=clock, delay_s=0.5)
    server.max_streams = 100  # SETTINGS_MAX_CONCURRENT_STREAMS, as FCM's front ends
    server.start()
    try:
        key = ApnsSigningKey.parse(server.p8(), team_id=server.team_id, key_id=server.key_id)
        provider = ApnsProvider(name="apns", key=key, topic=server.topic, base_url=server.origin, timeout_s=20,
                                clock=clock, metrics=Metrics(), max_connections=250)
        calls = [(f"{i:064x}", f"k{i}:push", push()) for i in range(250)]
        results = send_all(provider, calls)
        assert [r for r in results if not isinstance(r, Receipt)] == []
        keys = [s.json()["message_key"] for s in server.seen]
        assert sorted(keys) == sorted(key for _, key, _ in calls)  # each once
        assert len(server.connections()) == 3  # ceil(250 / 100)
        assert server.peak_in_flight > 100  # not queued behind one connection's 100 streams
    finally:
        server.stop()


class _Held:
    """A connection whose calls are answered when ``release`` is set; counts what reached it."""

    def __init__(self, release: asyncio.Event, made: list[_Held]) -> None:
        self.release = release
        self.calls = 0
        self.open = 0
        self.peak = 0
        made.append(self)

    async def post(self, target: str, headers: Sequence[tuple[str, str]], body: bytes) -> HttpReply:
        self.calls += 1
        self.open += 1
        self.peak = max(self.peak, self.open)
        try:
            await self.release.wait()
        finally:
            self.open -= 1
        return HttpReply(200, {}, b"")

    async def aclose(self) -> None:
        pass


def test_calls_beyond_every_stream_wait_and_one_cut_while_waiting_is_never_sent() -> None:
    async def go() -> None:
        release = asyncio.Event()
        made: list[_Held] = []
        pool = StreamPool(lambda: _Held(release, made), calls=5, streams=2)  # 3 connections, 6 streams
        running = [asyncio.create_task(pool.post("/", [], b"")) for _ in range(6)]
        await asyncio.sleep(0)
        assert [c.calls for c in made] == [2, 2, 2]  # the least busy first, another only when all are full
        with pytest.raises(TimeoutError):
            async with asyncio.timeout(0.05):
                await pool.post("/", [], b"")  # every stream taken: waits, and is cut there
        assert sum(c.calls for c in made) == 6 and len(made) == 3  # the cut call reached no connection
        waiting = asyncio.create_task(pool.post("/", [], b""))
        await asyncio.sleep(0)
        release.set()
        replies = await asyncio.gather(*running, waiting)
        assert [r.status for r in replies] == [200] * 7
        assert max(c.peak for c in made) == 2 and len(made) == 3

    asyncio.run(go())


def test_the_streams_setting_caps_a_connection_and_the_calls_beyond_it_wait_for_a_stream(tmp_path: Path) -> None:
    """``senders.apns.streams_per_connection`` 2 with 2 calls open at once: one connection carrying
    two streams; the third and fourth calls wait for a stream (within their deadline) and are sent."""
    clock = Clock()
    server = ApnsServer(pki=None, clock=clock, delay_s=0.6).start()
    try:
        key_file = tmp_path / "AuthKey.p8"
        key_file.write_text(server.p8())
        cfg = Settings().with_overrides(senders={"push_primary": "apns", "http_timeout_ms": 5000, "apns": {
            "key_file": str(key_file), "team_id": server.team_id, "key_id": server.key_id, "topic": server.topic,
            "base_url": server.origin, "streams_per_connection": 2}})
        provider = build_provider("apns", name="apns", settings=cfg.senders, metrics=Metrics(), max_connections=2)
        results = send_all(provider, [(f"{i:064x}", f"k{i}:push", push()) for i in range(4)])
        assert [type(r).__name__ for r in results] == ["Receipt"] * 4
        assert len(server.connections()) == 1 and server.peak_in_flight == 2
        first, *_, last = sorted(s.at for s in server.seen)
        assert last - first >= 0.5  # the last two were sent once the first two were answered
    finally:
        server.stop()
