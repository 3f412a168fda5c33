"""The senders' part of ``dedupctl demo``: deliver what the dedup job wrote to the channel topics,
through scripted fake providers (a flaky SMS gateway, a bad email address), and print each attempt."""

from __future__ import annotations

import shutil
import tempfile
import threading
import time
import uuid
from collections import Counter
from collections.abc import Callable
from pathlib import Path

from operators import codec
from operators.records import Channel
from ops import kafka_io
from senders.providers import FakeProvider
from senders.runtime.handler import AttemptEvent
from senders.runtime.pool import (
    ALL_CHANNELS,
    ALL_LANES,
    build_pool,
    ensure_topics,
    open_status_store,
    source_topic,
)
from senders.statuses import FINAL_STATUSES
from senders.store.addresses import StaticAddresses
from settings import Settings

#: the scenario's users (harness/scenario.py); the addresses never appear in the output
DEMO_ADDRESSES = {
    "u-alice": {"push": "device-alice", "email": "alice@example.com"},
    "u-bob": {"sms": "+15550100"},
    "u-carol": {"email": "carol@mailbox.invalid"},
    "u-dave": {"push": "device-dave"},
    "u-erin": {"sms": "+15550101"},
    "u-frank": {"email": "frank@example.com"},
    "u-grace": {"email": "grace@example.com"},
    "u-heidi": {"push": "device-heidi"},
    "u-ivan": {"push": "device-ivan"},
}


def demo_providers() -> dict[Channel, tuple[FakeProvider, None]]:
    """The scenario's outside world: the SMS gateway fails Bob's message twice, then takes it;
    Carol's mailbox does not exist."""
    return {
        Channel.PUSH: (FakeProvider(name="push-service"), None),
        Channel.SMS: (
            FakeProvider(name="sms-gateway", script={"+15550100": ["transient", "transient", "ok"]}),
            None,
        ),
        Channel.EMAIL: (
            FakeProvider(name="mail-relay", script={"carol@mailbox.invalid": ["permanent"]}),
            None,
        ),
    }


def _describe(e: AttemptEvent) -> str:
    line = f"  {e.channel.value:<5} {e.lane.value:<8} {e.message_key}  attempt {e.attempt}: {e.outcome}"
    if e.provider:
        line += f" via {e.provider}"
    if e.outcome not in ("sent", "skipped") and e.detail:
        line += f" ({e.detail})"
    if e.retry_in_ms is not None:
        line += f", retry in {e.retry_in_ms / 1000:.1f} s"
    if e.dead_letter is not None:
        line += f" -> dead letter ({e.dead_letter})"
    return line


def run_senders_demo(cfg: Settings, say: Callable[[str], None], timeout_s: float = 60.0) -> None:
    """Run every channel's workers until each message of the channel topics is sent or dead-lettered."""
    work = Path(tempfile.mkdtemp(prefix="notify-senders-demo-"))
    run = uuid.uuid4().hex[:8]
    cfg = cfg.with_overrides(
        senders={
            "group_prefix": f"demo-senders-{run}",
            "instance_id": run,
            "status_store": str(work / "status.sqlite3"),
            "sqlite_synchronous": "NORMAL",
            "base_backoff_ms": 1000,
            "max_attempts": 4,
            "jitter_ratio": 0.1,
            "poll_timeout_ms": 50,
            "lease_ms": 5000,
            "session_timeout_ms": 6000,
            "transaction_timeout_ms": 10000,
            "push_primary": "fake",
            "sms_primary": "fake",
            "email_primary": "fake",
        }
    )
    keys = _channel_message_keys(cfg)
    say("")
    say(
        f"Senders: delivering {len(keys)} channel messages (scripted providers: a flaky SMS gateway,"
        " a mailbox that does not exist); retries after 1, 2, 4 s"
    )
    ensure_topics(cfg)
    lock = threading.Lock()

    def on_attempt(event: AttemptEvent) -> None:
        with lock:
            say(_describe(event))

    store = open_status_store(cfg)
    pool = build_pool(
        cfg, providers=demo_providers(), addresses=StaticAddresses(DEMO_ADDRESSES), on_attempt=on_attempt
    )
    try:
        pool.start()
        deadline = time.monotonic() + timeout_s
        while True:
            rows = {r.message_key: r for r in store.rows()}
            if all(k in rows and rows[k].status in FINAL_STATUSES for k in keys):
                break
            if pool.errors or time.monotonic() > deadline:
                raise TimeoutError(
                    f"senders not settled after {timeout_s:.0f} s ({len(rows)} of {len(keys)} seen)"
                )
            time.sleep(0.2)
        time.sleep(0.5)  # the last batch's transaction
    finally:
        pool.stop()
        store.close()
    finals = Counter(r.status.value for r in rows.values() if r.message_key in keys)
    letters = Counter(
        codec.decode("dead_letter", m.value)["reason_kind"]
        for m in kafka_io.read_committed(
            cfg.kafka.client_config(), [cfg.senders.dlq_topic], idle_timeout_s=1.0
        )
        if m.value is not None
    )
    say(
        f"Settled: {dict(sorted(finals.items()))}; dead letters in {cfg.senders.dlq_topic}: {dict(letters)};"
        f" sends {pool.metrics.value('sender_sends_total', outcome='sent'):.0f},"
        f" retries {pool.metrics.value('sender_retries_total'):.0f}"
    )
    shutil.rmtree(work, ignore_errors=True)


def _channel_message_keys(cfg: Settings) -> set[str]:
    topics = [source_topic(cfg, c, lane) for c in ALL_CHANNELS for lane in ALL_LANES]
    return {
        codec.decode("channel_message", m.value)["message_key"]
        for m in kafka_io.read_committed(cfg.kafka.client_config(), topics, idle_timeout_s=1.0)
        if m.value is not None
    }
