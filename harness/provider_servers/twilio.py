"""A local server that speaks Twilio's Messages API and its status callbacks, written from
Twilio's public documentation (``https://www.twilio.com/docs/messaging/api/message-resource``,
``/docs/usage/webhooks/webhooks-security``, ``/docs/api/errors``), independently of the adapter:

* ``POST /2010-04-01/Accounts/{AccountSid}/Messages.json``, form-encoded, HTTP basic auth with
  the account SID and auth token (else 401, code 20003); ``To`` required (21604) and in E.164
  form (else 400, 21211), ``From`` or ``MessagingServiceSid`` (else 21603), ``Body``;
  ``201 {"sid": "SM...", "status": "queued", ...}``.
* ``script[to]``: the replies of that recipient's requests in turn (the last repeats): an error
  ``(status, code)``, with ``Retry-After`` headers, or a stall past the client's deadline.
* ``callback(message, status, error_code)``: the status callback Twilio would POST to the
  message's ``StatusCallback``, signed as Twilio signs it (``X-Twilio-Signature``:
  base64(HMAC-SHA1(auth token, URL + each parameter's name and value, sorted by name))).
* ``early[to] = (status, error_code)``: that recipient's callback is POSTed before the send is
  answered (a callback sooner than the sender's record of the send); its reply in ``early_replies``.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import re
import secrets
from dataclasses import dataclass, field
from urllib.parse import parse_qsl, urlencode

import httpx

from harness.provider_servers.http1 import Reply, Request, StubServer
from harness.provider_servers.script import Script

E164 = re.compile(r"\+[1-9]\d{6,14}")
MESSAGES = re.compile(r"/2010-04-01/Accounts/(?P<sid>AC[0-9a-f]{32})/Messages\.json")


@dataclass(frozen=True)
class Step:
    """One scripted reply: ``status`` with Twilio's error ``code``, or a stall of ``stall_s``."""

    status: int = 201
    code: int | None = None
    headers: dict[str, str] = field(default_factory=dict)
    stall_s: float = 0.0


@dataclass(frozen=True)
class SentSms:
    sid: str
    to: str
    sender: str | None
    messaging_service_sid: str | None
    body: str
    status_callback: str | None
    authorization: str | None
    form: tuple[tuple[str, str], ...]


def twilio_signature(auth_token: str, url: str, params: dict[str, str]) -> str:
    data = url + "".join(f"{k}{params[k]}" for k in sorted(params))
    return base64.b64encode(hmac.new(auth_token.encode(), data.encode(), hashlib.sha1).digest()).decode()


class TwilioStub(StubServer):
    def __init__(self, account_sid: str | None = None, auth_token: str | None = None) -> None:
        super().__init__()
        self.account_sid = account_sid or "AC" + secrets.token_hex(16)
        self.auth_token = auth_token or secrets.token_hex(16)
        self.script: Script[Step] = Script(Step())
        self.sent: list[SentSms] = []
        self.requests: list[Request] = []
        self.early: dict[str, tuple[str, int | None]] = {}
        self.early_replies: dict[str, httpx.Response] = {}

    def _error(self, status: int, code: int, message: str, headers: dict[str, str] | None = None) -> Reply:
        body = {"code": code, "message": message, "more_info": f"https://www.twilio.com/docs/errors/{code}",
                "status": status}
        return Reply(status, {"Content-Type": "application/json", **(headers or {})}, json.dumps(body).encode())

    def handle(self, request: Request) -> Reply:
        with self.lock:
            self.requests.append(request)
        found = MESSAGES.fullmatch(request.target)
        if request.method != "POST" or found is None:
            return self._error(404, 20404, "The requested resource was not found")
        expected = base64.b64encode(f"{self.account_sid}:{self.auth_token}".encode()).decode()
        if found["sid"] != self.account_sid or request.headers.get("authorization") != f"Basic {expected}":
            return self._error(401, 20003, "Authenticate")
        if not request.headers.get("content-type", "").startswith("application/x-www-form-urlencoded"):
            return self._error(400, 20001, "Not a form")
        pairs = parse_qsl(request.body.decode("utf-8"), keep_blank_values=True)
        form = dict(pairs)
        to = form.get("To")
        if not to:
            return self._error(400, 21604, "A 'To' phone number is required.")
        step = self.script.next(to)
        if step.stall_s:
            return Reply(201, {"Content-Type": "application/json"}, b"{}", delay_s=step.stall_s)
        if step.code is not None:
            return self._error(step.status, step.code, "scripted", step.headers)
        if not E164.fullmatch(to):
            return self._error(400, 21211, f"The 'To' number {to} is not a valid phone number.")
        if not form.get("From") and not form.get("MessagingServiceSid"):
            return self._error(400, 21603, "A 'From' or 'MessagingServiceSid' parameter is required.")
        sid = "SM" + secrets.token_hex(16)
        sms = SentSms(sid, to, form.get("From"), form.get("MessagingServiceSid"), form.get("Body", ""),
                      form.get("StatusCallback"), request.headers.get("authorization"), tuple(pairs))
        with self.lock:
            self.sent.append(sms)
            early = self.early.get(to)
        if early is not None and sms.status_callback:
            answer = self.callback(sms, *early)
            with self.lock:
                self.early_replies[sid] = answer
        reply = {"sid": sid, "account_sid": self.account_sid, "to": to, "from": sms.sender, "body": sms.body,
                 "status": "queued", "api_version": "2010-04-01", "error_code": None, "num_segments": "1",
                 "messaging_service_sid": sms.messaging_service_sid,
                 "uri": f"/2010-04-01/Accounts/{self.account_sid}/Messages/{sid}.json"}
        return Reply(201, {"Content-Type": "application/json"}, json.dumps(reply).encode())

    def to(self, recipient: str) -> list[SentSms]:
        with self.lock:
            return [s for s in self.sent if s.to == recipient]

    def callback_form(self, sms: SentSms, status: str, error_code: int | None = None) -> dict[str, str]:
        params = {
            "AccountSid": self.account_sid, "ApiVersion": "2010-04-01", "From": sms.sender or "+15005550006",
            "To": sms.to, "MessageSid": sms.sid, "SmsSid": sms.sid, "MessageStatus": status, "SmsStatus": status,
        }
        if sms.messaging_service_sid:
            params["MessagingServiceSid"] = sms.messaging_service_sid
        if error_code is not None:
            params["ErrorCode"] = str(error_code)
        return params

    def callback(self, sms: SentSms, status: str, error_code: int | None = None,
                 auth_token: str | None = None) -> httpx.Response:
        """POST the signed status callback to the message's StatusCallback URL."""
        assert sms.status_callback, "the message was sent without a StatusCallback"
        params = self.callback_form(sms, status, error_code)
        signature = twilio_signature(auth_token or self.auth_token, sms.status_callback, params)
        return httpx.post(sms.status_callback, content=urlencode(params).encode(), timeout=30, headers={
            "Content-Type": "application/x-www-form-urlencoded", "X-Twilio-Signature": signature,
            "I-Twilio-Idempotency-Token": secrets.token_hex(8)})
