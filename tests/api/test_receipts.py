"""The receipt schemes (pure): their signatures against the providers' own published examples,
what each provider event becomes, and which scheme serves which provider name."""

from __future__ import annotations

import json
from urllib.parse import urlencode

import pytest
from pydantic import SecretStr

from api.receipts.model import BadReceipt, ReceiptEvent
from api.receipts.notify import NotifyReceipts
from api.receipts.registry import receipt_schemes
from api.receipts.sendgrid import SendGridReceipts
from api.receipts.twilio import TwilioReceipts, signature
from api.signing import sign
from harness.provider_servers.sendgrid import SendGridStub
from harness.provider_servers.twilio import twilio_signature
from operators.errors import ConfigError
from senders.policy import unsubscribe
from senders.statuses import DeliveryStatus
from settings import Settings
from settings.sms_email import load_event_webhook_key

# -- Twilio -----------------------------------------------------------------------------------------

#: Twilio's own example (docs: "Validating requests", the helper libraries' signature_validation
#: snippet): this token, URL and parameters sign as RSOYDt4T1cUTdK1PDd93/VVr8B8=
DOC_TOKEN = "12345"
DOC_URL = "https://mycompany.com/myapp.php?foo=1&bar=2"
DOC_PARAMS = {"CallSid": "CA1234567890ABCDE", "Caller": "+14158675309", "Digits": "1234", "From": "+14158675309",
              "To": "+18005551212"}
DOC_SIGNATURE = "RSOYDt4T1cUTdK1PDd93/VVr8B8="

SID = "AC" + "a" * 32
CALLBACK = "https://notify.example.com/webhooks/twilio"


def test_the_twilio_signature_is_the_one_of_twilio_s_documented_example() -> None:
    assert signature(DOC_TOKEN.encode(), DOC_URL, list(DOC_PARAMS.items())) == DOC_SIGNATURE
    assert twilio_signature(DOC_TOKEN, DOC_URL, DOC_PARAMS) == DOC_SIGNATURE  # the test server's own, too


def _twilio_form(**params: str) -> bytes:
    return urlencode(params).encode()


def _callback(status: str, code: str | None = None, token: str = "tok", account: str = SID) -> tuple[bytes, dict]:  # type: ignore[type-arg]
    params = {"AccountSid": account, "MessageSid": "SM1", "SmsSid": "SM1", "MessageStatus": status,
              "SmsStatus": status, "To": "+15551230001", "From": "+15005550006", "ApiVersion": "2010-04-01"}
    if code is not None:
        params["ErrorCode"] = code
    return _twilio_form(**params), {"x-twilio-signature": twilio_signature(token, CALLBACK, params)}


TWILIO = TwilioReceipts(SecretStr("tok"), CALLBACK, SID)


def test_a_twilio_callback_is_verified_against_the_configured_url_and_account() -> None:
    body, headers = _callback("delivered")
    assert TWILIO.verify(headers, body, 0) is None
    assert TWILIO.verify({}, body, 0) == "unsigned"
    assert TWILIO.verify(headers, body.replace(b"delivered", b"failed"), 0) == "bad signature"
    assert TwilioReceipts(SecretStr("tok"), CALLBACK + "?x=1", SID).verify(headers, body, 0) == "bad signature"
    forged, forged_headers = _callback("delivered", token="not-the-auth-token")
    assert TWILIO.verify(forged_headers, forged, 0) == "bad signature"
    other, other_headers = _callback("delivered", account="AC" + "b" * 32)
    assert TWILIO.verify(other_headers, other, 0) == "a callback of another account"
    assert TWILIO.verify(headers, b"\xff\xfe", 0) == "malformed body"


@pytest.mark.parametrize(("status", "code", "expected"), [
    ("delivered", None, ReceiptEvent("SM1", DeliveryStatus.DELIVERED, "delivered")),
    ("undelivered", "30003", ReceiptEvent("SM1", DeliveryStatus.FAILED, "failed", "twilio 30003 undelivered",
                                          address="+15551230001", deactivate=False)),  # the handset was off
    ("undelivered", "30005", ReceiptEvent("SM1", DeliveryStatus.FAILED, "failed", "twilio 30005 undelivered",
                                          address="+15551230001", deactivate=True)),  # no such handset
    ("failed", "30006", ReceiptEvent("SM1", DeliveryStatus.FAILED, "failed", "twilio 30006 failed",
                                     address="+15551230001", deactivate=True)),  # a landline
    ("failed", "30007", ReceiptEvent("SM1", DeliveryStatus.FAILED, "failed", "twilio 30007 failed",
                                     address="+15551230001", deactivate=False)),  # the carrier filtered it
    ("failed", None, ReceiptEvent("SM1", DeliveryStatus.FAILED, "failed", "twilio failed", address="+15551230001")),
    ("queued", None, ReceiptEvent("SM1", None, "queued")),
    ("sent", None, ReceiptEvent("SM1", None, "sent")),
    ("accepted", None, ReceiptEvent("SM1", None, "accepted")),
])
def test_what_each_twilio_status_becomes(status: str, code: str | None, expected: ReceiptEvent) -> None:
    body, _ = _callback(status, code)
    assert list(TWILIO.events(body)) == [expected]


