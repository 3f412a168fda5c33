"""The tables of the SMS gateway API (``[senders.twilio]``, spec ``twilio``) and of the email API
(``[senders.sendgrid]``, spec ``sendgrid``), in the shape of settings/providers.py (one small
model per provider; variables ``DEDUP_SENDERS_TWILIO_AUTH_TOKEN``...). What every email provider
shares stays in ``[senders]``: the one-click unsubscribe link (``unsubscribe_url``,
``unsubscribe_secrets``), as ``http_timeout_ms`` and ``http_ca_file`` do for every HTTP provider.

The API reads the same fields to verify the providers' signed receipts (the auth token signs
Twilio's status callbacks, the event webhook's verification key SendGrid's events): each fact
has this one place.
"""

from __future__ import annotations

import base64
import re
from typing import TYPE_CHECKING
from urllib.parse import urlsplit

from pydantic import field_validator

from settings.base import OptionalSecret, Section

if TYPE_CHECKING:
    from cryptography.hazmat.primitives.asymmetric.ec import EllipticCurvePublicKey

_SID = re.compile(r"[A-Za-z0-9]{1,64}")


def http_url(value: str, *, empty_ok: bool) -> str:
    """An http(s) URL with a host, no credentials, no fragment, nothing a header could not carry."""
    text = value.strip()
    if not text and empty_ok:
        return ""
    if not text.isascii() or any(c.isspace() or not c.isprintable() for c in text):
        raise ValueError("must be an http(s) URL: ASCII, no spaces or control characters")
    parts = urlsplit(text)
    if parts.scheme not in ("http", "https") or not parts.hostname or parts.username or parts.fragment:
        raise ValueError("must be an http(s) URL with a host (no user:password@, no #fragment)")
    return text


def load_event_webhook_key(text: str) -> EllipticCurvePublicKey:
    """SendGrid's event webhook verification key (base64 DER as its console shows it, or PEM);
    raises ValueError when it is not an ECDSA P-256 public key."""
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.hazmat.primitives.serialization import load_der_public_key, load_pem_public_key

    raw = text.strip()
    try:
        if raw.startswith("-----BEGIN"):
            key = load_pem_public_key(raw.encode("ascii"))
        else:
            key = load_der_public_key(base64.b64decode(raw, validate=True))
    except (ValueError, TypeError, UnicodeError):
        raise ValueError("not a public key (base64 DER or PEM)") from None
    if not isinstance(key, ec.EllipticCurvePublicKey) or not isinstance(key.curve, ec.SECP256R1):
        raise ValueError("not an ECDSA P-256 public key")
    return key


class TwilioSettings(Section):
    """Twilio's Messages API (spec ``twilio``), or a gateway that speaks it.

    :param base_url: where its REST API is (``POST {base}/2010-04-01/Accounts/{sid}/Messages.json``)
    :param account_sid: the account SID (``AC...``): the basic-auth user and part of the path
    :param auth_token: the account's auth token (a secret): the basic-auth password, and the key
        that signs its status callbacks (``X-Twilio-Signature``)
    :param sender: ``From``: a number in E.164 form or an alphanumeric sender id; empty:
        ``messaging_service_sid`` chooses it (one of the two is required)
    :param messaging_service_sid: a messaging service (``MG...``) to send through (its sender pool)
    :param status_callback: the API's public URL of ``POST /webhooks/twilio``, sent as each
        message's ``StatusCallback`` and the URL its signature is checked against; empty: no
        status callbacks (a sent message stays sent)
    """

    base_url: str = "https://api.twilio.com"
    account_sid: str = ""
    auth_token: OptionalSecret = None
    sender: str = ""
    messaging_service_sid: str = ""
    status_callback: str = ""

    @field_validator("base_url")
    @classmethod
    def _base_url(cls, value: str) -> str:
        return http_url(value, empty_ok=False)

    @field_validator("status_callback")
    @classmethod
    def _callback(cls, value: str) -> str:
        return http_url(value, empty_ok=True)

    @field_validator("account_sid", "messaging_service_sid")
    @classmethod
    def _sid(cls, value: str) -> str:
        text = value.strip()
        if text and not _SID.fullmatch(text):
            raise ValueError("a Twilio SID is letters and digits")
        return text


class SendgridSettings(Section):
    """SendGrid's v3 mail send (spec ``sendgrid``).

    :param base_url: where its v3 API is (``POST {base}/v3/mail/send``)
    :param api_key: the API key (a secret, with the mail-send permission), sent as a bearer token
    :param sender: the sender address (``from``); empty: ``senders.smtp_from``
    :param webhook_public_key: the signed event webhook's verification key (base64 DER as
        SendGrid's console shows it, or PEM; ECDSA P-256); empty: its events are refused
    """

    base_url: str = "https://api.sendgrid.com"
    api_key: OptionalSecret = None
    sender: str = ""
    webhook_public_key: str = ""

    @field_validator("base_url")
    @classmethod
    def _base_url(cls, value: str) -> str:
        return http_url(value, empty_ok=False)

    @field_validator("webhook_public_key")
    @classmethod
    def _public_key(cls, value: str) -> str:
        if value.strip():
            load_event_webhook_key(value)
        return value.strip()
