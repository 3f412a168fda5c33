"""A local APNs server, written from Apple's public documentation ("Sending notification
requests to APNs", "Establishing a token-based connection", the reason codes).

``POST /3/device/{token}`` over HTTP/2 only. The provider token is checked as APNs does: an
ES256 JWT signed by the team's key (``kid`` its key id, ``iss`` the team id) and no older than an
hour by the server's clock (else 403 ``ExpiredProviderToken``); a new token sooner than 20
minutes after the last is 429 ``TooManyProviderTokenUpdates``. The headers (``apns-topic``,
``apns-push-type``, ``apns-priority``, ``apns-id``, ``apns-expiration``, ``apns-collapse-id``),
the device token and the payload (JSON, ``aps``, at most 4 KB) are checked with APNs' reasons;
then each device token is answered from ``script``.
"""

from __future__ import annotations

import json
import re
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any
from urllib.parse import unquote

import jwt
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec

from harness.provider_servers.h2 import H2Server, Reply, Seen
from harness.provider_servers.tls import Pki

#: how long APNs takes a provider token, and the least time between two of them
TOKEN_LIFETIME_S = 3600
MIN_UPDATE_S = 20 * 60
MAX_PAYLOAD = 4096


def _reason(status: int, reason: str, *headers: tuple[str, str]) -> Reply:
    body: dict[str, Any] = {"reason": reason}
    if status == 410:
        body["timestamp"] = int(time.time() * 1000)
    return Reply(status, body, headers)


#: the scripted answers, by reason
ANSWERS: dict[str, Reply] = {
    "Unregistered": _reason(410, "Unregistered"),
    "BadDeviceToken": _reason(400, "BadDeviceToken"),
    "DeviceTokenNotForTopic": _reason(400, "DeviceTokenNotForTopic"),
    "TooManyRequests": _reason(429, "TooManyRequests"),
    "TooManyProviderTokenUpdates": _reason(429, "TooManyProviderTokenUpdates"),
    "InternalServerError": _reason(500, "InternalServerError"),
    "ServiceUnavailable": _reason(503, "ServiceUnavailable", ("retry-after", "7")),
    "InvalidProviderToken": _reason(403, "InvalidProviderToken"),
    "ExpiredProviderToken": _reason(403, "ExpiredProviderToken"),
    "PayloadTooLarge": _reason(413, "PayloadTooLarge"),
}


@dataclass(frozen=True)
class TokenUse:
    """A provider token the first time the server saw it."""

    iat: int
    seen_at: float


class ApnsServer(H2Server):
    """``script`` maps a device token to the answers of its first, second, ... request (the last
    repeating): ``"ok"``, ``"slow"`` (after ``slow_s``) or a reason of ``ANSWERS``.
    ``expire_tokens_before``: tokens made before this instant are expired (APNs' clock moved on)."""

    def __init__(self, *, pki: Pki | None, team_id: str = "TEAM123456", key_id: str = "KEY1234567",
                 topic: str = "com.example.app", clock: Callable[[], float] | None = None,
                 delay_s: float = 0.0, slow_s: float = 5.0) -> None:
        super().__init__(pki=pki, delay_s=delay_s, slow_s=slow_s)
        self.team_id, self.key_id, self.topic = team_id, key_id, topic
        self.clock = clock or time.time
        self.key = ec.generate_private_key(ec.SECP256R1())
        self.tokens: dict[str, TokenUse] = {}  # every provider token taken, in order
        self.expire_tokens_before: float | None = None

    def p8(self) -> str:
        """The signing key as Apple's ``.p8`` file holds it (PKCS#8 PEM)."""
        return self.key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                      serialization.NoEncryption()).decode()

    def to(self, device: str) -> list[Seen]:
        return [s for s in list(self.seen) if s.path == f"/3/device/{device}"]

    async def handle(self, seen: Seen) -> Reply:
        if seen.http_version != "2":
            return Reply(505, {"reason": "APNs speaks HTTP/2 only"})
        match = re.fullmatch(r"/3/device/([^/]*)", seen.raw_path)  # the token is one segment
        if seen.method != "POST" or match is None:
            return _reason(405 if match else 404, "MethodNotAllowed" if match else "BadPath")
        refused = self._provider_token(seen.headers.get("authorization"))
        if refused is not None:
            return refused
        problem = self._check(seen, unquote(match.group(1)))
        if problem is not None:
            return problem
        answer = await self.scripted(unquote(match.group(1)), ANSWERS)
        if answer is not None:
            return answer
        return Reply(200, b"", (("apns-id", seen.headers.get("apns-id") or str(uuid.uuid4()).upper()),))

    def _provider_token(self, authorization: str | None) -> Reply | None:
        if not authorization or not authorization.startswith("bearer "):
            return _reason(403, "MissingProviderToken")
        token = authorization.removeprefix("bearer ")
        try:
            header = jwt.get_unverified_header(token)
            claims = jwt.decode(token, self.key.public_key(), algorithms=["ES256"], options={"verify_iat": False})
        except jwt.PyJWTError:
            return _reason(403, "InvalidProviderToken")
        iss, iat_ok = claims.get("iss"), isinstance(claims.get("iat"), int)
        if header.get("kid") != self.key_id or iss != self.team_id or not iat_ok:
            return _reason(403, "InvalidProviderToken")
        now, iat = self.clock(), claims["iat"]
        if now - iat > TOKEN_LIFETIME_S or (self.expire_tokens_before is not None and iat < self.expire_tokens_before):
            return _reason(403, "ExpiredProviderToken")
        if token not in self.tokens:
            last = max((u.seen_at for u in self.tokens.values()), default=None)
            if last is not None and now - last < MIN_UPDATE_S:
                return _reason(429, "TooManyProviderTokenUpdates")
            self.tokens[token] = TokenUse(iat, now)
        return None

    def _check(self, seen: Seen, device: str) -> Reply | None:
        h = seen.headers
        if "apns-topic" not in h:
            return _reason(400, "MissingTopic")
        if h["apns-topic"] != self.topic:
            return _reason(400, "BadTopic")
        if h.get("apns-push-type") != "alert":
            return _reason(400, "InvalidPushType")
        if h.get("apns-priority", "10") not in ("5", "10"):
            return _reason(400, "BadPriority")
        try:
            uuid.UUID(h.get("apns-id", str(uuid.uuid4())))
        except ValueError:
            return _reason(400, "BadMessageId")
        if not h.get("apns-expiration", "0").isdigit():
            return _reason(400, "BadExpirationDate")
        if len(h.get("apns-collapse-id", "").encode()) > 64:
            return _reason(400, "BadCollapseId")
        if not re.fullmatch(r"[0-9a-fA-F]{64,200}", device):
            return _reason(400, "BadDeviceToken")
        if len(seen.body) > MAX_PAYLOAD:
            return _reason(413, "PayloadTooLarge")
        try:
            payload = json.loads(seen.body)
        except ValueError:
            return _reason(400, "BadPayload")
        alert = payload.get("aps", {}).get("alert") if isinstance(payload, dict) else None
        if not isinstance(alert, dict) or not all(isinstance(alert.get(k), str) for k in ("title", "body")):
            return _reason(400, "PayloadEmpty")
        return None
