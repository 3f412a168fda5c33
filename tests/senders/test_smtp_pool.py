"""Email over SMTP under load, against a real local relay (aiosmtpd) through the senders' pool:
the relay's sessions are the calls in flight (one message each at a time, reused from message
to message), so hundreds of claimed emails never queue for a session inside their deadline;
a refused recipient is mapped as before and leaves its session in use."""

from __future__ import annotations

import asyncio
import contextlib
from collections import Counter
from collections.abc import Iterator
from typing import Any

import pytest
from aiosmtpd.controller import Controller
from aiosmtpd.smtp import SMTP, Envelope, Session

from harness.ports import free_port
from operators.records import Channel
from senders.runtime.pool import build_pool, open_status_store
from senders.statuses import FINAL_STATUSES, DeliveryStatus, Lane
from tests.senders.conftest import (
    SettingsFactory,
    address_of,
    channel_message,
    count_status,
    produce_messages,
    read_records,
    wait_until,
)

pytestmark = pytest.mark.integration
EMAIL, NORMAL = Channel.EMAIL, Lane.NORMAL
KEY_HEADER = "X-Notify-Message-Key"
#: a send may wait for its start on a loaded machine and still fit its deadline and lease; far
#: less than what 180 emails queued for 6 sessions of 200 ms take (6 s)
ROOMY = {"lease_ms": 8000, "smtp_timeout_ms": 3000}


class Relay:
    """aiosmtpd's handler: every message accepted ``latency_s`` after its DATA, the addresses in
    ``refuse`` refused at RCPT (550 5.1.1). Counts what a relay's operator sees: sessions open
    at once and opened in all, messages being answered at once, each message key's arrivals.
    (Touched only on the relay's own event loop; read once the senders are done.)"""

    def __init__(self, latency_s: float, refuse: frozenset[str] = frozenset()) -> None:
        self.latency_s = latency_s
        self.refuse = refuse
        self.sessions = self.peak_sessions = self.opened = 0
        self.answering = self.peak_answering = 0
        self.keys: Counter[str] = Counter()

    def connected(self) -> None:
        self.sessions += 1
        self.opened += 1
        self.peak_sessions = max(self.peak_sessions, self.sessions)

    async def handle_RCPT(  # noqa: N802 - aiosmtpd's hook
        self, server: SMTP, session: Session, envelope: Envelope, address: str, options: list[str]
    ) -> str:
        if address in self.refuse:
            return "550 5.1.1 Recipient address rejected: User unknown"
        envelope.rcpt_tos.append(address)
        return "250 OK"

    async def handle_DATA(self, server: SMTP, session: Session, envelope: Envelope) -> str:  # noqa: N802
        content = envelope.original_content or b""
        head = (content if isinstance(content, bytes) else content.encode()).split(b"\r\n\r\n", 1)[0]
        for line in head.decode("utf-8", "replace").split("\r\n"):
            if line.lower().startswith(KEY_HEADER.lower() + ":"):
                self.keys[line.split(":", 1)[1].strip()] += 1
        self.answering += 1
        self.peak_answering = max(self.peak_answering, self.answering)
        try:
            await asyncio.sleep(self.latency_s)
        finally:
            self.answering -= 1
        return "250 2.0.0 OK: queued"


class _Session(SMTP):
    """A session counts from its EHLO (the controller's own check at its start connects and
    says nothing) to its connection's end."""

    def __init__(self, relay: Relay, **options: Any) -> None:
        super().__init__(relay, **options)
        self._relay = relay
        self._counted = False

    async def smtp_EHLO(self, hostname: str) -> None:  # noqa: N802 - aiosmtpd's command
        if not self._counted:
            self._counted = True
            self._relay.connected()
        await super().smtp_EHLO(hostname)

    def connection_lost(self, exc: Exception | None) -> None:
        if self._counted:
            self._relay.sessions -= 1
        super().connection_lost(exc)


class _Controller(Controller):
    def factory(self) -> SMTP:
        return _Session(self.handler, **self.SMTP_kwargs)


@contextlib.contextmanager
def _serve(relay: Relay) -> Iterator[int]:
    """The relay on a free loopback port, in a thread of its own (aiosmtpd's controller)."""
    controller = _Controller(relay, hostname="127.0.0.1", port=free_port())
    controller.start()
    try:
        yield controller.port
    finally:
        controller.stop()


