"""Sender processes: one killed mid-batch (SIGKILL) loses nothing and resends nothing recorded as
sent, on either store; two on one PostgreSQL store never send a message twice; a second one on a
SQLite store is refused, saying why."""

from __future__ import annotations

import signal
import subprocess
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest

from operators.records import Channel
from senders.runtime.pool import open_status_store
from senders.statuses import DeliveryStatus
from settings import Settings
from tests.senders.conftest import (
    SettingsFactory,
    channel_message,
    produce_messages,
    read_records,
    wait_until,
)
from tests.senders.fake_http import FakeHttpProvider
from tests.senders.processes import start_sender

pytestmark = pytest.mark.integration


@pytest.fixture
def http_provider() -> Iterator[FakeHttpProvider]:
    server = FakeHttpProvider(delay_s=0.01).start()
    yield server
    server.stop()


def _start(cfg: Settings, log: Path, **senders: str) -> subprocess.Popen[bytes]:
    return start_sender(cfg, log, **senders)


def test_a_worker_killed_mid_batch_loses_nothing_and_resends_nothing_recorded(
    senders_settings: SettingsFactory,
    kafka_bootstrap: str,
    http_provider: FakeHttpProvider,
    tmp_path: Path,
    store_location: str,
) -> None:
    n = 300
    # one call at a time: the window of a kill is that one call (tests/senders/test_in_flight.py
    # kills a process with hundreds open)
    cfg = senders_settings(
        partitions=2, users=n, email_primary=http_provider.url, batch_size=50, status_store=store_location,
        max_in_flight=1,
    )
    produce_messages(
        kafka_bootstrap, cfg.topics.email, [channel_message(i, channel=Channel.EMAIL) for i in range(n)]
    )
    keys = {f"k{i}:email" for i in range(n)}
    store = open_status_store(cfg)
    log = tmp_path / "worker.log"

    worker = _start(cfg, log)
    try:
        wait_until(lambda: len(http_provider.keys()) >= 80, 60, "the first worker is sending", 0.01)
        worker.send_signal(signal.SIGKILL)
        worker.wait(10)
    finally:
        worker.kill()
    rows = {r.message_key: r for r in store.rows()}
    recorded_sent = {k for k, r in rows.items() if r.status is DeliveryStatus.SENT}
    in_flight = {k for k, r in rows.items() if r.status is DeliveryStatus.SENDING}
    before = len(http_provider.keys())
    assert 0 < len(recorded_sent) < n, "the kill did not land mid-run"

    worker = _start(cfg, log)
    try:
        wait_until(
            lambda: sum(r.status is DeliveryStatus.SENT for r in store.rows()) == n,
            60,
            "the second worker finishes",
            0.2,
        )
        worker.send_signal(signal.SIGTERM)
        assert worker.wait(30) == 0, log.read_text()[-3000:]
    finally:
        worker.kill()

    received = http_provider.keys()
    after_kill = Counter(received[before:])
    assert not recorded_sent & set(after_kill), "a message the store had as sent was sent again"
    assert set(received) == keys  # nothing lost
    twice = {k for k, c in Counter(received).items() if c > 1}
    assert twice <= in_flight  # only the call the kill interrupted (the README's one gap)
    assert len(in_flight) <= 1
    # and each message has exactly one committed "sent" status, although a transaction was cut off
    sent_events = Counter(
        s["message_key"]
        for s in read_records(kafka_bootstrap, cfg.senders.status_topic, "delivery_status", idle_s=2.0)
        if s["status"] == "sent"
    )
    assert set(sent_events) == keys and set(sent_events.values()) == {1}


