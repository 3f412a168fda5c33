"""The push providers' keys and the JWTs they sign (PyJWT): FCM's service-account assertion
(RS256), APNs' provider token (ES256) and when to renew it. Pure but for reading a key file;
the clock is an argument. A key is never shown: not in a repr, an error or a log line.

* **FCM** (OAuth2 JWT bearer, RFC 7523): a service-account key's ``client_email`` signs
  ``{iss, scope, aud: token_uri, iat, exp: iat + 3600}`` with its ``private_key`` (header ``kid``:
  its ``private_key_id``); the token endpoint exchanges it for an access token.
* **APNs**: ``{iss: team id, iat}`` signed with the ``.p8`` key (header ``kid``: its key id). A
  token is used for up to ``RENEW_AFTER_S`` (APNs refuses one older than an hour) and renewed at
  most every ``MIN_RENEW_S`` (more often, APNs answers ``TooManyProviderTokenUpdates``).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

import jwt
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa
from pydantic import SecretStr

from operators.errors import ConfigError

#: the scope an FCM access token needs
FCM_SCOPE = "https://www.googleapis.com/auth/firebase.messaging"
#: the JWT bearer grant (RFC 7523)
JWT_BEARER = "urn:ietf:params:oauth:grant-type:jwt-bearer"
#: an assertion's lifetime (Google takes at most an hour)
ASSERTION_LIFETIME_S = 3600
#: an APNs provider token is renewed once this old (APNs refuses one older than an hour)
RENEW_AFTER_S = 50 * 60
#: and never sooner than this after the last one (APNs: TooManyProviderTokenUpdates)
MIN_RENEW_S = 20 * 60


def read_secret(what: str, path: str, value: SecretStr | None) -> str:
    """A credential given as a file's path or as the secret itself; ConfigError if neither."""
    if value is not None:
        return value.get_secret_value()
    if not path:
        raise ConfigError(f"{what}: no key given (a file's path, or the key itself)")
    try:
        return Path(path).read_text(encoding="utf-8")
    except OSError as exc:
        raise ConfigError(f"{what}: cannot read the key file {path}: {exc.strerror}") from None


def _private_key(what: str, pem: str) -> rsa.RSAPrivateKey | ec.EllipticCurvePrivateKey:
    try:
        key = serialization.load_pem_private_key(pem.encode("utf-8"), password=None)
    except (ValueError, TypeError):
        raise ConfigError(f"{what}: the private key is not an unencrypted PEM key") from None
    if not isinstance(key, rsa.RSAPrivateKey | ec.EllipticCurvePrivateKey):
        raise ConfigError(f"{what}: the private key is neither RSA nor EC")
    return key


@dataclass(frozen=True)
class ServiceAccount:
    """A Google service-account key (the JSON file the Firebase console gives)."""

    client_email: str
    private_key_id: str
    token_uri: str
    project_id: str
    key: rsa.RSAPrivateKey = field(repr=False)

    @classmethod
    def parse(cls, text: str, what: str = "senders.fcm") -> ServiceAccount:
        """Raises ConfigError naming what is missing or wrong (never a value of the key)."""
        try:
            data = json.loads(text)
        except ValueError:
            raise ConfigError(f"{what}: the service-account key is not JSON") from None
        if not isinstance(data, dict):
            raise ConfigError(f"{what}: the service-account key is not a JSON object")
        wanted = ("client_email", "private_key", "token_uri")
        missing = [k for k in wanted if not isinstance(data.get(k), str) or not data[k]]
        if missing:
            raise ConfigError(f"{what}: the service-account key lacks {', '.join(missing)}")
        key = _private_key(what, data["private_key"])
        if not isinstance(key, rsa.RSAPrivateKey):
            raise ConfigError(f"{what}: a service-account key is RSA")
        if not data["token_uri"].startswith(("https://", "http://")):
            raise ConfigError(f"{what}: the service-account key's token_uri is not an http(s) URL")
        return cls(
            client_email=data["client_email"],
            private_key_id=str(data.get("private_key_id") or ""),
            token_uri=data["token_uri"],
            project_id=str(data.get("project_id") or ""),
            key=key,
        )

    def assertion(self, now_s: float, scope: str = FCM_SCOPE) -> str:
        """The signed JWT exchanged at ``token_uri`` for an access token."""
        iat = int(now_s)
        claims = {"iss": self.client_email, "scope": scope, "aud": self.token_uri, "iat": iat,
                  "exp": iat + ASSERTION_LIFETIME_S}
        headers = {"kid": self.private_key_id} if self.private_key_id else None
        return jwt.encode(claims, self.key, algorithm="RS256", headers=headers)


@dataclass(frozen=True)
class ApnsSigningKey:
    """The ``.p8`` key of an Apple developer account, with its key id and team id."""

    team_id: str
    key_id: str
    key: ec.EllipticCurvePrivateKey = field(repr=False)

    @classmethod
    def parse(cls, pem: str, *, team_id: str, key_id: str, what: str = "senders.apns") -> ApnsSigningKey:
        if not team_id or not key_id:
            raise ConfigError(f"{what}: team_id and key_id are required with a signing key")
        key = _private_key(what, pem)
        if not isinstance(key, ec.EllipticCurvePrivateKey) or not isinstance(key.curve, ec.SECP256R1):
            raise ConfigError(f"{what}: an APNs signing key is an EC P-256 key (the .p8 file)")
        return cls(team_id, key_id, key)

    def token(self, now_s: float) -> str:
        return jwt.encode({"iss": self.team_id, "iat": int(now_s)}, self.key, algorithm="ES256",
                          headers={"kid": self.key_id})


@dataclass(frozen=True)
class ProviderToken:
    """One APNs provider token and when it was made (epoch seconds)."""

    value: str = field(repr=False)
    issued_at_s: float


class ProviderTokens:
    """The APNs provider token in use: made on first use, renewed once ``RENEW_AFTER_S`` old,
    or when APNs says it expired, but never sooner than ``MIN_RENEW_S`` after the last one."""

    def __init__(self, key: ApnsSigningKey) -> None:
        self._key = key
        self._token: ProviderToken | None = None

    def _make(self, now_s: float) -> ProviderToken:
        self._token = ProviderToken(self._key.token(now_s), now_s)
        return self._token

    def current(self, now_s: float) -> ProviderToken:
        token = self._token
        if token is None or now_s - token.issued_at_s >= RENEW_AFTER_S:
            return self._make(now_s)
        return token

    def renew(self, expired: ProviderToken, now_s: float) -> ProviderToken | None:
        """A token in place of one APNs called expired: the current one if another call renewed
        it already, a new one if the last was made ``MIN_RENEW_S`` ago or more, else None (a
        token that young is not expired: the clock is wrong, and a renewal would be refused)."""
        token = self._token
        if token is not None and token is not expired:
            return token
        if now_s - expired.issued_at_s < MIN_RENEW_S:
            return None
        return self._make(now_s)
