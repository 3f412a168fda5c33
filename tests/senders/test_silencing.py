"""No address is silenced by mistake: only a provider's explicit "invalid recipient" answer
deactivates one; permanent failures across many addresses open the breaker and raise an alert
metric; a deactivated address can be reactivated, by hand or by registering it again."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from dedupctl.cli import main as dedupctl
from harness.settings_file import write_settings
from operators.records import Channel
from senders.errors import ProviderPermanentError
from senders.profiles.model import parse_profile
from senders.providers import FakeProvider, HttpProvider, SmtpProvider
from senders.runtime.pool import build_pool, open_profile_store, open_status_store
from senders.statuses import CircuitState, DeliveryStatus, Lane
from settings import Settings
from tests.senders.conftest import (
    SettingsFactory,
    address_of,
    channel_message,
    produce_messages,
    read_records,
    sample_message,
    send_now,
    wait_until,
)
from tests.senders.fake_http import FakeHttpProvider

SMS, EMAIL, NORMAL = Channel.SMS, Channel.EMAIL, Lane.NORMAL


@pytest.fixture
def http() -> Iterator[FakeHttpProvider]:
    server = FakeHttpProvider().start()
    yield server
    server.stop()


def _reject(provider: HttpProvider | SmtpProvider, to: str) -> ProviderPermanentError:
    with pytest.raises(ProviderPermanentError) as err:
        channel = EMAIL if isinstance(provider, SmtpProvider) else SMS
        send_now(provider, to=to, message_key="k:sms", message=sample_message(channel))
    return err.value


# -- which answers deactivate ----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("status", "body", "deactivate"),
    [
        (404, {"error": "not found"}, False),  # a wrong URL
        (400, {"error": "bad request"}, False),
        (422, {"error": "unprocessable"}, False),
        (400, {"error": "invalid_recipient"}, True),  # the contract's explicit answer
        (410, {}, True),  # gone: unregistered
    ],
)
def test_http_deactivates_only_on_an_explicit_invalid_recipient(
    http: FakeHttpProvider, status: int, body: dict[str, object], deactivate: bool
) -> None:
    http.replies["+1"] = (status, {})
    http.bodies["+1"] = body
    assert _reject(HttpProvider(name="sms-a", url=http.url, timeout_s=1.0), "+1").deactivate_address is deactivate


def test_what_means_invalid_recipient_is_configured_per_provider(http: FakeHttpProvider) -> None:
    from senders.policy.recipients import RecipientRules

    http.replies["+1"] = (400, {})
    http.bodies["+1"] = {"code": 21211, "message": "Invalid 'To' Phone Number"}
    rules = RecipientRules.parse("400:21211")
    assert _reject(HttpProvider(name="twilio", url=http.url, timeout_s=1.0, invalid_recipient=rules), "+1").deactivate_address
    assert not _reject(HttpProvider(name="other", url=http.url, timeout_s=1.0), "+1").deactivate_address


def test_settings_name_the_rules_of_each_provider() -> None:
    from senders.runtime.metrics import Metrics
    from senders.runtime.pool import build_dispatchers
    from settings import Settings

    cfg = Settings().with_overrides(
        senders={
            "sms_primary": "https://sms-a.example/send",
            "sms_secondary": "https://sms-b.example/send",
            "invalid_recipient_rules": "sms-b.example=400:21211",
        }
    )
    d = build_dispatchers(cfg, [SMS], Metrics())[SMS]
    assert str(d.primary.invalid_recipient) == "400:invalid_recipient,404:invalid_recipient,410"  # type: ignore[attr-defined]
    assert str(d.secondary.invalid_recipient) == "400:21211"  # type: ignore[union-attr]


@pytest.mark.parametrize(
    ("reply", "deactivate"),
    [
        ("550 5.1.1 <x>: Recipient address rejected: User unknown", True),
        ("553 5.1.3 Bad recipient address syntax", True),
        ("550 5.7.1 Relaying denied", False),  # our relay's policy, not the mailbox
        ("552 5.2.2 Mailbox full", False),
        ("550 Rejected", False),  # no enhanced status: not explicit
    ],
)
def test_smtp_deactivates_only_on_a_5_1_x_recipient_answer(reply: str, deactivate: bool) -> None:
    from aiosmtpd.controller import Controller

    from harness.ports import free_port

    class Handler:
        async def handle_RCPT(self, server: object, session: object, envelope: object, address: str, options: object) -> str:  # noqa: N802
            return reply

    controller = Controller(Handler(), hostname="127.0.0.1", port=free_port())
    controller.start()
    try:
        provider = SmtpProvider(name="smtp", host="127.0.0.1", port=controller.port, sender="n@example.com", timeout_s=2.0)
        assert _reject(provider, "ann@example.com").deactivate_address is deactivate
    finally:
        controller.stop()


# -- against the broker ----------------------------------------------------------------------------


@pytest.mark.integration
def test_a_wrong_provider_url_silences_no_one_and_opens_the_breaker(
    senders_settings: SettingsFactory, kafka_bootstrap: str, http: FakeHttpProvider
) -> None:
    http.default = (404, {})  # every call: the URL is wrong
    cfg = senders_settings(
        partitions=1,
        sms_primary=http.url,
        sms_secondary="fake",
        breaker_window=10,
        breaker_min_calls=4,
        breaker_failure_rate=0.5,
        breaker_open_ms=60_000,
    )
    store = open_status_store(cfg)
    with build_pool(cfg, channels=[SMS], lanes=[NORMAL]) as pool:
        secondary = pool.dispatchers[SMS].secondary
        assert isinstance(secondary, FakeProvider)
        produce_messages(kafka_bootstrap, cfg.topics.sms, [channel_message(i) for i in range(12)])
        wait_until(
            lambda: len(store.rows()) == 12
            and all(r.status in (DeliveryStatus.SENT, DeliveryStatus.FAILED) for r in store.rows()),
            20,
            lambda: f"all settled: {[(r.message_key, r.status.value) for r in store.rows()]}",
        )
        assert pool.dispatchers[SMS].circuit is CircuitState.OPEN
    rejected = {r.message_key for r in store.rows() if r.status is DeliveryStatus.FAILED}
    assert len(rejected) == 4  # the calls it took to see that the provider rejects everyone
    assert {r.message_key for r in secondary.received()} == {f"k{i}:sms" for i in range(12)} - rejected
    assert not any(store.is_inactive(SMS, address_of(f"user-{i}", SMS)) for i in range(12))  # nobody silenced
    label = http.url.split("/")[2]
    assert pool.metrics.value("sender_provider_rejecting", channel="sms", provider=label) == 1
    assert pool.metrics.value("sender_addresses_deactivated_total") == 0
    letters = read_records(kafka_bootstrap, cfg.senders.dlq_topic, "dead_letter")
    assert sorted(d["message_key"] for d in letters) == sorted(rejected)
    assert {d["reason_kind"] for d in letters} == {"permanent_failure"}


def _deactivate_one(cfg: Settings, kafka_bootstrap: str, fake: FakeProvider) -> None:
    open_profile_store(cfg).put("u-1", parse_profile({"contacts": {"sms": ["+15550100"]}}))
    with build_pool(cfg, channels=[SMS], lanes=[NORMAL], providers={SMS: (fake, None)}):
        produce_messages(kafka_bootstrap, cfg.topics.sms, [channel_message(1, user="u-1")])  # type: ignore[attr-defined]
        store = open_status_store(cfg)  # type: ignore[arg-type]
        wait_until(lambda: store.is_inactive(SMS, "+15550100"), 15, "the address is deactivated")


@pytest.mark.integration
def test_dedupctl_senders_addresses_reactivate(
    senders_settings: SettingsFactory, kafka_bootstrap: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    cfg = senders_settings()
    fake = FakeProvider(script={"+15550100": ["permanent", "ok"]})
    _deactivate_one(cfg, kafka_bootstrap, fake)
    config = write_settings(cfg, tmp_path / "c.toml")
    assert dedupctl(["--config", str(config), "senders", "addresses", "reactivate", "--channel", "sms", "+15550100"]) == 0
    assert dedupctl(["--config", str(config), "senders", "addresses", "reactivate", "--channel", "sms", "+15550100"]) == 3
    out = capsys.readouterr().out
    assert "reactivated" in out and "was not inactive" in out and "+15550100" not in out
    store = open_status_store(cfg)
    assert not store.is_inactive(SMS, "+15550100")
    with build_pool(cfg, channels=[SMS], lanes=[NORMAL], providers={SMS: (fake, None)}):
        produce_messages(kafka_bootstrap, cfg.topics.sms, [channel_message(2, user="u-1")])
        wait_until(lambda: (r := store.get("k2:sms")) is not None and r.status is DeliveryStatus.SENT, 15, "sent again")
    assert [r.message_key for r in fake.received()] == ["k1:sms", "k2:sms"]


@pytest.mark.integration
def test_a_contact_registered_again_is_reactivated(
    senders_settings: SettingsFactory, kafka_bootstrap: str, tmp_path: Path
) -> None:
    cfg = senders_settings()
    fake = FakeProvider(script={"+15550100": ["permanent", "ok"]})
    _deactivate_one(cfg, kafka_bootstrap, fake)
    profiles = open_profile_store(cfg)
    store = open_status_store(cfg)
    # the same profile put again is no new registration: the address stays inactive
    profiles.put("u-1", parse_profile({"contacts": {"sms": ["+15550100"]}}))
    with build_pool(cfg, channels=[SMS], lanes=[NORMAL], providers={SMS: (fake, None)}):
        produce_messages(kafka_bootstrap, cfg.topics.sms, [channel_message(3, user="u-1")])
        wait_until(lambda: store.get("k3:sms") is not None and store.get("k3:sms").status is DeliveryStatus.SKIPPED, 15, "skipped")  # type: ignore[union-attr]
    # the user drops the number, then enters it again: registered again, after the deactivation
    profiles.put("u-1", parse_profile({}))
    time.sleep(0.01)
    profiles.apply_contacts("u-1", {"sms": ["+15550100"]})
    with build_pool(cfg, channels=[SMS], lanes=[NORMAL], providers={SMS: (fake, None)}) as pool:
        produce_messages(kafka_bootstrap, cfg.topics.sms, [channel_message(2, user="u-1")])
        wait_until(lambda: (r := store.get("k2:sms")) is not None and r.status is DeliveryStatus.SENT, 15, "sent")
    assert not store.is_inactive(SMS, "+15550100")
    assert pool.metrics.value("sender_addresses_reactivated_total") == 1
