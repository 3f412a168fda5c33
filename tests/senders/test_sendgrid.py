"""The SendGrid adapter against a local server that speaks SendGrid's v3 mail send
(harness/provider_servers/sendgrid.py): the JSON it posts (the rendered parts, the message key as a
custom argument and a header, the one-click unsubscribe headers on every marketing email), the
bearer key, ``X-Message-Id`` kept as the provider's message id, and each class of answer."""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Iterator
from typing import Any
from urllib.parse import parse_qs, urlsplit

import pytest
from pydantic import SecretStr

from harness.provider_servers.sendgrid import INVALID_ADDRESS, SendGridStub, Step
from operators.errors import ConfigError
from operators.records import Category, Channel
from senders.errors import ProviderPermanentError, ProviderRetryableError
from senders.policy import unsubscribe
from senders.providers import SendGridProvider, build_provider
from senders.providers.sendgrid import invalid_recipient
from senders.runtime.metrics import Metrics
from senders.templates.render import EmailContent, MessageContext, Rendered
from settings import Settings
from tests.senders.conftest import sample_message, send_now

UNSUBSCRIBE = "https://notify.example.com/unsubscribe"
KEY = b"unsubscribe-key-1"


@pytest.fixture
def stub() -> Iterator[SendGridStub]:
    server = SendGridStub().start()
    yield server
    server.stop()


def provider(stub: SendGridStub, **overrides: Any) -> SendGridProvider:
    values: dict[str, Any] = {
        "name": "sendgrid", "api_key": SecretStr(stub.api_key), "sender": "news@shop.example", "timeout_s": 1.0,
        "unsubscribe_url": UNSUBSCRIBE, "unsubscribe_key": KEY, "base_url": stub.base_url,
    }
    values.update(overrides)
    return SendGridProvider(**values)


def email(kind: Category = Category.TRANSACTIONAL, user: str = "nusrat") -> Rendered:
    content = EmailContent(subject="Your week: 3 new offers", text="3 new offers.", html="<p>3 new offers.</p>")
    return Rendered("weekly_digest", 1, "en", Channel.EMAIL, content, MessageContext(kind=kind, user_id=user))


def send(p: SendGridProvider, to: str = "nusrat@example.com", message: Rendered | None = None) -> Any:
    return send_now(p, to=to, message_key="shop/evt-1:email:1", message=message or email())


def test_an_email_is_posted_as_sendgrid_s_json_and_its_message_id_is_the_reference(stub: SendGridStub) -> None:
    receipt = send(provider(stub))
    [mail] = stub.sent
    assert receipt.reference == mail.message_id and mail.authorization == f"Bearer {stub.api_key}"
    assert mail.body == {
        "personalizations": [{"to": [{"email": "nusrat@example.com"}],
                              "custom_args": {"notify_message_key": "shop/evt-1:email:1"}}],
        "from": {"email": "news@shop.example"},
        "subject": "Your week: 3 new offers",
        "content": [{"type": "text/plain", "value": "3 new offers."},
                    {"type": "text/html", "value": "<p>3 new offers.</p>"}],
        "headers": {"X-Notify-Message-Key": "shop/evt-1:email:1"},  # transactional: no unsubscribe link
    }


def test_every_marketing_email_carries_a_one_click_unsubscribe_link_for_its_user(stub: SendGridStub) -> None:
    send(provider(stub), message=email(Category.MARKETING, user="bruno"))
    [mail] = stub.sent
    assert mail.headers["List-Unsubscribe-Post"] == "List-Unsubscribe=One-Click"
    link = mail.headers["List-Unsubscribe"]
    assert link.startswith(f"<{UNSUBSCRIBE}?") and link.endswith(">")
    query = parse_qs(urlsplit(link[1:-1]).query)
    assert query["u"] == ["bruno"]
    assert unsubscribe.genuine([KEY], "bruno", query["t"][0])
    assert not unsubscribe.genuine([KEY], "nusrat", query["t"][0])  # the token is the user's own


def test_a_marketing_email_without_its_user_is_not_sent_without_the_link(stub: SendGridStub) -> None:
    with pytest.raises(ProviderPermanentError) as err:
        send(provider(stub), message=email(Category.MARKETING, user=""))
    assert "unsubscribe" in err.value.reason and err.value.deactivate_address is False and stub.requests == []


def test_an_invalid_address_is_deactivated_and_another_400_is_not(stub: SendGridStub) -> None:
    with pytest.raises(ProviderPermanentError) as err:
        send(provider(stub), to="not-an-address")
    assert err.value.deactivate_address is True and err.value.status_code == 400
    assert "not-an-address" not in err.value.reason
    stub.script["ok@example.com"] = [Step(400, ({"message": "The from address does not match a verified Sender"
                                                            " Identity.", "field": "from", "help": None},))]
    with pytest.raises(ProviderPermanentError) as err:
        send(provider(stub), to="ok@example.com")
    assert err.value.deactivate_address is False and err.value.status_code == 400


