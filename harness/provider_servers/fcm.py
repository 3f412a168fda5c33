"""A local FCM HTTP v1 server and its OAuth2 token endpoint, written from Firebase's public
documentation (``projects.messages.send``, the error codes, the JWT-bearer token exchange).

The token endpoint (``POST /token``) checks the assertion as Google does: an RS256 JWT signed
by the service account's key (``kid`` its key id), ``iss`` the account, ``aud`` the token URI,
the messaging scope, at most an hour long; it answers ``access_token`` and ``expires_in``.
``POST /v1/projects/{project}/messages:send`` takes only tokens it issued and that have not
expired by its clock, checks the message's shape, and answers per device token from ``script``.
"""

from __future__ import annotations

import functools
import itertools
import json
import re
import secrets
import time
from collections.abc import Callable
from typing import Any
from urllib.parse import parse_qs

import jwt
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import rsa

from harness.provider_servers.h2 import H2Server, Reply, Seen, error_json
from harness.provider_servers.tls import Pki
from senders.providers.credentials import FCM_SCOPE, JWT_BEARER

FCM_ERROR = "type.googleapis.com/google.firebase.fcm.v1.FcmError"
BAD_REQUEST = "type.googleapis.com/google.rpc.BadRequest"


def _fcm(code: str) -> dict[str, Any]:
    return {"@type": FCM_ERROR, "errorCode": code}


def _field(name: str, text: str) -> dict[str, Any]:
    return {"@type": BAD_REQUEST, "fieldViolations": [{"field": name, "description": text}]}


#: the scripted answers, by name (the documentation's examples)
ANSWERS: dict[str, Reply] = {
    "UNREGISTERED": Reply(404, error_json(404, "NOT_FOUND", "Requested entity was not found.", _fcm("UNREGISTERED"))),
    "INVALID_TOKEN": Reply(400, error_json(
        400, "INVALID_ARGUMENT", "The registration token is not a valid FCM registration token",
        _fcm("INVALID_ARGUMENT"))),
    "INVALID_TOKEN_FIELD": Reply(400, error_json(
        400, "INVALID_ARGUMENT", "Invalid value at 'message.token'",
        _field("message.token", "Invalid registration token"))),
    "INVALID_PAYLOAD": Reply(400, error_json(
        400, "INVALID_ARGUMENT", "Invalid value at 'message.data[0].value' (TYPE_STRING), 12",
        _field("message.data[0].value", "Invalid value at 'message.data[0].value' (TYPE_STRING), 12"))),
    "QUOTA_EXCEEDED": Reply(429, error_json(429, "RESOURCE_EXHAUSTED", "Quota exceeded.", _fcm("QUOTA_EXCEEDED")),
                            (("retry-after", "17"),)),
    "UNAVAILABLE": Reply(503, error_json(503, "UNAVAILABLE", "The service is currently unavailable.",
                                         _fcm("UNAVAILABLE")), (("retry-after", "5"),)),
    "INTERNAL": Reply(500, error_json(500, "INTERNAL", "Internal error encountered.", _fcm("INTERNAL"))),
    "SENDER_ID_MISMATCH": Reply(403, error_json(403, "PERMISSION_DENIED", "SenderId mismatch",
                                                _fcm("SENDER_ID_MISMATCH"))),
    "THIRD_PARTY_AUTH_ERROR": Reply(401, error_json(401, "UNAUTHENTICATED", "Auth error from APNS or Web Push Service",
                                                    _fcm("THIRD_PARTY_AUTH_ERROR"))),
}
UNAUTHENTICATED = Reply(401, error_json(
    401, "UNAUTHENTICATED", "Request had invalid authentication credentials. Expected OAuth 2 access token."))


@functools.cache
def _shared_key() -> rsa.RSAPrivateKey:
    return new_key()


def new_key() -> rsa.RSAPrivateKey:
    return rsa.generate_private_key(public_exponent=65537, key_size=2048)