def test_a_twilio_callback_without_its_sid_is_no_receipt() -> None:
    with pytest.raises(BadReceipt):
        TWILIO.events(_twilio_form(MessageStatus="delivered"))


# -- SendGrid ---------------------------------------------------------------------------------------

#: SendGrid's own example (sendgrid-python's event webhook test): this key, timestamp and payload
#: (with its trailing CRLF) verify with this signature
SG_PUBLIC_KEY = ("MFkwEwYHKoZIzj0CAQYIKoZIzj0DAQcDQgAE83T4O/n84iotIvIW4mdBgQ/7dAfSmpqIM8kF9mN1flpVKS3GRqe62gw+2fNN"
                 "RaINXvVpiglSI8eNEc6wEA3F+g==")
SG_SIGNATURE = "MEUCIGHQVtGj+Y3LkG9fLcxf3qfI10QysgDWmMOVmxG0u6ZUAiEAyBiXDWzM+uOe5W0JuG+luQAbPIqHh89M15TluLtEZtM="
SG_TIMESTAMP = "1600112502"
SG_PAYLOAD = json.dumps([{
    "email": "hello@world.com", "event": "dropped", "reason": "Bounced Address",
    "sg_event_id": "ZHJvcC0xMDk5NDkxOS1MUnpYbF9OSFN0T0doUTRrb2ZTbV9BLTA",
    "sg_message_id": "LRzXl_NHStOGhQ4kofSm_A.filterdrecv-p3mdw1-756b745b58-kmzbl-18-5F5FC76C-9.0",
    "smtp-id": "<LRzXl_NHStOGhQ4kofSm_A@ismtpd0039p1iad1.sendgrid.net>", "timestamp": 1600112492,
}], sort_keys=True, separators=(",", ":")).encode() + b"\r\n"

SENDGRID = SendGridReceipts(load_event_webhook_key(SG_PUBLIC_KEY), 300)
SG_HEADERS = {"x-twilio-email-event-webhook-signature": SG_SIGNATURE,
              "x-twilio-email-event-webhook-timestamp": SG_TIMESTAMP}


def test_sendgrid_s_documented_signed_payload_verifies_and_a_changed_one_does_not() -> None:
    now = int(SG_TIMESTAMP) + 10
    assert SENDGRID.verify(SG_HEADERS, SG_PAYLOAD, now) is None
    assert SENDGRID.verify(SG_HEADERS, SG_PAYLOAD.replace(b"dropped", b"dropper"), now) == "bad signature"
    assert SENDGRID.verify({**SG_HEADERS, "x-twilio-email-event-webhook-timestamp": "1600112503"}, SG_PAYLOAD,
                           now) == "bad signature"
    assert SENDGRID.verify({**SG_HEADERS, "x-twilio-email-event-webhook-signature": "not base64!"}, SG_PAYLOAD,
                           now) == "bad signature"
    assert SENDGRID.verify(SG_HEADERS, SG_PAYLOAD, now + 3600) == "timestamp outside the replay window"
    assert SENDGRID.verify({}, SG_PAYLOAD, now) == "unsigned"
    other = SendGridReceipts(load_event_webhook_key(SendGridStub().public_key), 300)
    assert other.verify(SG_HEADERS, SG_PAYLOAD, now) == "bad signature"


def _sg(event: str, **extra: object) -> dict[str, object]:
    return {"event": event, "email": "ann@example.com", "sg_message_id": "MSG1.filterdrecv-1", "timestamp": 1,
            "notify_message_key": "shop/e1:email:1", **extra}


