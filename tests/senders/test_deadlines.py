"""One deadline per send, whatever the server does meanwhile; a lease that does not outlast a
send is refused at start; no call is started that could outlive its claim's lease."""

from __future__ import annotations

import asyncio
import socket
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest

from operators import codec
from operators.errors import ConfigError
from operators.records import Channel
from senders.errors import ProviderRetryableError
from senders.policy.breaker import BreakerOptions
from senders.policy.bucket import RateLimit
from senders.providers import FakeProvider, HttpProvider, SmtpProvider
from senders.records import from_channel_record
from senders.runtime.dispatch import Dispatcher
from senders.runtime.metrics import Metrics
from senders.runtime.pool import build_pool
from senders.statuses import AttemptOutcome, Lane
from settings import Settings
from tests.senders.conftest import channel_message, sample_message, send_now


class TricklingHttp:
    """Answers "200 OK" one header byte every ``gap_s``: every read is quick, the reply is not."""

    def __init__(self, gap_s: float = 0.2, header_bytes: int = 30) -> None:
        self._srv = socket.create_server(("127.0.0.1", 0))
        self.port = self._srv.getsockname()[1]
        self._gap_s, self._n = gap_s, header_bytes
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self._srv.accept()
            except OSError:
                return
            threading.Thread(target=self._answer, args=(conn,), daemon=True).start()

    def _answer(self, conn: socket.socket) -> None:
        try:
            conn.recv(65536)
            conn.sendall(b"HTTP/1.1 200 OK\r\n")
            for _ in range(self._n):
                conn.sendall(b"X")
                time.sleep(self._gap_s)
            conn.sendall(b": y\r\nContent-Length: 2\r\n\r\n{}")
        except OSError:
            pass
        finally:
            conn.close()

    def close(self) -> None:
        self._srv.close()


@pytest.fixture
def trickling() -> Iterator[TricklingHttp]:
    server = TricklingHttp()
    yield server
    server.close()


def _send(provider: HttpProvider | SmtpProvider, to: str = "+1", channel: Channel = Channel.SMS) -> Any:
    return send_now(provider, to=to, message_key="k:sms", message=sample_message(channel))


def test_an_http_send_ends_at_its_deadline_though_every_read_is_quick(trickling: TricklingHttp) -> None:
    provider = HttpProvider(name="slow", url=f"http://127.0.0.1:{trickling.port}/send", timeout_s=1.0)
    start = time.monotonic()
    with pytest.raises(ProviderRetryableError, match="no reply within 1 s"):
        _send(provider)
    assert time.monotonic() - start < 1.5


class _SlowSmtp:
    """Each SMTP step takes ``step_s``: none is slower than the timeout, all together are."""

    def __init__(self, step_s: float) -> None:
        self.step_s = step_s
        self.delivered = 0

    async def handle_MAIL(self, server: Any, session: Any, envelope: Any, address: str, options: Any) -> str:  # noqa: N802
        await asyncio.sleep(self.step_s)
        envelope.mail_from = address
        return "250 OK"

    async def handle_RCPT(self, server: Any, session: Any, envelope: Any, address: str, options: Any) -> str:  # noqa: N802
        await asyncio.sleep(self.step_s)
        envelope.rcpt_tos.append(address)
        return "250 OK"

    async def handle_DATA(self, server: Any, session: Any, envelope: Any) -> str:  # noqa: N802
        await asyncio.sleep(self.step_s)
        self.delivered += 1
        return "250 accepted"


def test_an_smtp_send_ends_at_its_deadline_though_every_step_is_quick() -> None:
    from aiosmtpd.controller import Controller

    from harness.ports import free_port

    handler = _SlowSmtp(step_s=0.45)
    controller = Controller(handler, hostname="127.0.0.1", port=free_port())
    controller.start()
    try:
        provider = SmtpProvider(
            name="smtp", host="127.0.0.1", port=controller.port, sender="n@example.com", timeout_s=1.0
        )
        start = time.monotonic()
        with pytest.raises(ProviderRetryableError, match="no reply within 1 s"):
            _send(provider, to="ann@example.com", channel=Channel.EMAIL)
        assert time.monotonic() - start < 1.4
    finally:
        controller.stop()


@pytest.mark.parametrize(
    ("senders", "message"),
    [
        ({"sms_primary": "http://sms.example/send", "http_timeout_ms": 5000, "lease_ms": 5000}, "http_timeout_ms"),
        ({"email_primary": "smtp", "smtp_timeout_ms": 10_000, "lease_ms": 10_500}, "smtp_timeout_ms"),
    ],
)
def test_a_lease_that_does_not_outlast_a_send_is_refused_at_start(senders: dict[str, object], message: str) -> None:
    cfg = Settings().with_overrides(senders=senders)
    channel = Channel.SMS if "sms_primary" in senders else Channel.EMAIL
    with pytest.raises(ConfigError, match=f"lease_ms .* must exceed .*{message}"):
        build_pool(cfg, channels=[channel], lanes=[Lane.NORMAL])


def test_no_call_starts_when_the_rate_limit_wait_would_outlast_the_lease() -> None:
    fake = FakeProvider()
    dispatcher = Dispatcher(
        channel=Channel.SMS,
        primary=fake,
        secondary=None,
        limit=RateLimit(per_second=1.0, burst=1),
        breaker=BreakerOptions(),
        metrics=Metrics(),
    )
    raw = codec.encode("channel_message", channel_message(1))
    d = from_channel_record(raw, key=None, lane=Lane.NORMAL, source_topic="sms")
    assert asyncio.run(dispatcher.send(d, "+1", sample_message(Channel.SMS), budget_s=0.5)).outcome is AttemptOutcome.SENT
    result = asyncio.run(dispatcher.send(d, "+1", sample_message(Channel.SMS), budget_s=0.5))  # the next token is 1 s away
    assert result.outcome is AttemptOutcome.TRANSIENT and "rate limit" in result.reason
    assert len(fake.received()) == 1
    assert asyncio.run(dispatcher.send(d, "+1", sample_message(Channel.SMS), budget_s=5.0)).outcome is AttemptOutcome.SENT  # it waits when it may
