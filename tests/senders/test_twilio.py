"""The Twilio adapter against a local server that speaks Twilio's Messages API
(harness/provider_servers/twilio.py): the form it posts, basic auth, the sid kept as the provider's
message id, and each class of answer (deactivated, kept, retried with Retry-After, the
deadline)."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from typing import Any

import pytest
from pydantic import SecretStr

from harness.provider_servers.twilio import Step, TwilioStub
from operators.errors import ConfigError
from operators.records import Channel
from senders.errors import ProviderPermanentError, ProviderRetryableError
from senders.providers import TwilioProvider, build_provider
from senders.runtime.metrics import Metrics
from settings import Settings
from tests.senders.conftest import sample_message, send_now

CALLBACK = "https://notify.example.com/webhooks/twilio"


@pytest.fixture
def stub() -> Iterator[TwilioStub]:
    server = TwilioStub().start()
    yield server
    server.stop()


def provider(stub: TwilioStub, **overrides: Any) -> TwilioProvider:
    values: dict[str, Any] = {
        "name": "twilio", "account_sid": stub.account_sid, "auth_token": SecretStr(stub.auth_token),
        "timeout_s": 1.0, "sender": "+15005550006", "status_callback": CALLBACK, "base_url": stub.base_url,
    }
    values.update(overrides)
    return TwilioProvider(**values)


def send(p: TwilioProvider, to: str = "+15551230001") -> Any:
    return send_now(p, to=to, message_key="k1:sms", message=sample_message(Channel.SMS))


def test_an_sms_is_posted_as_twilio_s_form_with_basic_auth_and_its_sid_is_the_reference(stub: TwilioStub) -> None:
    receipt = send(provider(stub))
    [sms] = stub.sent
    assert receipt.reference == sms.sid and sms.sid.startswith("SM")
    assert (sms.to, sms.sender, sms.body, sms.status_callback) == (
        "+15551230001", "+15005550006", "Your code is 123456.", CALLBACK)
    assert [name for name, _ in sms.form] == ["To", "From", "StatusCallback", "Body"]
    assert sms.messaging_service_sid is None


def test_a_messaging_service_instead_of_a_number_and_no_status_callback(stub: TwilioStub) -> None:
    send(provider(stub, sender="", messaging_service_sid="MG" + "0" * 32, status_callback=""))
    [sms] = stub.sent
    assert (sms.sender, sms.messaging_service_sid, sms.status_callback) == (None, "MG" + "0" * 32, None)


def test_a_wrong_auth_token_is_permanent_keeps_the_address_and_is_never_logged(
    stub: TwilioStub, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    with pytest.raises(ProviderPermanentError) as err:
        send(provider(stub, auth_token=SecretStr("wrong-token-7f3a")))
    assert err.value.status_code == 401 and err.value.deactivate_address is False
    assert "20003" in err.value.reason and "authentication" in err.value.reason
    assert stub.sent == [] and "wrong-token-7f3a" not in caplog.text and stub.auth_token not in caplog.text
    assert "wrong-token-7f3a" not in repr(provider(stub, auth_token=SecretStr("wrong-token-7f3a")))


@pytest.mark.parametrize(("to", "step", "deactivate"), [
    ("not-a-number", None, True),  # the server's own 21211
    ("+15551230002", Step(400, 21211), True),
    ("+15551230003", Step(400, 21614), True),  # a landline
    ("+15551230004", Step(400, 21610), False),  # replied STOP: the number is valid
    ("+15551230005", Step(400, 21606), False),  # our From is not an SMS number
    ("+15551230006", Step(403, 20003), False),
])
def test_which_errors_deactivate_the_number(stub: TwilioStub, to: str, step: Step | None, deactivate: bool) -> None:
    if step is not None:
        stub.script[to] = [step]
    with pytest.raises(ProviderPermanentError) as err:
        send(provider(stub), to=to)
    assert err.value.deactivate_address is deactivate
    assert err.value.reason.startswith(f"HTTP {step.status if step else 400} Twilio {step.code if step else 21211}")
    assert to not in err.value.reason  # the reply's text names the number; the reason never does


@pytest.mark.parametrize(("step", "hint"), [
    (Step(429, 20429, {"Retry-After": "7"}), 7.0),
    (Step(400, 20429), None),  # the throttling code alone
    (Step(500, 20500), None),
    (Step(503, 20503, {"Retry-After": "2"}), 2.0),
])
def test_throttling_and_server_errors_are_retried_with_the_servers_hint(
    stub: TwilioStub, step: Step, hint: float | None
) -> None:
    stub.script["+15551230007"] = [step, Step()]
    with pytest.raises(ProviderRetryableError) as err:
        send(provider(stub), to="+15551230007")
    assert err.value.retry_after_s == hint and err.value.status_code == step.status
    assert send(provider(stub), to="+15551230007").reference == stub.sent[0].sid  # then it goes through


def test_a_server_slower_than_the_deadline_is_a_transient_failure(stub: TwilioStub) -> None:
    stub.script["+15551230008"] = [Step(stall_s=3.0)]
    with pytest.raises(ProviderRetryableError) as err:
        send(provider(stub, timeout_s=0.5), to="+15551230008")
    assert "no reply within 0.5 s" in err.value.reason


def test_the_invalid_recipient_rules_of_twilio_replace_the_default(stub: TwilioStub) -> None:
    settings = Settings().with_overrides(senders={
        "invalid_recipient_rules": "twilio=400:21610",
        "twilio": {"account_sid": stub.account_sid, "auth_token": stub.auth_token, "sender": "+15005550006",
                   "base_url": stub.base_url},
    }).senders
    p = build_provider("twilio", name="twilio", settings=settings, metrics=Metrics())
    assert isinstance(p, TwilioProvider)
    stub.script["+15551230009"] = [Step(400, 21610)]
    stub.script["+15551230010"] = [Step(400, 21211)]
    with pytest.raises(ProviderPermanentError) as err:
        send(p, to="+15551230009")
    assert err.value.deactivate_address is True
    with pytest.raises(ProviderPermanentError) as err:
        send(p, to="+15551230010")
    assert err.value.deactivate_address is False


def test_an_email_through_twilio_is_permanent_and_sends_nothing(stub: TwilioStub) -> None:
    with pytest.raises(ProviderPermanentError) as err:
        send_now(provider(stub), to="a@example.com", message_key="k:email", message=sample_message(Channel.EMAIL))
    assert err.value.deactivate_address is False and stub.requests == []


@pytest.mark.parametrize(("table", "named"), [
    ({"auth_token": "t", "sender": "+15005550006"}, "account_sid"),
    ({"account_sid": "AC1", "sender": "+15005550006"}, "auth_token"),
    ({"account_sid": "AC1", "auth_token": "t"}, "sender or messaging_service_sid"),
])
def test_a_missing_setting_stops_the_start_naming_it(table: dict[str, str], named: str) -> None:
    settings = Settings().with_overrides(senders={"twilio": table}).senders
    with pytest.raises(ConfigError, match=named):
        build_provider("twilio", name="twilio", settings=settings, metrics=Metrics())