@pytest.mark.parametrize(("event", "expected"), [
    (_sg("delivered"), ReceiptEvent("MSG1", DeliveryStatus.DELIVERED, "delivered", message_key="shop/e1:email:1")),
    (_sg("bounce", type="bounce", status="5.1.1", reason="550 5.1.1 ann@example.com: unknown"),
     ReceiptEvent("MSG1", DeliveryStatus.FAILED, "failed", "sendgrid bounce 5.1.1", address="ann@example.com",
                  deactivate=True, message_key="shop/e1:email:1")),
    (_sg("bounce", type="blocked", status="4.7.1"),
     ReceiptEvent("MSG1", DeliveryStatus.FAILED, "failed", "sendgrid blocked 4.7.1", address="ann@example.com",
                  deactivate=False, message_key="shop/e1:email:1")),
    (_sg("dropped", reason="Bounced Address"),
     ReceiptEvent("MSG1", DeliveryStatus.FAILED, "failed", "sendgrid dropped", message_key="shop/e1:email:1")),
    (_sg("spamreport"), ReceiptEvent("MSG1", DeliveryStatus.DELIVERED, "complaint", "sendgrid spamreport",
                                     address="ann@example.com", deactivate=True, opt_out=True,
                                     message_key="shop/e1:email:1")),
    (_sg("processed"), ReceiptEvent("MSG1", None, "processed", message_key="shop/e1:email:1")),
    (_sg("deferred"), ReceiptEvent("MSG1", None, "deferred", message_key="shop/e1:email:1")),
    (_sg("open"), ReceiptEvent("MSG1", None, "open", message_key="shop/e1:email:1")),
    ({"event": "delivered", "sg_message_id": "OTHER.filter", "email": "x@example.com"},  # not ours: no key
     ReceiptEvent("OTHER", None, "delivered")),
])
def test_what_each_sendgrid_event_becomes(event: dict[str, object], expected: ReceiptEvent) -> None:
    assert list(SENDGRID.events(json.dumps([event]).encode())) == [expected]


def test_a_bounce_s_reason_keeps_its_code_and_never_its_text() -> None:
    [e] = SENDGRID.events(json.dumps([_sg("bounce", status="550 ann@example.com")]).encode())
    assert e.reason == "sendgrid bounce" and "ann" not in (e.reason or "")


@pytest.mark.parametrize("body", [b"{}", b"[1]", b'[{"no": "event"}]', b"not json", b"[" * 32000])
def test_a_body_that_is_no_array_of_events_is_no_receipt(body: bytes) -> None:
    with pytest.raises(BadReceipt):
        SENDGRID.events(body)


# -- this project's own, and which scheme serves which name -----------------------------------------


def test_the_notify_scheme_is_as_before() -> None:
    scheme = NotifyReceipts(b"secret", 300)
    body = b'{"message_id": "m-1", "status": "failed", "reason": "bounced"}'
    headers = {"x-notify-timestamp": "1000", "x-notify-signature": sign(b"secret", 1000, body)}
    assert scheme.verify(headers, body, 1000) is None
    assert scheme.verify(headers, body, 2000) == "timestamp outside the replay window"
    assert list(scheme.events(body)) == [ReceiptEvent("m-1", DeliveryStatus.FAILED, "failed", "bounced")]


def test_each_provider_name_gets_its_scheme() -> None:
    cfg = Settings().with_overrides(senders={
        "twilio": {"account_sid": SID, "auth_token": "tok", "status_callback": CALLBACK},
        "sendgrid": {"webhook_public_key": SG_PUBLIC_KEY},
    })
    schemes = receipt_schemes(cfg, {"127.0.0.1:9000": b"s"})
    assert {name: s.kind for name, s in schemes.items()} == {
        "127.0.0.1:9000": "notify", "twilio": "twilio", "sendgrid": "sendgrid"}
    assert receipt_schemes(cfg, {"twilio": b"s"})["twilio"].kind == "notify"  # named in webhook_secrets: as before
    bare = Settings().with_overrides(senders={"twilio": {"account_sid": SID, "auth_token": "tok"}})
    assert receipt_schemes(bare, {}) == {}  # no status callback URL: no callbacks to take


def test_a_webhook_key_that_is_no_p256_public_key_is_a_settings_error() -> None:
    with pytest.raises(ConfigError, match="sendgrid.webhook_public_key"):
        Settings().with_overrides(senders={"sendgrid": {"webhook_public_key": "bm90IGEga2V5"}})


# -- the unsubscribe link's token --------------------------------------------------------------------


def test_an_unsubscribe_token_is_the_users_own_and_survives_a_key_rotation() -> None:
    token = unsubscribe.token(b"old", "nusrat")
    assert unsubscribe.genuine([b"new", b"old"], "nusrat", token)
    assert not unsubscribe.genuine([b"new"], "nusrat", token)
    assert not unsubscribe.genuine([b"new", b"old"], "bruno", token)
    assert not unsubscribe.genuine([], "nusrat", token)
    assert unsubscribe.link("https://n.example/unsubscribe", b"k", "a b&c") == (
        f"https://n.example/unsubscribe?u=a+b%26c&t={unsubscribe.token(b'k', 'a b&c')}")