@pytest.fixture
def slow_relay() -> Iterator[tuple[Relay, int]]:
    """A relay that answers every message in 200 ms (the design's figure for a provider call)."""
    relay = Relay(latency_s=0.2)
    with _serve(relay) as port:
        yield relay, port


def test_hundreds_of_emails_share_the_pools_sessions_and_none_waits_past_its_deadline(
    senders_settings: SettingsFactory, kafka_bootstrap: str, slow_relay: tuple[Relay, int]
) -> None:
    """180 emails claimed at once (max_in_flight 400) against a relay with a 200 ms answer and a
    pool of 6 sessions: the relay sees 6 sessions open together, never more, each carrying one
    message after another; every message reaches it once and is sent at its first attempt
    (before, the 180 queued for 6 sessions inside their 3 s deadline: timeouts, retries, and
    emails the relay had taken sent again)."""
    relay, port = slow_relay
    n, sessions = 180, 6
    cfg = senders_settings(
        partitions=2, users=n, email_primary="smtp", smtp_host="127.0.0.1", smtp_port=port,
        smtp_pool_size=sessions, max_in_flight=400, **ROOMY,
    )
    store = open_status_store(cfg)
    keys = {f"k{i}:email" for i in range(n)}
    with build_pool(cfg, channels=[EMAIL], lanes=[NORMAL]) as pool:
        pool.wait_ready(30)
        produce_messages(kafka_bootstrap, cfg.topics.email, [channel_message(i, channel=EMAIL) for i in range(n)])
        wait_until(lambda: count_status(store, "sent") == n, 40, lambda: f"{count_status(store, 'sent')} of {n} sent")
        wait_until(lambda: not any(r.unpublished for r in store.rows()), 10, "all published")
    assert not pool.errors
    assert relay.keys == Counter(keys)  # each message key once: no email sent twice
    rows = store.rows()
    assert [r.status for r in rows] == [DeliveryStatus.SENT] * n
    statuses = read_records(kafka_bootstrap, cfg.senders.status_topic, "delivery_status")
    retried = Counter(r["error"] for r in statuses if r["status"] == "queued")
    assert all(r.attempts == 1 for r in rows), retried  # none timed out waiting for a session
    assert relay.peak_sessions == relay.peak_answering == sessions  # the whole pool at work, no more
    assert relay.opened == sessions  # each session carried message after message
    assert Counter(r["message_key"] for r in statuses if r["status"] == "sent") == Counter(keys)


def test_a_refused_recipient_is_mapped_as_before_and_its_session_carries_the_next_message(
    senders_settings: SettingsFactory, kafka_bootstrap: str
) -> None:
    """Every third address refused with 550 5.1.1: those messages end permanently failed with
    the address deactivated, the others are sent once; the sessions are reset and reused, not
    closed at every refusal."""
    n, sessions = 60, 3
    refused = frozenset(address_of(f"user-{i}", EMAIL) for i in range(0, n, 3))
    relay = Relay(latency_s=0.0, refuse=refused)
    with _serve(relay) as port:
        cfg = senders_settings(
            partitions=2, users=n, email_primary="smtp", smtp_host="127.0.0.1", smtp_port=port,
            smtp_pool_size=sessions,
        )
        store = open_status_store(cfg)
        with build_pool(cfg, channels=[EMAIL], lanes=[NORMAL]) as pool:
            pool.wait_ready(30)
            produce_messages(kafka_bootstrap, cfg.topics.email, [channel_message(i, channel=EMAIL) for i in range(n)])
            wait_until(lambda: sum(r.status in FINAL_STATUSES for r in store.rows()) == n, 30, "all final")
        assert not pool.errors
    by_key = {r.message_key: r for r in store.rows()}
    for i in range(n):
        row = by_key[f"k{i}:email"]
        if i % 3 == 0:
            assert (row.status, row.attempts) == (DeliveryStatus.FAILED, 1), (i, row)
            assert "SMTP 550 5.1.1" in (row.last_error or "")
        else:
            assert (row.status, row.attempts) == (DeliveryStatus.SENT, 1), (i, row)
    assert relay.keys == Counter(f"k{i}:email" for i in range(n) if i % 3)
    assert relay.opened <= sessions  # 20 refusals closed no session
