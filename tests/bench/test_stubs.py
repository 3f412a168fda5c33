"""The delivery benchmark's provider stubs (bench/stubs): each counts calls, distinct and repeated
message keys and the calls in flight right, over HTTP/1.1, h2c (prior knowledge) and SMTP, and
answers after its latency."""

from __future__ import annotations

import asyncio
import smtplib
import time
from concurrent.futures import ThreadPoolExecutor
from email.message import EmailMessage
from pathlib import Path

import httpx
import pytest

from bench.push_protocols import push_settings, write_push_keys
from bench.stubs.process import StubProcess
from bench.stubs.tally import Tally
from senders.providers import build_provider
from senders.runtime.metrics import Metrics
from settings import Settings
from tests.senders.push_helpers import push, send_all


def test_tally_counts_distinct_repeated_and_in_flight() -> None:
    t = Tally()
    for i, key in enumerate(["a", "b", "a", None, "c", "a"]):
        t.arrive(key, 100.0 + i * 0.4, message_key=f"mk-{key}" if key == "c" else None)
    assert (t.calls, t.distinct, len(t.repeats), t.no_key) == (6, 3, 2, 1)
    assert t.peak_in_flight == 6
    for _ in range(4):
        t.answered()
    t.arrive("d", 103.0)
    assert (t.in_flight, t.peak_in_flight) == (3, 6)
    assert t.arrivals() == {"a": 100.0, "b": 100.4, "mk-c": 101.6, "d": 103.0}
    assert [k for k, _ in t.repeats] == ["a", "a"]
    summary = t.summary()
    # whole seconds 100..103: 3, 2, 1, 1 calls; the first and the last seconds are partial
    assert summary["peak_calls_per_s"] == 2
    assert summary["repeated_key_calls"] == 2 and summary["distinct_keys"] == 4


async def _h1_calls(port: int, keys: list[str], path: str) -> list[float]:
    """Each key on its own connection, all at once; returns each call's time to its answer."""

    async def one(key: str) -> float:
        started = time.monotonic()
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        body = b'{"to": "x"}'
        writer.write(
            f"POST {path} HTTP/1.1\r\nHost: stub\r\nIdempotency-Key: {key}\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(body)}\r\n\r\n".encode() + body
        )
        await writer.drain()
        status = await reader.readuntil(b"\r\n")
        assert status.startswith(b"HTTP/1.1 200")
        head = await reader.readuntil(b"\r\n\r\n")
        length = int(head.lower().split(b"content-length:")[1].split(b"\r\n")[0])
        assert b'"id"' in await reader.readexactly(length)
        writer.close()
        return time.monotonic() - started

    return list(await asyncio.gather(*(one(k) for k in keys)))


def test_http_stub_counts_concurrent_http1_calls_and_their_keys() -> None:
    with StubProcess("http", latency_ms=1000) as stub:
        keys = [f"k{i}" for i in range(300)] + ["k1", "k2", "k3"]
        times = asyncio.run(_h1_calls(stub.port, keys, "/sms"))
        assert min(times) >= 0.99  # answered after the latency
        s = stub.summary()["channels"]["sms"]
        # all 303 arrive within the second before the first answer: all in flight at once
        assert (s["calls"], s["distinct_keys"], s["repeated_key_calls"], s["peak_in_flight"]) == (303, 300, 3, 303)
        assert s["in_flight"] == 0
        dump = stub.dump("sms")
        assert dump is not None and set(dump["arrivals"]) == {f"k{i}" for i in range(300)}
        assert sorted(k for k, _ in dump["repeats"]) == ["k1", "k2", "k3"]
        assert stub.count("push") == 0
        stub.reset()
        stub.set_latency(0)
        assert max(asyncio.run(_h1_calls(stub.port, ["x"], "/push/v1"))) < 0.5
        assert stub.count("push") == 1 and stub.count("sms") == 0


async def _h2_calls(port: int, keys: list[str]) -> dict[int, int]:
    """All keys as streams of one HTTP/2 connection (prior knowledge), sent at once; returns each
    stream's status."""
    import h2.config
    import h2.connection
    import h2.events

    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    conn = h2.connection.H2Connection(h2.config.H2Configuration(client_side=True))
    conn.initiate_connection()
    conn.update_settings({h2.settings.SettingCodes.MAX_CONCURRENT_STREAMS: 1000})
    statuses: dict[int, int] = {}
    for key in keys:
        sid = conn.get_next_available_stream_id()
        conn.send_headers(sid, [(":method", "POST"), (":path", "/push"), (":scheme", "http"),
                                (":authority", "stub"), ("idempotency-key", key)])
        conn.send_data(sid, b"{}", end_stream=True)
    writer.write(conn.data_to_send())
    ended = 0
    while ended < len(keys):
        data = await reader.read(65536)
        assert data, "the stub closed the connection"
        for event in conn.receive_data(data):
            if isinstance(event, h2.events.ResponseReceived):
                statuses[event.stream_id] = int(dict(event.headers)[b":status"])
            elif isinstance(event, h2.events.DataReceived):
                conn.acknowledge_received_data(event.flow_controlled_length, event.stream_id)
            elif isinstance(event, h2.events.StreamEnded):
                ended += 1
        writer.write(conn.data_to_send())
    writer.close()
    return statuses


