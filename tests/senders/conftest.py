"""Fixtures of the sender tests: settings on the session broker with fresh topics, channel
messages to produce, and readers of what the workers wrote (read_committed, decoded)."""

from __future__ import annotations

import asyncio
import re
import shutil
import time
import uuid
import zlib
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import pytest

from harness.provider_servers.tls import Pki, make_pki
from operators import codec
from operators.contract import Topics
from operators.records import Channel
from ops import kafka_io
from senders.profiles.crypto import ContactCipher, generate_key
from senders.profiles.model import Profile, parse_profile
from senders.providers import Provider, Receipt
from senders.rules.options import RuleOptions
from senders.runtime.pool import ensure_topics, open_profile_store
from senders.runtime.ruling import RulesContext
from senders.store.profiles import ProfileCache, ProfileStore
from senders.store.status import StatusStore
from senders.templates.catalog import load_catalog
from senders.templates.options import TemplateOptions
from senders.templates.render import EmailContent, PushContent, Rendered, SmsContent
from senders.templates.sms import SmsEncoding
from settings import REPO_ROOT, Settings

#: the tests' contact keys (one pair per test session)
CONTACT_KEYS = {"contact_encryption_keys": generate_key(), "contact_lookup_keys": generate_key()}
CIPHER = ContactCipher([CONTACT_KEYS["contact_encryption_keys"]], [CONTACT_KEYS["contact_lookup_keys"]])

#: the tests' own template: transactional, every channel, no parameters (any message renders)
TMPL = {
    "template.toml": 'kind = "transactional"\nchannels = ["push", "sms", "email"]\n',
    "v1.toml": (
        "published_at = 2025-01-01T00:00:00Z\n"
        '[en.push]\ntitle = "Test"\nbody = "A test notification."\n'
        '[en.sms]\ntext = "A test notification."\n'
        '[en.email]\nsubject = "Test"\ntext = "A test notification."\nhtml = "<p>A test notification.</p>"\n'
    ),
}


def templates_dir(root: Path) -> Path:
    """The shipped templates plus ``tmpl``, under ``root``."""
    target = root / "templates"
    if not target.exists():
        shutil.copytree(REPO_ROOT / "templates", target)
        (target / "tmpl").mkdir()
        for name, text in TMPL.items():
            (target / "tmpl" / name).write_text(text, encoding="utf-8")
    return target


def address_of(user: str, channel: Channel) -> str:
    """The address ``register_users`` gives a user on a channel (``user-7``: ``+15550000007``)."""
    if channel is Channel.PUSH:
        return f"tok-{user}"
    if channel is Channel.EMAIL:
        return f"{user}@example.com"
    number = re.fullmatch(r".*?(\d+)", user)
    digits = int(number.group(1)) if number else zlib.crc32(user.encode()) % 10_000_000
    return f"+1555{digits:07d}"


def profile_of(user: str, channels: Iterable[Channel] = tuple(Channel), **preferences: Any) -> Profile:
    contacts = {c.value: [address_of(user, c)] for c in channels}
    return parse_profile({**preferences, "contacts": contacts})


def register_users(cfg: Settings, users: Iterable[str], channels: Iterable[Channel] = tuple(Channel)) -> None:
    """A profile for each user with an address on each channel (``address_of``)."""
    chosen = tuple(channels)
    open_profile_store(cfg).put_many((user, profile_of(user, chosen)) for user in dict.fromkeys(users))


def rules_for_tests(root: Path, retention_ms: int = 10**12, **options: Any) -> RulesContext:
    """The rules a handler test runs with: the templates of ``templates_dir(root)``."""
    templates = TemplateOptions(directory=str(templates_dir(root)))
    return RulesContext(load_catalog(templates), RuleOptions(**options), templates, CIPHER.lookup_hash, retention_ms)


def profiles_for_tests(store: StatusStore, ttl_ms: int = 0) -> ProfileCache:
    return ProfileCache(ProfileStore(store.db, CIPHER), ttl_ms)


def send_now(provider: Provider, **kwargs: Any) -> Receipt:
    """``provider.send(**kwargs)`` on an event loop of its own, the provider's connections closed
    after it (a test's one call)."""

    async def go() -> Receipt:
        try:
            return await provider.send(**kwargs)
        finally:
            await provider.aclose()

    return asyncio.run(go())


def sample_message(channel: Channel) -> Rendered:
    """A rendered message for a provider test."""
    content: PushContent | SmsContent | EmailContent
    if channel is Channel.PUSH:
        content = PushContent(title="Hi", body="Your order 1001 has shipped.")
    elif channel is Channel.SMS:
        content = SmsContent(text="Your code is 123456.", encoding=SmsEncoding.GSM7, segments=1)
    else:
        content = EmailContent(subject="Order 1001", text="Your order has shipped.", html="<p>Shipped</p>")
    return Rendered("otp" if channel is Channel.SMS else "order_shipped", 1, "en", channel, content)

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
        "templates_dir": str(templates_dir(tmp_path)),
        "profile_cache_ttl_ms": 200,
        **CONTACT_KEYS,
    }
    values.update(overrides)
    return values


@pytest.fixture
def senders_settings(
    kafka_bootstrap: str, topic_factory: Callable[..., Topics], tmp_path: Path
) -> SettingsFactory:
    """``senders_settings(partitions=2, users=200, **senders_overrides)``: Settings with fresh
    channel, status, dead-letter and delay topics, and profiles for ``user-0`` ... ``user-<users-1>``
    (``channel_message``'s users) with an address on each channel (``address_of``)."""

    def make(partitions: int = 2, users: int = 200, **overrides: object) -> Settings:
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
        register_users(cfg, (f"user-{i}" for i in range(users)))
        return cfg

    return make


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


def count_status(store: StatusStore, status: str) -> int:
    """How many rows have this status (one query: cheap enough to poll while thousands are sent)."""
    with store.db.tx(write=False) as cur:
        found = store.db.exec(cur, "SELECT COUNT(*) FROM delivery_status WHERE status = ?", (status,)).fetchone()
    return int(found[0])


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


@pytest.fixture
def pki(tmp_path: Path) -> Pki:
    """A throwaway CA and a localhost certificate it signed (the protocol servers' TLS)."""
    return make_pki(tmp_path / "pki")
