"""``dedupctl senders redrive``: a dead letter's message is sent again, once per dead letter."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import pytest

from dedupctl.cli import main as dedupctl
from harness.settings_file import write_settings
from operators.records import Channel
from ops import kafka_io
from senders.providers import FakeProvider
from senders.runtime.pool import build_pool, open_status_store
from senders.statuses import DeliveryStatus, Lane
from settings import Settings
from tests.senders.conftest import (
    SettingsFactory,
    address_of,
    channel_message,
    produce_messages,
    read_records,
    wait_until,
)

pytestmark = pytest.mark.integration
SMS, NORMAL = Channel.SMS, Lane.NORMAL


def _settle(cfg: Settings, fake: FakeProvider, keys: dict[str, DeliveryStatus], produce: Sequence[int] = ()) -> None:
    store = open_status_store(cfg)
    with build_pool(cfg, channels=[SMS], lanes=[NORMAL], providers={SMS: (fake, None)}) as pool:
        if produce:
            produce_messages(cfg.kafka.bootstrap_servers, cfg.topics.sms, [channel_message(i) for i in produce])
        wait_until(
            lambda: all((r := store.get(k)) is not None and r.status is s and not r.unpublished for k, s in keys.items()),
            25,
            lambda: f"{keys}: {[(r.message_key, r.status.value) for r in store.rows()]}",
        )
    assert not pool.errors
    store.close()


def _trail(cfg: Settings, key: str) -> list[tuple[str, int]]:
    return [
        (s["status"], s["attempt"])
        for s in read_records(cfg.kafka.bootstrap_servers, cfg.senders.status_topic, "delivery_status")
        if s["message_key"] == key
    ]


def test_a_dead_letter_is_redriven_once(
    senders_settings: SettingsFactory, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    cfg = senders_settings(max_attempts=2)
    fake = FakeProvider(script={address_of("user-1", SMS): ["transient", "transient", "ok"]})
    _settle(cfg, fake, {"k1:sms": DeliveryStatus.FAILED}, produce=[1])
    config = str(write_settings(cfg, tmp_path / "c.toml"))

    assert dedupctl(["--config", config, "senders", "redrive"]) == 0
    assert "redriven: 1" in capsys.readouterr().out
    assert dedupctl(["--config", config, "senders", "redrive"]) == 0  # a second run: nothing again
    out = capsys.readouterr().out
    assert "redriven: 0" in out and "already redriven: 1" in out

    _settle(cfg, fake, {"k1:sms": DeliveryStatus.SENT})
    assert [r.message_key for r in fake.received()] == ["k1:sms"] * 3  # two failed attempts, one redriven
    assert _trail(cfg, "k1:sms") == [
        ("sending", 1), ("queued", 1), ("sending", 2), ("failed", 2),
        ("queued", 0),  # redriven: the next attempt is a first one again
        ("sending", 1), ("sent", 1),
    ]
    assert len(read_records(cfg.kafka.bootstrap_servers, cfg.senders.dlq_topic, "dead_letter")) == 1


def test_redrive_filters_and_a_dry_run(
    senders_settings: SettingsFactory, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    cfg = senders_settings(max_attempts=1)
    fake = FakeProvider(script={address_of("user-1", SMS): ["rejected", "ok"], address_of("user-2", SMS): ["transient", "ok"]})
    _settle(cfg, fake, {"k1:sms": DeliveryStatus.FAILED, "k2:sms": DeliveryStatus.FAILED}, produce=[1, 2])
    config = str(write_settings(cfg, tmp_path / "c.toml"))

    assert dedupctl(["--config", config, "senders", "redrive", "--reason", "permanent_failure", "--dry-run"]) == 0
    assert "would redrive: 1" in capsys.readouterr().out
    store = open_status_store(cfg)
    assert store.get("k1:sms").status is DeliveryStatus.FAILED  # type: ignore[union-attr]

    assert dedupctl(["--config", config, "senders", "redrive", "--reason", "permanent_failure"]) == 0
    assert "redriven: 1" in capsys.readouterr().out
    _settle(cfg, fake, {"k1:sms": DeliveryStatus.SENT, "k2:sms": DeliveryStatus.FAILED})
    assert dedupctl(["--config", config, "senders", "redrive", "--message-key", "k2:sms"]) == 0
    _settle(cfg, fake, {"k2:sms": DeliveryStatus.SENT})


def test_a_redrive_cut_short_is_finished_by_the_next(
    senders_settings: SettingsFactory, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    cfg = senders_settings(max_attempts=1)
    fake = FakeProvider(script={address_of("user-1", SMS): ["transient", "ok"]})
    _settle(cfg, fake, {"k1:sms": DeliveryStatus.FAILED}, produce=[1])
    [letter] = kafka_io.read_committed(cfg.kafka.client_config(), [cfg.senders.dlq_topic], idle_timeout_s=1)
    store = open_status_store(cfg)
    # a redrive that stopped after the store, before Kafka: the row is queued, nothing was produced
    store.begin_redrive((letter.topic, letter.partition, letter.offset), "k1:sms", 1)
    assert store.get("k1:sms").status is DeliveryStatus.QUEUED  # type: ignore[union-attr]
    assert dedupctl(["--config", str(write_settings(cfg, tmp_path / "c.toml")), "senders", "redrive"]) == 0
    assert "redriven: 1" in capsys.readouterr().out
    _settle(cfg, fake, {"k1:sms": DeliveryStatus.SENT})
