"""The outbox provider without a broker: its files (one JSON file per message, written whole,
newest last in name order), its limits, its failures, and that it is every channel's provider
when none is set. The process (``dedupctl senders run``) and the API's page: test_outbox_run.py
and tests/api/test_outbox.py."""

from __future__ import annotations

import json
import os
import stat
from collections.abc import Callable
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from operators.records import Channel
from senders.errors import ProviderRetryableError
from senders.policy.outbox import OutboxLimits, file_name, time_of, to_prune
from senders.providers import OutboxProvider, Provider, build_provider
from senders.providers.outbox_files import outbox_root, read_newest
from senders.runtime.metrics import Metrics
from senders.runtime.pool import build_dispatchers
from settings import Settings, load_settings
from tests.senders.conftest import sample_message, send_now

MS = 1_000_000  # ns


def clock(start_ms: int) -> tuple[Callable[[], int], Callable[[int], None]]:
    """A settable clock (ns) and a function that moves it on by some milliseconds."""
    now = [start_ms * MS]

    def advance(ms: int) -> None:
        now[0] += ms * MS

    return (lambda: now[0]), advance


def outbox(tmp_path: Path, limits: OutboxLimits | None = None, clock_ns: Callable[[], int] | None = None
           ) -> OutboxProvider:
    extra = {"clock_ns": clock_ns} if clock_ns is not None else {}
    return OutboxProvider(root=outbox_root(tmp_path), limits=limits, **extra)


def send(provider: OutboxProvider, key: str, channel: Channel = Channel.SMS, to: str = "+8801711000001") -> str:
    receipt = send_now(provider, to=to, message_key=key, message=sample_message(channel))
    assert receipt.provider == "outbox" and receipt.reference is not None
    return receipt.reference


def files(tmp_path: Path, channel: Channel = Channel.SMS) -> list[str]:
    folder = tmp_path / "outbox" / channel.value
    return sorted(os.listdir(folder)) if folder.exists() else []


def keys_in(tmp_path: Path, channel: Channel = Channel.SMS) -> list[str]:
    folder = tmp_path / "outbox" / channel.value
    return [json.loads((folder / name).read_text())["message_key"] for name in files(tmp_path, channel)]


def test_each_message_is_one_json_file_under_the_data_directory_with_the_id_it_answers(tmp_path: Path) -> None:
    provider = outbox(tmp_path, clock_ns=lambda: 1_796_115_600_123 * MS + 456)
    reference = send(provider, "shop/evt-2:sms:1796115600000")
    [name] = files(tmp_path)
    assert name == f"1796115600123000456-{reference}.json" and reference.startswith("ob_")
    path = tmp_path / "outbox" / "sms" / name
    assert json.loads(path.read_text(encoding="utf-8")) == {
        "id": reference,
        "message_key": "shop/evt-2:sms:1796115600000",
        "channel": "sms",
        "to": "+8801711000001",
        "template": "otp",
        "version": 1,
        "locale": "en",
        "parts": {"text": "Your code is 123456.", "encoding": "gsm7", "segments": 1},
        "at": 1_796_115_600_123,
    }
    assert stat.S_IMODE(path.stat().st_mode) == 0o600  # addresses and bodies: the owner's only
    email = send(provider, "k:email", Channel.EMAIL, to="nusrat@example.com")
    [record] = read_newest(outbox_root(tmp_path), channels=[Channel.EMAIL])
    assert (record["id"], record["to"], record["parts"]) == (
        email, "nusrat@example.com", {"subject": "Order 1001", "text": "Your order has shipped.", "html": "<p>Shipped</p>"})
    assert send(provider, "k:sms:2") != reference  # a new id each message


def test_a_file_appears_whole_and_nothing_is_left_beside_it(tmp_path: Path) -> None:
    provider = outbox(tmp_path)
    for n in range(20):
        send(provider, f"k{n}")
    names = os.listdir(tmp_path / "outbox" / "sms")
    assert len(names) == 20 and all(time_of(n) is not None for n in names)  # no temporary file remains


def test_the_newest_max_messages_are_kept_per_channel_counting_files_already_there(tmp_path: Path) -> None:
    limits = OutboxLimits(max_messages=3, max_age_ms=0)
    provider = outbox(tmp_path, limits)
    for n in range(7):
        send(provider, f"sms-{n}")
    send(provider, "push-0", Channel.PUSH)
    assert keys_in(tmp_path) == ["sms-4", "sms-5", "sms-6"]
    assert keys_in(tmp_path, Channel.PUSH) == ["push-0"]  # each channel its own count
    again = outbox(tmp_path, limits)  # a restarted sender: the files there count
    send(again, "sms-7")
    assert keys_in(tmp_path) == ["sms-5", "sms-6", "sms-7"]


def test_files_older_than_max_age_go_when_the_next_message_is_written(tmp_path: Path) -> None:
    now, advance = clock(1_796_115_600_000)
    provider = outbox(tmp_path, OutboxLimits(max_messages=0, max_age_ms=60_000), now)
    send(provider, "old")
    advance(30_000)
    send(provider, "middle")
    advance(30_001)  # "old" is now 60,001 ms old
    send(provider, "new")
    assert keys_in(tmp_path) == ["middle", "new"]


def test_messages_of_one_millisecond_keep_their_order(tmp_path: Path) -> None:
    provider = outbox(tmp_path, clock_ns=lambda: 1_796_115_600_000 * MS)  # a clock that stands still
    for n in range(5):
        send(provider, f"k{n}")
    assert keys_in(tmp_path) == [f"k{n}" for n in range(5)]
    assert [r["message_key"] for r in read_newest(outbox_root(tmp_path))] == [f"k{n}" for n in reversed(range(5))]


