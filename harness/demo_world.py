"""The demo's outside world through the real protocols: local servers on loopback that speak
FCM HTTP v1 (with its OAuth2 token endpoint, HTTP/2 over TLS from a throwaway CA), Twilio's
Messages API and SendGrid's v3 mail send (``harness/provider_servers``), scripted to answer as
the story's world does (``scenario.PROVIDER_SCRIPTS``: Bruno's SMS gateway fails twice and then
takes the message, Chen's mailbox does not exist), and the settings that send to them
(``senders.push_primary = "fcm"``, ``sms_primary = "twilio"``, ``email_primary = "sendgrid"``).

The keys are made at start and written under the demo's work directory (the service-account key
file), or are secrets of the settings; none is printed or logged."""

from __future__ import annotations

import secrets
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from harness import scenario
from harness.provider_servers.fcm import FcmServer
from harness.provider_servers.script import Script
from harness.provider_servers.sendgrid import INVALID_ADDRESS, SendGridStub
from harness.provider_servers.sendgrid import Step as MailStep
from harness.provider_servers.tls import make_pki
from harness.provider_servers.twilio import Step as SmsStep
from harness.provider_servers.twilio import TwilioStub

#: how each protocol says the story's answers (``scenario.PROVIDER_SCRIPTS``' words): a Twilio
#: 503 with its "service unavailable" code, FCM's UNAVAILABLE and a SendGrid 503 are retried; a
#: number Twilio calls invalid (21211), FCM's UNREGISTERED and SendGrid's "Does not contain a
#: valid address." on the recipient (its API's answer for an address that cannot take mail) are
#: permanent and deactivate the address
PUSH_ANSWERS = {"ok": "ok", "transient": "UNAVAILABLE", "permanent": "UNREGISTERED"}
SMS_ANSWERS = {"ok": SmsStep(), "transient": SmsStep(503, 20503), "permanent": SmsStep(400, 21211)}
MAIL_ANSWERS = {"ok": MailStep(), "transient": MailStep(503), "permanent": MailStep(400, (INVALID_ADDRESS,))}
#: what each channel's provider is (the spec ``senders.<channel>_primary`` names)
SPECS = {"push": "fcm", "sms": "twilio", "email": "sendgrid"}
SMS_SENDER = "+15005550006"
MAIL_SENDER = "notifications@example.com"


def _script(target: Script[Any], answers: Mapping[str, Any], story: Mapping[str, list[str]]) -> None:
    for recipient, words in story.items():
        target[recipient] = [answers[w] for w in words]


@dataclass
class DemoWorld:
    """The servers, started; ``stop()`` them when done."""

    fcm: FcmServer
    twilio: TwilioStub
    sendgrid: SendGridStub
    ca_file: Path
    service_account_file: Path

    def senders_settings(self) -> dict[str, Any]:
        """The ``[senders]`` fields that send each channel through its protocol to these servers."""
        return {
            **{f"{channel}_primary": spec for channel, spec in SPECS.items()},
            "http_ca_file": str(self.ca_file),
            "fcm": {"service_account_file": str(self.service_account_file), "base_url": self.fcm.origin},
            "twilio": {"base_url": self.twilio.base_url, "account_sid": self.twilio.account_sid,
                       "auth_token": self.twilio.auth_token, "sender": SMS_SENDER},
            "sendgrid": {"base_url": self.sendgrid.base_url, "api_key": self.sendgrid.api_key,
                         "sender": MAIL_SENDER},
            # every marketing email carries a one-click unsubscribe link (the API's, not run here)
            "unsubscribe_url": "http://127.0.0.1:8080/unsubscribe",
            "unsubscribe_secrets": secrets.token_hex(32),
        }

    def stop(self) -> None:
        for server in (self.fcm, self.twilio, self.sendgrid):
            server.stop()


def start_world(work: Path) -> DemoWorld:
    """Start the three servers on loopback, scripted as the story's world, their keys under ``work``."""
    pki = make_pki(work / "pki", name="demo")
    fcm = FcmServer(pki=pki, project="notify-demo")
    twilio, sendgrid = TwilioStub(), SendGridStub()
    _script(fcm.script, PUSH_ANSWERS, scenario.PROVIDER_SCRIPTS.get("push", {}))
    _script(twilio.script, SMS_ANSWERS, scenario.PROVIDER_SCRIPTS.get("sms", {}))
    _script(sendgrid.script, MAIL_ANSWERS, scenario.PROVIDER_SCRIPTS.get("email", {}))
    started: list[FcmServer | TwilioStub | SendGridStub] = []
    try:
        for server in (fcm, twilio, sendgrid):
            server.start()
            started.append(server)
        key = work / "service-account.json"
        key.touch(mode=0o600)
        key.write_text(fcm.service_account_json(), encoding="utf-8")
    except BaseException:
        for server in started:
            server.stop()
        raise
    return DemoWorld(fcm, twilio, sendgrid, pki.ca_file, key)