def test_the_marketing_limit_counts_once_across_a_worker_killed_mid_batch(
    senders_settings: SettingsFactory,
    kafka_bootstrap: str,
    http_provider: FakeHttpProvider,
    tmp_path: Path,
    store_location: str,
) -> None:
    """Two campaigns per user, one a day allowed: whatever the kill cuts short, each user gets
    exactly one, the other is rejected, and each user's counter holds one unit."""
    users = 120
    cfg = senders_settings(
        partitions=2, users=users, email_primary=http_provider.url, batch_size=20, status_store=store_location
    )
    campaigns = [
        {**channel_message(f"{i}-{c}", channel=Channel.EMAIL, user=f"user-{i}", template="weekly_digest",
                           params={"count": "3"}), "category": "marketing"}
        for c in ("a", "b")
        for i in range(users)
    ]
    produce_messages(kafka_bootstrap, cfg.topics.email, campaigns)
    store = open_status_store(cfg)
    log = tmp_path / "worker.log"
    worker = _start(cfg, log)
    try:
        wait_until(lambda: len(http_provider.keys()) >= 40, 60, "the first worker is sending", 0.01)
        worker.send_signal(signal.SIGKILL)
        worker.wait(10)
    finally:
        worker.kill()
    done = lambda: sum(r.status in (DeliveryStatus.SENT, DeliveryStatus.REJECTED) for r in store.rows())  # noqa: E731
    assert done() < 2 * users, "the kill did not land mid-run"
    worker = _start(cfg, log)
    try:
        wait_until(lambda: done() == 2 * users, 90, "the second worker finishes", 0.2)
        worker.send_signal(signal.SIGTERM)
        assert worker.wait(30) == 0, log.read_text()[-3000:]
    finally:
        worker.kill()
    rows = store.rows()
    by_user: dict[str, list[str]] = {}
    for r in rows:
        by_user.setdefault(r.user_id or "", []).append(f"{r.status}:{r.reason}")
    assert all(sorted(v) == ["rejected:marketing_limit", "sent:None"] for v in by_user.values()), by_user
    assert len(by_user) == users
    sent = {r.notification_id for r in rows if r.status is DeliveryStatus.SENT}
    for i in range(users):
        [unit] = [u for day in _days() for u in store.limit_units(f"marketing:user-{i}:{day}")]
        assert unit in sent and unit.startswith(f"n-{i}-")
    assert set(http_provider.keys()) == {r.message_key for r in rows if r.status is DeliveryStatus.SENT}


def _days() -> list[str]:
    """Today in UTC (the test users' zone), and yesterday if the day just changed."""
    import datetime as dt

    now = dt.datetime.now(dt.UTC)
    return sorted({now.date().isoformat(), (now - dt.timedelta(minutes=5)).date().isoformat()})


def test_two_processes_on_one_postgresql_store_never_send_a_message_twice(
    senders_settings: SettingsFactory,
    kafka_bootstrap: str,
    http_provider: FakeHttpProvider,
    tmp_path: Path,
    postgres_dsn: str,
) -> None:
    n = 600
    http_provider.delay_s = 0.02  # ~12 s of sending: the second process joins well before the end
    cfg = senders_settings(
        partitions=4, users=n, email_primary=http_provider.url, batch_size=20, status_store=postgres_dsn,
        max_in_flight=1,
    )
    produce_messages(
        kafka_bootstrap, cfg.topics.email, [channel_message(i, channel=Channel.EMAIL) for i in range(n)]
    )
    store = open_status_store(cfg)
    first = _start(cfg, tmp_path / "a.log", instance_id="proc-a")
    second = None
    try:
        wait_until(lambda: len(http_provider.keys()) >= 40, 60, "the first process is sending", 0.01)
        # the second joins mid-run: the group rebalances, uncommitted batches are read again
        second = _start(cfg, tmp_path / "b.log", instance_id="proc-b")
        wait_until(
            lambda: sum(r.status is DeliveryStatus.SENT for r in store.rows()) == n,
            90,
            "both processes finish",
            0.2,
        )
        for proc in (first, second):
            proc.send_signal(signal.SIGTERM)
        for proc, log in ((first, "a.log"), (second, "b.log")):
            assert proc.wait(30) == 0, (tmp_path / log).read_text()[-3000:]
    finally:
        first.kill()
        if second is not None:
            second.kill()
    sends = Counter(http_provider.keys())
    assert set(sends) == {f"k{i}:email" for i in range(n)}
    assert set(sends.values()) == {1}, {k: c for k, c in sends.items() if c > 1}
    owners = Counter(r.owner.split(".")[-2] for r in store.rows() if r.owner)  # <group>.<instance>.<n>/<run>
    assert set(owners) == {"proc-a", "proc-b"}, owners  # both took a share


def test_a_second_process_on_one_sqlite_store_is_refused_saying_why(
    senders_settings: SettingsFactory, kafka_bootstrap: str, http_provider: FakeHttpProvider, tmp_path: Path
) -> None:
    cfg = senders_settings(email_primary=http_provider.url)
    produce_messages(kafka_bootstrap, cfg.topics.email, [channel_message(1, channel=Channel.EMAIL)])
    first = _start(cfg, tmp_path / "a.log", instance_id="proc-a")
    try:
        wait_until(lambda: len(http_provider.keys()) >= 1, 60, "the first process runs")
        second = _start(cfg, tmp_path / "b.log", instance_id="proc-b")
        try:
            assert second.wait(60) == 2
        finally:
            second.kill()
        text = (tmp_path / "b.log").read_text()
        assert "the SQLite status store serves one process" in text
        assert "senders.status_store = postgresql://" in text
        assert first.poll() is None  # the first one goes on
    finally:
        first.send_signal(signal.SIGTERM)
        assert first.wait(30) == 0
