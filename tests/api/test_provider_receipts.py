"""The SMS gateway's and the email API's receipts end to end, through the real API: a message is
sent by the sender workers through the adapter (``twilio``, ``sendgrid``) to a local server that
speaks the provider's protocol; that server's signed callback is posted to the API
(``POST /webhooks/{provider}``); the status is read back from ``GET /v1/support/notifications``,
the address deactivated where docs/senders.md says, the user opted out where it says; and the
one-click unsubscribe link a marketing email carries opts its user out (``POST /unsubscribe``)."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

import httpx
import pytest

from api.receipts.held import held_count
from api.scopes import Scope
from harness.provider_servers.sendgrid import SendGridStub, SentMail
from harness.provider_servers.twilio import SentSms, TwilioStub
from operators.records import Channel
from senders.runtime.pool import build_pool, open_status_store
from senders.statuses import Lane
from settings import Settings
from tests.api.conftest import RunningApi, api_settings
from tests.senders.conftest import (
    address_of,
    channel_message,
    produce_messages,
    read_records,
    register_users,
    wait_until,
)

USERS = [f"rcpt-{i}" for i in range(1, 9)]
UNSUBSCRIBE_KEY = "unsub-key-1"


@dataclass
class Stack:
    cfg: Settings
    api: RunningApi
    twilio: TwilioStub
    sendgrid: SendGridStub
    support: str  # support:read
    profiles: str  # profiles:read

    def sms(self, n: int, user: str) -> SentSms:
        """Send an SMS to ``user`` through the workers; the message the Twilio server took."""
        produce_messages(self.cfg.kafka.bootstrap_servers, self.cfg.topics.channel_topic(Channel.SMS, "normal"),
                         [channel_message(n, channel=Channel.SMS, user=user)])
        number = address_of(user, Channel.SMS)
        wait_until(lambda: bool(self.twilio.to(number)), 30, f"the SMS to {user} at the Twilio server")
        self.wait_status(n, "sms", "sent")
        [sms] = self.twilio.to(number)
        return sms

    def email(self, n: int, user: str, marketing: bool = False) -> SentMail:
        message = channel_message(n, channel=Channel.EMAIL, user=user)
        if marketing:
            message.update(template_id="weekly_digest", category="marketing", params={"count": "3"})
        produce_messages(self.cfg.kafka.bootstrap_servers, self.cfg.topics.channel_topic(Channel.EMAIL, "normal"), [message])
        address = address_of(user, Channel.EMAIL)
        wait_until(lambda: bool(self.sendgrid.to(address)), 30, f"the email to {user} at the SendGrid server")
        self.wait_status(n, "email", "sent")
        [mail] = self.sendgrid.to(address)
        return mail

    def channel(self, n: int, channel: str) -> dict[str, Any]:
        reply = self.api.client(self.support).get(f"/v1/support/notifications/n-{n}")
        assert reply.status_code == 200, reply.text
        return reply.json()["channels"].get(channel) or {}  # type: ignore[no-any-return]

    def wait_status(self, n: int, channel: str, status: str) -> None:
        wait_until(lambda: self.channel(n, channel).get("status") == status, 30,
                   lambda: f"n-{n} {channel} is {self.channel(n, channel)}, not {status}")

    def inactive(self, user: str, channel: Channel) -> bool:
        store = open_status_store(self.cfg)
        try:
            return store.is_inactive(channel, address_of(user, channel))
        finally:
            store.close()

    def marketing(self, user: str) -> dict[str, bool]:
        reply = self.api.client(self.profiles).get(f"/v1/users/{user}")
        assert reply.status_code == 200, reply.text
        return reply.json()["marketing"]  # type: ignore[no-any-return]


@pytest.fixture(scope="module")
def stack(kafka_bootstrap: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    root: Path = tmp_path_factory.mktemp("provider-receipts")
    twilio, sendgrid = TwilioStub().start(), SendGridStub().start()
    cfg = api_settings(kafka_bootstrap, root)
    api_url = f"http://127.0.0.1:{cfg.api.port}"
    cfg = cfg.with_overrides(senders={
        "sms_primary": "twilio",
        "email_primary": "sendgrid",
        "twilio": {"base_url": twilio.base_url, "account_sid": twilio.account_sid, "auth_token": twilio.auth_token,
                   "sender": "+15005550006", "status_callback": f"{api_url}/webhooks/twilio"},
        "sendgrid": {"base_url": sendgrid.base_url, "api_key": sendgrid.api_key, "sender": "news@example.com",
                     "webhook_public_key": sendgrid.public_key},
        "unsubscribe_url": f"{api_url}/unsubscribe",
        "unsubscribe_secrets": UNSUBSCRIBE_KEY,
    })
    register_users(cfg, USERS, [Channel.SMS, Channel.EMAIL])
    pool = build_pool(cfg, channels=[Channel.SMS, Channel.EMAIL], lanes=[Lane.NORMAL]).start()
    api = RunningApi(cfg, root).start()
    try:
        yield Stack(cfg, api, twilio, sendgrid, api.token("support", scopes=(Scope.SUPPORT_READ,)),
                    api.token("profiles", scopes=(Scope.PROFILES_READ,)))
    finally:
        api.stop()
        pool.stop()
        twilio.stop()
        sendgrid.stop()


def test_a_twilio_delivered_callback_marks_the_sms_delivered(stack: Stack) -> None:
    sms = stack.sms(1, "rcpt-1")
    assert sms.status_callback == f"{stack.api.url}/webhooks/twilio"
    assert stack.twilio.callback(sms, "sent").status_code == 200  # acknowledged, no change
    assert stack.channel(1, "sms")["status"] == "sent"
    reply = stack.twilio.callback(sms, "delivered")
    assert reply.status_code == 200, reply.text
    assert reply.json()["receipts"] == [{"message_key": "k1:sms", "status": "delivered", "changed": True}]
    assert stack.channel(1, "sms")["status"] == "delivered"
    assert stack.twilio.callback(sms, "delivered").json()["receipts"][0]["changed"] is False  # again: once


def test_a_twilio_callback_signed_with_another_token_is_refused_and_changes_nothing(stack: Stack) -> None:
    sms = stack.sms(2, "rcpt-2")
    assert stack.twilio.callback(sms, "delivered", auth_token="not-the-auth-token").status_code == 401
    assert stack.channel(2, "sms")["status"] == "sent"


def test_an_undelivered_sms_fails_with_its_error_code_and_an_unknown_handset_is_deactivated(stack: Stack) -> None:
    off = stack.sms(3, "rcpt-3")
    assert stack.twilio.callback(off, "undelivered", 30003).status_code == 200  # the handset was off
    gone = stack.sms(4, "rcpt-4")
    assert stack.twilio.callback(gone, "undelivered", 30005).status_code == 200  # no such handset
    assert (stack.channel(3, "sms")["status"], stack.channel(3, "sms")["reason"]) == (
        "failed", "twilio 30003 undelivered")
    assert (stack.channel(4, "sms")["status"], stack.channel(4, "sms")["reason"]) == (
        "failed", "twilio 30005 undelivered")
    assert not stack.inactive("rcpt-3", Channel.SMS)
    assert stack.inactive("rcpt-4", Channel.SMS)


def test_a_batch_of_sendgrid_events_delivers_one_email_and_hard_bounces_another(stack: Stack) -> None:
    delivered, bounced, blocked = stack.email(5, "rcpt-5"), stack.email(6, "rcpt-6"), stack.email(7, "rcpt-7")
    url = f"{stack.api.url}/webhooks/sendgrid"
    reply = stack.sendgrid.post_events(url, [
        stack.sendgrid.event(delivered, "processed"),
        stack.sendgrid.event(delivered, "delivered"),
        stack.sendgrid.event(bounced, "bounce", type="bounce", status="5.1.1"),
        stack.sendgrid.event(blocked, "bounce", type="blocked", status="4.7.1"),
    ])
    assert reply.status_code == 200, reply.text
    assert reply.json()["events"] == 4
    assert [(c["status"], c["reason"]) for c in (stack.channel(n, "email") for n in (5, 6, 7))] == [
        ("delivered", None), ("failed", "sendgrid bounce 5.1.1"), ("failed", "sendgrid blocked 4.7.1")]
    assert [stack.inactive(u, Channel.EMAIL) for u in ("rcpt-5", "rcpt-6", "rcpt-7")] == [False, True, False]
    assert stack.sendgrid.post_events(url, [stack.sendgrid.event(delivered, "delivered")],
                                      timestamp=0).status_code == 401  # a replay outside the window


def test_a_spam_complaint_deactivates_the_address_and_opts_the_user_out_of_marketing_email(stack: Stack) -> None:
    mail = stack.email(8, "rcpt-8", marketing=True)
    assert stack.marketing("rcpt-8")["email"] is True
    reply = stack.sendgrid.post_events(f"{stack.api.url}/webhooks/sendgrid", [stack.sendgrid.event(mail, "spamreport")])
    assert reply.status_code == 200, reply.text
    assert stack.channel(8, "email")["status"] == "delivered"  # the mail arrived
    assert stack.inactive("rcpt-8", Channel.EMAIL)
    assert stack.marketing("rcpt-8")["email"] is False


def test_the_one_click_link_of_a_marketing_email_opts_its_user_out(stack: Stack) -> None:
    mail = stack.email(9, "rcpt-1", marketing=True)
    assert mail.headers["List-Unsubscribe-Post"] == "List-Unsubscribe=One-Click"
    link = mail.headers["List-Unsubscribe"].strip("<>")
    assert link.startswith(f"{stack.api.url}/unsubscribe?")
    assert stack.marketing("rcpt-1")["email"] is True
    assert httpx.get(link, timeout=30).status_code == 200  # opening it (a link scanner) changes nothing
    assert stack.marketing("rcpt-1")["email"] is True
    query = parse_qs(urlsplit(link).query)
    forged = f"{stack.api.url}/unsubscribe?u=rcpt-2&t={query['t'][0]}"  # rcpt-1's token for another user
    one_click = {"content": b"List-Unsubscribe=One-Click",
                 "headers": {"Content-Type": "application/x-www-form-urlencoded"}, "timeout": 30}
    assert httpx.post(forged, **one_click).status_code == 401  # type: ignore[arg-type]
    reply = httpx.post(link, **one_click)  # type: ignore[arg-type]
    assert reply.status_code == 200, reply.text
    assert stack.marketing("rcpt-1")["email"] is False
    assert stack.marketing("rcpt-2")["email"] is True
    assert stack.marketing("rcpt-1")["sms"] is True  # only marketing email


def test_a_twilio_callback_sooner_than_the_senders_record_of_the_send_is_held_and_applied_once(stack: Stack) -> None:
    """Twilio's callback posted while the sender still waits for the send's answer: the API has no
    message of that Sid yet; it holds the event (200, ``held`` 1; Twilio would not call again after
    an error) and applies it once the send is recorded: delivered, in the history, on the status
    topic; the same callback again changes nothing."""
    number = address_of("rcpt-2", Channel.SMS)
    stack.twilio.early[number] = ("delivered", None)
    try:
        produce_messages(stack.cfg.kafka.bootstrap_servers, stack.cfg.topics.channel_topic(Channel.SMS, "normal"),
                         [channel_message(10, channel=Channel.SMS, user="rcpt-2")])
        wait_until(lambda: any(s.sid in stack.twilio.early_replies for s in stack.twilio.to(number)), 30,
                   "the SMS to rcpt-2 and its early callback")
    finally:
        del stack.twilio.early[number]
    [sms] = [s for s in stack.twilio.to(number) if s.sid in stack.twilio.early_replies]
    early = stack.twilio.early_replies[sms.sid]
    assert early.status_code == 200, early.text
    assert early.json() == {"events": 1, "held": 1, "receipts": []}
    stack.wait_status(10, "sms", "delivered")
    channel = stack.channel(10, "sms")
    assert [r["status"] for r in channel["receipts"]] == ["delivered"]
    statuses = [r for r in read_records(stack.cfg.kafka.bootstrap_servers, stack.cfg.senders.status_topic,
                                        "delivery_status") if r["message_key"] == "k10:sms"]
    seen = [r["status"] for r in statuses]  # the sender's records (sending, sent), the receipt's change once
    assert "sent" in seen and seen.count("delivered") == 1, seen
    again = stack.twilio.callback(sms, "delivered")
    assert again.json() == {"events": 1, "held": 0, "receipts": [
        {"message_key": "k10:sms", "status": "delivered", "changed": False}]}
    store = open_status_store(stack.cfg)
    try:
        assert held_count(store.db) == 0
    finally:
        store.close()