@pytest.mark.parametrize("status", [401, 403])
def test_a_refused_key_is_permanent_keeps_the_address_and_is_never_logged(
    stub: SendGridStub, status: int, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    if status == 403:
        stub.script["nusrat@example.com"] = [Step(403, ({"message": "access forbidden", "field": None},))]
        p = provider(stub)
    else:
        p = provider(stub, api_key=SecretStr("SG.wrong-key-9d2c"))
    with pytest.raises(ProviderPermanentError) as err:
        send(p)
    assert err.value.status_code == status and err.value.deactivate_address is False
    assert "authentication" in err.value.reason
    assert "SG.wrong-key-9d2c" not in caplog.text and stub.api_key not in caplog.text
    assert stub.api_key not in repr(p)


@pytest.mark.parametrize(("step", "low", "high"), [
    (Step(429, headers={"Retry-After": "7"}), 7.0, 7.0),
    # SendGrid's own: the reset time, whole seconds 6 s ahead (so 5-6 s left; a second's slack for the call)
    (Step(429, headers={"X-RateLimit-Reset": "{reset}"}), 4.0, 6.0),
    (Step(500), None, None),
    (Step(503, headers={"Retry-After": "2"}), 2.0, 2.0),
])
def test_throttling_and_server_errors_are_retried_with_the_servers_hint(
    stub: SendGridStub, step: Step, low: float | None, high: float | None
) -> None:
    headers = {k: v.format(reset=int(time.time()) + 6) for k, v in step.headers.items()}
    stub.script["nusrat@example.com"] = [Step(step.status, headers=headers), Step()]
    with pytest.raises(ProviderRetryableError) as err:
        send(provider(stub))
    hint = err.value.retry_after_s
    assert (hint is None) if low is None else (low <= hint <= high)  # type: ignore[operator]
    assert send(provider(stub)).reference == stub.sent[0].message_id


def test_a_server_slower_than_the_deadline_is_a_transient_failure(stub: SendGridStub) -> None:
    stub.script["nusrat@example.com"] = [Step(stall_s=3.0)]
    with pytest.raises(ProviderRetryableError) as err:
        send(provider(stub, timeout_s=0.5))
    assert "no reply within 0.5 s" in err.value.reason


def test_other_4xx_are_permanent_and_keep_the_address(stub: SendGridStub) -> None:
    stub.script["nusrat@example.com"] = [Step(413, ({"message": "too large", "field": None},))]
    with pytest.raises(ProviderPermanentError) as err:
        send(provider(stub))
    assert err.value.deactivate_address is False and err.value.status_code == 413


def test_build_provider_reads_the_sendgrid_table_and_refuses_to_start_without_the_unsubscribe_link(
    stub: SendGridStub,
) -> None:
    table = {"api_key": stub.api_key, "base_url": stub.base_url}
    settings = Settings().with_overrides(senders={"sendgrid": table, "smtp_from": "ops@shop.example"}).senders
    with pytest.raises(ConfigError, match="unsubscribe_url and senders.unsubscribe_secrets"):
        build_provider("sendgrid", name="sendgrid", settings=settings, metrics=Metrics())
    settings = Settings().with_overrides(senders={
        "sendgrid": table, "smtp_from": "ops@shop.example", "unsubscribe_url": UNSUBSCRIBE,
        "unsubscribe_secrets": "new-key,old-key"}).senders
    p = build_provider("sendgrid", name="sendgrid", settings=settings, metrics=Metrics())
    send(p, message=email(Category.MARKETING, user="chen"))  # type: ignore[arg-type]
    [mail] = stub.sent
    assert mail.body["from"] == {"email": "ops@shop.example"}  # sender empty: smtp_from
    token = parse_qs(urlsplit(mail.headers["List-Unsubscribe"][1:-1]).query)["t"][0]
    assert unsubscribe.genuine([b"new-key"], "chen", token) and not unsubscribe.genuine([b"old-key"], "chen", token)


def test_the_invalid_address_body_is_sendgrid_s_documented_one() -> None:
    assert invalid_recipient(json.dumps({"errors": [INVALID_ADDRESS]}).encode())
    assert not invalid_recipient(b'{"errors": [{"message": "Does not contain a valid address.", "field": "from"}]}')
    assert not invalid_recipient(b'{"errors": [{"message": "The to array is required", "field":'
                                 b' "personalizations.0.to"}]}')
    assert not invalid_recipient(b"not json") and not invalid_recipient(b"")


def test_an_sms_through_sendgrid_is_permanent_and_sends_nothing(stub: SendGridStub) -> None:
    with pytest.raises(ProviderPermanentError):
        send_now(provider(stub), to="+15551230001", message_key="k:sms", message=sample_message(Channel.SMS))
    assert stub.requests == []