class FcmServer(H2Server):
    """``script`` maps a device token to the answers of its first, second, ... message (the last
    repeating): ``"ok"``, ``"slow"`` (answered after ``slow_s``) or a name of ``ANSWERS``.
    ``token_replies``: the token endpoint's next answers, in order (then: tokens).
    ``refuse_tokens``: every send is 401, whatever its token."""

    def __init__(self, *, pki: Pki | None, project: str = "proj-1", clock: Callable[[], float] | None = None,
                 expires_in: int = 3600, delay_s: float = 0.0, slow_s: float = 5.0,
                 key: rsa.RSAPrivateKey | None = None) -> None:
        """``key``: the service account's; by default one key shared by every server (RSA keys
        take a while to make)."""
        super().__init__(pki=pki, delay_s=delay_s, slow_s=slow_s)
        self.project = project
        self.clock = clock or time.time
        self.expires_in = expires_in
        self.key = key or _shared_key()
        self.key_id = "key-1"
        self.client_email = f"sender@{project}.iam.gserviceaccount.com"
        self.token_replies: list[Reply] = []
        self.refuse_tokens = False
        self.issued: dict[str, float] = {}  # access token -> expires at (server clock)
        self.assertions: list[dict[str, Any]] = []  # the claims of every assertion taken
        self._ids = itertools.count(1)

    @property
    def token_uri(self) -> str:
        return f"{self.origin}/token"

    def service_account_json(self, **changes: Any) -> str:
        """A service-account key file as the Firebase console gives it (its key is this server's)."""
        pem = self.key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                     serialization.NoEncryption()).decode()
        key = {"type": "service_account", "project_id": self.project, "private_key_id": self.key_id,
               "private_key": pem, "client_email": self.client_email, "client_id": "1234567890",
               "token_uri": self.token_uri, **changes}
        return json.dumps(key)

    def sends(self) -> list[Seen]:
        return [s for s in list(self.seen) if s.path.endswith("/messages:send")]

    def token_requests(self) -> list[Seen]:
        return [s for s in list(self.seen) if s.path == "/token"]

    def messages_to(self, device: str) -> list[dict[str, Any]]:
        return [s.json()["message"] for s in self.sends() if s.json()["message"].get("token") == device]

    def revoke_tokens(self) -> None:
        self.issued.clear()

    async def handle(self, seen: Seen) -> Reply:
        if seen.path == "/token" and seen.method == "POST":
            return self._token(seen)
        if seen.method == "POST" and seen.path == f"/v1/projects/{self.project}/messages:send":
            return await self._send(seen)
        return Reply(404, error_json(404, "NOT_FOUND", "no such method"))

    # -- the token endpoint -------------------------------------------------------------------------

    def _token(self, seen: Seen) -> Reply:
        if self.token_replies:
            return self.token_replies.pop(0)
        form = {k: v[0] for k, v in parse_qs(seen.body.decode()).items()}
        if form.get("grant_type") != JWT_BEARER or "assertion" not in form:
            return Reply(400, {"error": "unsupported_grant_type"})
        try:
            header = jwt.get_unverified_header(form["assertion"])
            claims = jwt.decode(form["assertion"], self.key.public_key(), algorithms=["RS256"],
                                audience=self.token_uri, options={"verify_exp": False, "verify_iat": False})
        except jwt.PyJWTError as exc:
            return Reply(400, {"error": "invalid_grant", "error_description": f"Invalid JWT: {exc}"})
        now = self.clock()
        problems = [
            header.get("kid") != self.key_id and "kid",
            claims.get("iss") != self.client_email and "iss",
            FCM_SCOPE not in str(claims.get("scope", "")).split() and "scope",
            not (0 < claims.get("exp", 0) - claims.get("iat", 0) <= 3600) and "lifetime",
            not (claims.get("iat", 0) - 60 <= now <= claims.get("exp", 0)) and "time",
        ]
        if any(problems):
            return Reply(400, {"error": "invalid_grant", "error_description": f"bad {[p for p in problems if p]}"})
        self.assertions.append(claims)
        token = "ya29." + secrets.token_urlsafe(24)
        self.issued[token] = now + self.expires_in
        return Reply(200, {"access_token": token, "expires_in": self.expires_in, "token_type": "Bearer"})

    # -- messages:send ------------------------------------------------------------------------------

    async def _send(self, seen: Seen) -> Reply:
        auth = seen.headers.get("authorization", "")
        token = auth.removeprefix("Bearer ") if auth.startswith("Bearer ") else None
        if self.refuse_tokens or token is None or self.issued.get(token, 0) <= self.clock():
            return UNAUTHENTICATED
        problem = _check_message(seen)
        if problem is not None:
            return Reply(400, error_json(400, "INVALID_ARGUMENT", problem, _field("message", problem)))
        answer = await self.scripted(seen.json()["message"]["token"], ANSWERS)
        if answer is not None:
            return answer
        return Reply(200, {"name": f"projects/{self.project}/messages/0:{next(self._ids)}%31bd1c9631bd1c96"})


def _check_message(seen: Seen) -> str | None:
    """What is wrong with a send's body, as FCM would refuse it (None: nothing)."""
    if not seen.headers.get("content-type", "").startswith("application/json"):
        return "content type"
    try:
        body = seen.json()
    except ValueError:
        return "not JSON"
    message = body.get("message") if isinstance(body, dict) else None
    if not isinstance(message, dict) or set(body) - {"message", "validate_only"}:
        return "message"
    if not isinstance(message.get("token"), str) or not message["token"]:
        return "message.token"
    notification = message.get("notification", {})
    if not all(isinstance(notification.get(k), str) for k in ("title", "body")):
        return "message.notification"
    data = message.get("data", {})
    if not isinstance(data, dict) or not all(isinstance(v, str) for v in data.values()):
        return "message.data"
    android = message.get("android", {})
    if android.get("priority") not in ("normal", "high"):
        return "message.android.priority"
    if not re.fullmatch(r"\d+(\.\d{1,9})?s", str(android.get("ttl", "0s"))):
        return "message.android.ttl"
    headers = message.get("apns", {}).get("headers", {})
    if headers.get("apns-priority") not in (None, "5", "10"):
        return "message.apns.headers"
    return None
