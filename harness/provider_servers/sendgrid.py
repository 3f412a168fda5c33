"""A local server that speaks SendGrid's v3 mail send and its signed event webhook, written from
SendGrid's public documentation (``/docs/sendgrid/api-reference/mail-send``, its errors page, and
``/for-developers/tracking-events/getting-started-event-webhook-security-features``),
independently of the adapter:

* ``POST /v3/mail/send`` with ``Authorization: Bearer <key>`` (else 401), a JSON body with
  ``personalizations[].to[].email``, ``from.email``, ``subject`` and ``content`` (else 400 with
  ``{"errors": [{"message", "field", "help"}]}``); a recipient that is no address is 400 "Does not
  contain a valid address." on ``personalizations.0.to.0.email``; ``202`` with ``X-Message-Id``.
* ``script[recipient]``: the replies of that recipient's requests in turn (the last repeats).
* ``post_events(url, [(message, event, extra)])``: the event webhook's batch, signed as SendGrid
  signs it (ECDSA P-256, SHA-256, over the timestamp then the body; base64 DER in
  ``X-Twilio-Email-Event-Webhook-Signature``), with a key pair of the stub's own whose public
  half ``public_key`` is (base64 DER, as SendGrid's console shows it).
"""

from __future__ import annotations

import base64
import json
import secrets
import time
from dataclasses import dataclass, field
from typing import Any

import httpx
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec

from harness.provider_servers.http1 import Reply, Request, StubServer
from harness.provider_servers.script import Script

INVALID_ADDRESS = {"message": "Does not contain a valid address.", "field": "personalizations.0.to.0.email",
                   "help": "http://sendgrid.com/docs/API_Reference/Web_API_v3/Mail/errors.html#message.personalizations.to"}


@dataclass(frozen=True)
class Step:
    """One scripted reply: ``status`` with ``errors``, headers, or a stall of ``stall_s``."""

    status: int = 202
    errors: tuple[dict[str, Any], ...] = ()
    headers: dict[str, str] = field(default_factory=dict)
    stall_s: float = 0.0


@dataclass(frozen=True)
class SentMail:
    message_id: str
    to: str
    body: dict[str, Any]
    authorization: str | None

    @property
    def headers(self) -> dict[str, str]:
        return dict(self.body.get("headers") or {})

    @property
    def custom_args(self) -> dict[str, str]:
        return dict(self.body["personalizations"][0].get("custom_args") or {})


class SendGridStub(StubServer):
    def __init__(self, api_key: str | None = None) -> None:
        super().__init__()
        self.api_key = api_key or "SG." + secrets.token_urlsafe(16)
        self.script: Script[Step] = Script(Step())
        self.sent: list[SentMail] = []
        self.requests: list[Request] = []
        self._key = ec.generate_private_key(ec.SECP256R1())
        der = self._key.public_key().public_bytes(serialization.Encoding.DER,
                                                  serialization.PublicFormat.SubjectPublicKeyInfo)
        self.public_key = base64.b64encode(der).decode()

    @staticmethod
    def _errors(status: int, *errors: dict[str, Any], headers: dict[str, str] | None = None) -> Reply:
        return Reply(status, {"Content-Type": "application/json", **(headers or {})},
                     json.dumps({"errors": list(errors)}).encode())

    def handle(self, request: Request) -> Reply:
        with self.lock:
            self.requests.append(request)
        if request.method != "POST" or request.target != "/v3/mail/send":
            return self._errors(404, {"message": "not found", "field": None, "help": None})
        if request.headers.get("authorization") != f"Bearer {self.api_key}":
            return self._errors(401, {"message": "The provided authorization grant is invalid, expired, or revoked",
                                      "field": None, "help": None})
        try:
            body = json.loads(request.body)
            to = body["personalizations"][0]["to"][0]["email"]
            assert isinstance(body["from"]["email"], str) and isinstance(body["subject"], str)
            assert [c["type"] for c in body["content"]] == ["text/plain", "text/html"]
            assert all(isinstance(v, str) for v in (body.get("headers") or {}).values())
            assert all(isinstance(v, str) for v in (body["personalizations"][0].get("custom_args") or {}).values())
        except (ValueError, KeyError, IndexError, TypeError, AssertionError):
            return self._errors(400, {"message": "Bad Request", "field": None, "help": None})
        step = self.script.next(to)
        if step.stall_s:
            return Reply(202, delay_s=step.stall_s)
        if step.status >= 300:
            return self._errors(step.status, *step.errors, headers=step.headers)
        if "@" not in to:
            return self._errors(400, INVALID_ADDRESS)
        message_id = secrets.token_urlsafe(16)[:22]
        with self.lock:
            self.sent.append(SentMail(message_id, to, body, request.headers.get("authorization")))
        return Reply(202, {"X-Message-Id": message_id})

    def to(self, recipient: str) -> list[SentMail]:
        with self.lock:
            return [m for m in self.sent if m.to == recipient]

    def event(self, mail: SentMail, name: str, **extra: Any) -> dict[str, Any]:
        """One event of ``mail`` as the webhook carries it (its custom arguments at the top level)."""
        return {
            "email": mail.to, "timestamp": int(time.time()),
            "smtp-id": f"<{mail.message_id}@ismtpd0001p1.sendgrid.net>",
            "event": name, "sg_event_id": secrets.token_urlsafe(16),
            "sg_message_id": f"{mail.message_id}.filterdrecv-5bd7c6b5c6-k2xv7-1-6581C0D1-2.0",
            **mail.custom_args, **extra,
        }

    def sign(self, payload: bytes, timestamp: int | None = None) -> dict[str, str]:
        ts = str(int(time.time()) if timestamp is None else timestamp)
        signature = self._key.sign(ts.encode() + payload, ec.ECDSA(hashes.SHA256()))
        return {"X-Twilio-Email-Event-Webhook-Signature": base64.b64encode(signature).decode(),
                "X-Twilio-Email-Event-Webhook-Timestamp": ts, "Content-Type": "application/json"}

    def post_events(self, url: str, events: list[dict[str, Any]], timestamp: int | None = None) -> httpx.Response:
        payload = (json.dumps(events) + "\r\n").encode()
        return httpx.post(url, content=payload, headers=self.sign(payload, timestamp), timeout=30)