def test_http_stub_speaks_h2c_with_prior_knowledge_many_streams_on_one_connection() -> None:
    async def httpx_calls(port: int) -> list[httpx.Response]:
        async with httpx.AsyncClient(http1=False, http2=True, base_url=f"http://127.0.0.1:{port}") as client:
            return list(await asyncio.gather(
                *(client.post("/push", json={"n": i}, headers={"Idempotency-Key": f"x{i}"}) for i in range(20))))

    with StubProcess("http", latency_ms=1000) as stub:
        statuses = asyncio.run(_h2_calls(stub.port, [f"p{i % 250}" for i in range(300)]))
        assert len(statuses) == 300 and set(statuses.values()) == {200}
        summary = stub.summary()
        s = summary["channels"]["push"]
        assert (s["calls"], s["distinct_keys"], s["repeated_key_calls"], s["peak_in_flight"]) == (300, 250, 50, 300)
        assert summary["h2_connections"] == 1 and summary["peak_connections"] == 1
        # a well-kept client (the senders' kind) with prior knowledge: HTTP/2, a provider id each
        stub.reset()
        replies = asyncio.run(httpx_calls(stub.port))
        assert {r.http_version for r in replies} == {"HTTP/2"} and {r.status_code for r in replies} == {200}
        assert len({r.json()["id"] for r in replies}) == 20 and stub.count("push") == 20


@pytest.mark.parametrize("protocol", ["fcm", "apns"])
def test_http_stub_takes_the_fcm_and_apns_adapters_many_calls_on_few_connections(
    protocol: str, tmp_path: Path
) -> None:
    """The benchmark's push protocols (bench/push_protocols.py): the real adapters, built from the
    settings the benchmark writes, against the stub over h2c; it counts each message key once
    (from the body: neither protocol has an Idempotency-Key), answers FCM's token endpoint, and
    the 40 calls after its latency share a connection as streams."""
    with StubProcess("http", latency_ms=300) as stub:
        origin = f"http://127.0.0.1:{stub.port}"
        cfg = Settings().with_overrides(
            senders=push_settings(protocol, origin, write_push_keys(tmp_path, origin)))
        provider = build_provider(cfg.senders.push_primary, name=protocol, settings=cfg.senders, metrics=Metrics(),
                                  max_connections=8)
        results = send_all(provider, [(f"{i:064x}", f"m{i}:push", push()) for i in range(40)])
        assert [type(r).__name__ for r in results] == ["Receipt"] * 40
        summary = stub.summary()
        calls = summary["channels"]["push"]
        assert (calls["calls"], calls["distinct_keys"], calls["calls_without_key"]) == (40, 40, 0)
        assert calls["peak_in_flight"] >= 20  # streams at once, not one call after another
        assert 1 <= summary["h2_connections"] <= 2  # (FCM's token fetch may take a connection of its own)
        assert set(stub.dump("push")["arrivals"]) == {f"m{i}:push" for i in range(40)}  # type: ignore[index]
        if protocol == "fcm":
            assert summary["channels"]["token"]["calls"] == 1  # one access token for every call


def _mail(key: str) -> EmailMessage:
    msg = EmailMessage()
    msg["From"] = "bench@localhost"
    msg["To"] = "u@example.com"
    msg["Subject"] = "x"
    msg["Message-ID"] = f"<{key}@bench>"
    msg["X-Notify-Message-Key"] = f"mk:{key}"
    msg.set_content("hello")
    return msg


def test_smtp_stub_counts_messages_by_message_id_and_keeps_the_message_key() -> None:
    with StubProcess("smtp", latency_ms=500) as stub:

        def send(key: str) -> float:
            started = time.monotonic()
            with smtplib.SMTP("127.0.0.1", stub.port, timeout=30) as smtp:
                smtp.send_message(_mail(key))
            return time.monotonic() - started

        keys = [f"m{i}" for i in range(40)] + ["m0"]
        with ThreadPoolExecutor(len(keys)) as pool:
            times = list(pool.map(send, keys))
        assert min(times) >= 0.5
        s = stub.summary()["channels"]["email"]
        assert (s["calls"], s["distinct_keys"], s["repeated_key_calls"]) == (41, 40, 1)
        assert s["peak_in_flight"] >= 30  # 41 sessions started together, each held 0.5 s in DATA
        dump = stub.dump("email")
        assert dump is not None and set(dump["arrivals"]) == {f"mk:m{i}" for i in range(40)}
        # one connection, several messages (a pooled client): each counted
        with smtplib.SMTP("127.0.0.1", stub.port, timeout=30) as smtp:
            for key in ("n1", "n2", "n3"):
                smtp.send_message(_mail(key))
        assert stub.count("email") == 43


def test_a_stub_that_cannot_start_says_why() -> None:
    with StubProcess("http") as taken, pytest.raises(RuntimeError, match="the http stub failed"):
        StubProcess("http", port=taken.port)