def test_a_failed_write_is_a_transient_failure(tmp_path: Path) -> None:
    blocked = tmp_path / "not-a-folder"
    blocked.write_text("a file where the outbox's folder would be")
    provider = OutboxProvider(root=blocked)
    with pytest.raises(ProviderRetryableError, match="cannot write the outbox"):
        send_now(provider, to="+8801711000001", message_key="k1", message=sample_message(Channel.SMS))


def test_read_newest_merges_the_channels_newest_first_by_address_and_skips_what_is_not_a_message(
    tmp_path: Path,
) -> None:
    now, advance = clock(1_796_115_600_000)
    provider = outbox(tmp_path, clock_ns=now)
    for n, channel in enumerate([Channel.SMS, Channel.PUSH, Channel.EMAIL, Channel.SMS, Channel.PUSH]):
        send(provider, f"k{n}", channel, to="a" if n % 2 else "b")
        advance(1)
    root = outbox_root(tmp_path)
    (root / "sms" / file_name(1_796_115_600_010 * MS, "ob_broken")).write_text("{not json")
    (root / "sms" / ".tmp-being-written").write_text("{}")
    (root / "sms" / "notes.txt").write_text("mine")
    assert [r["message_key"] for r in read_newest(root)] == ["k4", "k3", "k2", "k1", "k0"]
    assert [r["message_key"] for r in read_newest(root, limit=2)] == ["k4", "k3"]
    assert [r["message_key"] for r in read_newest(root, to="a")] == ["k3", "k1"]
    assert [r["message_key"] for r in read_newest(root, channels=[Channel.PUSH])] == ["k4", "k1"]
    assert read_newest(tmp_path / "nothing-here") == []


def test_names_sort_by_write_time_and_only_outbox_names_count() -> None:
    assert time_of(file_name(1_796_115_600_123 * MS + 999, "ob_x")) == 1_796_115_600_123
    assert file_name(5, "ob_x") < file_name(10, "ob_x")  # fixed width: text order is time order
    for other in ("notes.txt", ".1796115600123000000-ob_x.json.tmp", "1796115600123-ob_x.json", "abc-ob_x.json"):
        assert time_of(other) is None


@given(
    ages=st.lists(st.integers(min_value=0, max_value=100_000), max_size=40),
    max_messages=st.integers(min_value=0, max_value=50),
    max_age_ms=st.integers(min_value=0, max_value=100_000),
)
def test_pruning_drops_the_oldest_beyond_the_count_and_past_the_age(
    ages: list[int], max_messages: int, max_age_ms: int
) -> None:
    now_ms = 1_796_115_600_000
    names = [file_name((now_ms - age) * MS, f"ob_{i}") for i, age in enumerate(sorted(ages, reverse=True))]
    drop = to_prune(names, now_ms, OutboxLimits(max_messages=max_messages, max_age_ms=max_age_ms))
    kept = names[drop:]
    if max_messages:
        assert len(kept) <= max_messages
    if max_age_ms:
        assert all(now_ms - (time_of(n) or 0) <= max_age_ms for n in kept)
    # nothing more than that: the newest dropped one broke a rule
    if drop:
        newest_dropped = names[drop - 1]
        too_many = bool(max_messages) and len(names) - (drop - 1) > max_messages
        too_old = bool(max_age_ms) and now_ms - (time_of(newest_dropped) or 0) > max_age_ms
        assert too_many or too_old


def test_every_channel_writes_to_the_outbox_when_no_provider_is_set(tmp_path: Path) -> None:
    cfg = load_settings(env={"DEDUP_DATA_DIR": str(tmp_path)})
    assert cfg.senders.providers(Channel.PUSH) == ("outbox", "")
    assert cfg.senders.uses_outbox()
    dispatchers = build_dispatchers(cfg, list(Channel), Metrics())
    for channel, d in dispatchers.items():
        assert isinstance(d.primary, OutboxProvider) and d.secondary is None, channel
        assert d.primary.root == tmp_path.resolve() / "outbox"
        assert d.primary.describe() == "outbox (outbox)"
    real = Settings().with_overrides(senders={
        "push_primary": "fake", "sms_primary": "http://sms.example/send", "email_primary": "smtp"})
    assert not real.senders.uses_outbox()
    assert real.with_overrides(senders={"email_secondary": "outbox"}).senders.uses_outbox()
    limited = Settings(data_dir=str(tmp_path)).with_overrides(senders={"outbox_max_messages": 2})
    provider = build_provider("outbox", name="outbox", settings=limited.senders, metrics=Metrics(),
                              data_dir=limited.data_path())
    assert isinstance(provider, OutboxProvider)
    for n in range(3):
        send(provider, f"k{n}")
    assert keys_in(tmp_path) == ["k1", "k2"]


def _providers(cls: type[Provider]) -> list[type[Provider]]:
    out = []
    for sub in cls.__subclasses__():
        out += [sub, *_providers(sub)]
    return out


def test_every_provider_names_its_protocol() -> None:
    protocols = {cls.__name__: cls.protocol for cls in _providers(Provider) if cls.__module__.startswith("senders.")}
    assert {"HttpProvider": "http", "SmtpProvider": "smtp", "FakeProvider": "fake",
            "OutboxProvider": "outbox", "FcmProvider": "fcm-http-v1", "ApnsProvider": "apns-http2",
            "TwilioProvider": "twilio-messages", "SendGridProvider": "sendgrid-v3"}.items() <= protocols.items()
    assert all(protocols.values()), protocols  # no adapter without one
