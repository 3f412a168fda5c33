"""Fixtures of the sender tests: settings on the session broker with fresh topics, channel
messages to produce, and readers of what the workers wrote (read_committed, decoded)."""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import pytest
from pydantic import SecretStr

from operators import codec
from operators.contract import Topics
from operators.records import Channel
from ops import kafka_io
from senders.runtime.pool import ensure_topics
from settings import Settings

SettingsFactory = Callable[..., Settings]

#: the two status stores: SQLite (the embedded default) and PostgreSQL (the shared one)
STORES = ("sqlite", "postgresql")


@pytest.fixture(params=STORES)
def store_location(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """A fresh status store location of each kind: a SQLite file, or a new PostgreSQL database."""
    if request.param == "postgresql":
        return str(request.getfixturevalue("postgres_dsn"))
    return str(tmp_path / f"store-{uuid.uuid4().hex[:8]}.sqlite3")


def fast_senders(tmp_path: Path, **overrides: object) -> dict[str, object]:
    """Test configuration: 1 s base backoff (retries at 1, 2, 4 s), 4 attempts, short timeouts."""
    run = uuid.uuid4().hex[:8]
    values: dict[str, object] = {
        "group_prefix": f"senders-{run}",
        "instance_id": f"i{run}",
        "base_backoff_ms": 1000,
        "max_attempts": 4,
        "jitter_ratio": 0.1,
        "batch_size": 100,
        "poll_timeout_ms": 50,
        "lease_ms": 3000,
        "http_timeout_ms": 1500,  # a send's deadline: the lease must exceed it by a second
        "smtp_timeout_ms": 1500,
        "session_timeout_ms": 6000,
        "transaction_timeout_ms": 10000,
        "status_store": str(tmp_path / f"status-{run}.sqlite3"),
        "sqlite_synchronous": "NORMAL",
        "push_primary": "fake",
        "sms_primary": "fake",
        "email_primary": "fake",
        "push_rate_per_sec": 10000.0,
        "sms_rate_per_sec": 10000.0,
        "email_rate_per_sec": 10000.0,
        "rate_burst": 100,
        "breaker_open_ms": 1000,
        "metrics_log_interval_s": 0,
    }
    values.update(overrides)
    return values


@pytest.fixture
def senders_settings(
    kafka_bootstrap: str, topic_factory: Callable[..., Topics], tmp_path: Path
) -> SettingsFactory:
    """``senders_settings(partitions=2, **senders_overrides)``: Settings with fresh channel,
    status, dead-letter and delay topics."""

    def make(partitions: int = 2, **overrides: object) -> Settings:
        topics = topic_factory(partitions=partitions)
        prefix = topics.requests.split("notifications.")[0]
        senders = fast_senders(
            tmp_path, status_topic=f"{prefix}notifications.status", dlq_topic=f"{prefix}notifications.dlq"
        )
        senders.update(overrides)
        cfg = Settings(topics=topics).with_overrides(
            kafka={"bootstrap_servers": kafka_bootstrap, "partitions": partitions},
            senders=senders,
        )
        cfg = cfg.with_overrides()
        ensure_topics(cfg)
        return cfg

    return make


def write_config(cfg: Settings, path: Path) -> Path:
    """The test's settings as a TOML file, for ``dedupctl --config``."""
    lines: list[str] = []
    for section in ("kafka", "topics", "senders"):
        lines.append(f"[{section}]")
        part = getattr(cfg, section)
        items = part.by_role().items() if section == "topics" else ((n, getattr(part, n)) for n in type(part).model_fields)
        for name, value in items:
            if value is None:
                continue
            if isinstance(value, bool):
                lines.append(f"{name} = {str(value).lower()}")
            elif isinstance(value, int | float):
                lines.append(f"{name} = {value!r}")
            else:
                text = value.get_secret_value() if isinstance(value, SecretStr) else str(value)
                lines.append(f"{name} = {json.dumps(text)}")
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


def channel_message(
    n: int | str,
    *,
    channel: Channel = Channel.SMS,
    user: str | None = None,
    params: dict[str, str] | None = None,
    priority: str = "normal",
    template: str = "tmpl",
) -> dict[str, Any]:
    dedup_key = f"k{n}"
    return {
        "message_key": f"{dedup_key}:{channel.value}",
        "channel": channel.value,
        "notification_id": f"n-{n}",
        "user_id": user or f"user-{n}",
        "template_id": template,
        "params": params if params is not None else {"n": str(n)},
        "channels": [channel.value],
        "priority": priority,
        "category": "transactional",
        "event_time": 1_796_115_600_000,
        "dedup_key": dedup_key,
        "dedup_ttl_sec": None,
    }


def produce_messages(bootstrap: str, topic: str, messages: Iterable[dict[str, Any]]) -> int:
    """One batched producer for all of them (fast enough for 10,000)."""
    prod = kafka_io.producer({"bootstrap.servers": bootstrap}, **{"linger.ms": "20"})
    return kafka_io.produce_all(
        prod, topic, ((m["user_id"].encode(), codec.encode("channel_message", m)) for m in messages)
    )


def read_records(
    bootstrap: str, topic: str | list[str], stem: str, idle_s: float = 1.0
) -> list[dict[str, Any]]:
    """Every committed record of the topic(s), decoded."""
    topics = [topic] if isinstance(topic, str) else topic
    return [
        codec.decode(stem, msg.value)
        for msg in kafka_io.read_committed({"bootstrap.servers": bootstrap}, topics, idle_timeout_s=idle_s)
        if msg.value is not None
    ]


def wait_until(
    predicate: Callable[[], bool], timeout_s: float, what: str | Callable[[], str], interval_s: float = 0.05
) -> None:
    """Poll until ``predicate()``; ``what`` (or what it returns) explains a timeout."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(interval_s)
    raise AssertionError(f"not within {timeout_s:g} s: {what() if callable(what) else what}")
