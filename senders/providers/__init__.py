"""Providers, chosen by configuration (``senders.<channel>_primary`` / ``_secondary``): an
http(s) URL (this project's JSON contract), ``smtp``, ``outbox``, ``fcm`` (push: Firebase Cloud
Messaging HTTP v1), ``apns`` (push: Apple Push Notification service), ``twilio`` (SMS: Twilio's
Messages API), ``sendgrid`` (email: SendGrid's v3 mail send), or ``fake``. A spec names the
settings its provider reads (``[senders.fcm]``, ``[senders.twilio]``...: settings/providers.py,
settings/sms_email.py); docs/senders.md has each one's settings and answers."""

from __future__ import annotations

from pathlib import Path
from urllib.parse import urlsplit

from operators.errors import ConfigError
from senders.policy.recipients import RecipientRules, rules_by_provider
from senders.providers import sendgrid, twilio
from senders.providers.apns import ApnsProvider
from senders.providers.base import Provider, Receipt
from senders.providers.credentials import ApnsSigningKey, ServiceAccount, read_secret
from senders.providers.fake import Behaviour, FakeProvider, Received
from senders.providers.fcm import FcmProvider
from senders.providers.http import HttpProvider
from senders.providers.outbox import OutboxProvider
from senders.providers.outbox_files import outbox_root
from senders.providers.push import PushOptions
from senders.providers.sendgrid import SendGridProvider
from senders.providers.smtp import SmtpProvider
from senders.providers.twilio import TwilioProvider
from senders.runtime.metrics import Metrics
from settings import SendersSettings
from settings.providers import PushSettings

__all__ = [
    "ApnsProvider",
    "Behaviour",
    "FakeProvider",
    "FcmProvider",
    "HttpProvider",
    "OutboxProvider",
    "Provider",
    "Receipt",
    "Received",
    "SendGridProvider",
    "SmtpProvider",
    "TwilioProvider",
    "PROVIDER_SPECS",
    "build_provider",
    "provider_label",
]


#: what a provider setting may name (the message of a missing or unknown one says it)
PROVIDER_SPECS = "an http(s):// URL, 'smtp', 'outbox', 'fcm', 'apns', 'twilio', 'sendgrid' or 'fake'"


def provider_label(spec: str) -> str:
    """A short name for metrics, logs and status records: the URL's host and port (never its
    ``user:password@``), ``smtp``, ``twilio``, ``sendgrid``, ``fake``. The API's receipts route
    (``POST /webhooks/{provider}``) is addressed by it."""
    if spec.startswith(("http://", "https://")):
        return urlsplit(spec).netloc.rsplit("@", 1)[-1]
    return spec


def redacted(spec: str) -> str:
    """A provider spec fit for a message: credentials in a URL masked."""
    parts = urlsplit(spec)
    if "@" not in parts.netloc:
        return spec
    return parts._replace(netloc="***@" + parts.netloc.rsplit("@", 1)[-1]).geturl()


def build_provider(
    spec: str,
    *,
    name: str,
    settings: SendersSettings,
    metrics: Metrics,
    max_connections: int | None = None,
    data_dir: Path | None = None,
) -> Provider:
    """``max_connections``: the calls that may be open at once (the workers that share the
    provider times ``senders.max_in_flight``); ``data_dir``: the settings' data directory (the
    outbox is under it)."""
    own_rules = rules_by_provider(settings.invalid_recipient_rules).get(name)
    if spec == "fake" or spec.startswith("fake:"):
        return FakeProvider(name=name, metrics=metrics)
    if spec == "outbox":
        if data_dir is None:
            raise ConfigError("the outbox provider needs the data directory (data_dir) it writes under")
        return OutboxProvider(name=name, root=outbox_root(data_dir), limits=settings.outbox_limits(), metrics=metrics)
    if spec.startswith(("http://", "https://")):
        return HttpProvider(
            name=name,
            url=spec,
            timeout_s=settings.http_timeout_ms / 1000,
            token=settings.http_token,
            ca_file=settings.http_ca_file or None,
            invalid_recipient=own_rules or RecipientRules.parse(settings.http_invalid_recipient),
            metrics=metrics,
            max_connections=max_connections or settings.max_in_flight,
            http2=settings.http2,
        )
    if spec == "fcm":
        return _fcm(name, settings, metrics, max_connections or settings.max_in_flight)
    if spec == "apns":
        return _apns(name, settings, metrics, max_connections or settings.max_in_flight)
    if spec == "smtp":
        return SmtpProvider(
            name=name,
            host=settings.smtp_host,
            port=settings.smtp_port,
            sender=settings.smtp_from,
            timeout_s=settings.smtp_timeout_ms / 1000,
            starttls=settings.smtp_starttls,
            implicit_tls=settings.smtp_implicit_tls,
            ca_file=settings.smtp_ca_file or None,
            username=settings.smtp_username,
            password=settings.smtp_password,
            invalid_recipient=own_rules or RecipientRules.parse(settings.smtp_invalid_recipient),
            metrics=metrics,
            pool_size=settings.smtp_pool_size,
            unsubscribe_url=settings.unsubscribe_url,
            unsubscribe_key=next(iter(settings.unsubscribe_keys()), None),
        )
    if spec == twilio.SPEC:
        return TwilioProvider(
            name=name,
            account_sid=settings.twilio.account_sid,
            auth_token=settings.twilio.auth_token,
            timeout_s=settings.http_timeout_ms / 1000,
            sender=settings.twilio.sender,
            messaging_service_sid=settings.twilio.messaging_service_sid,
            status_callback=settings.twilio.status_callback,
            base_url=settings.twilio.base_url,
            ca_file=settings.http_ca_file or None,
            invalid_recipient=own_rules,
            metrics=metrics,
            max_connections=max_connections or settings.max_in_flight,
            http2=settings.http2,
        )
    if spec == sendgrid.SPEC:
        return SendGridProvider(
            name=name,
            api_key=settings.sendgrid.api_key,
            sender=settings.sendgrid.sender or settings.smtp_from,
            timeout_s=settings.http_timeout_ms / 1000,
            unsubscribe_url=settings.unsubscribe_url,
            unsubscribe_key=next(iter(settings.unsubscribe_keys()), None),
            base_url=settings.sendgrid.base_url,
            ca_file=settings.http_ca_file or None,
            invalid_recipient=own_rules,
            metrics=metrics,
            max_connections=max_connections or settings.max_in_flight,
            http2=settings.http2,
        )
    raise ConfigError(f"unknown provider {redacted(spec)!r}: expected {PROVIDER_SPECS}")


def _push_options(table: PushSettings) -> PushOptions:
    return PushOptions(ttl_s=table.ttl_s, code_ttl_s=table.code_ttl_s)


def _fcm(name: str, settings: SendersSettings, metrics: Metrics, max_connections: int) -> FcmProvider:
    fcm = settings.fcm
    key = read_secret("senders.fcm", fcm.service_account_file, fcm.service_account_json)
    return FcmProvider(
        name=name,
        account=ServiceAccount.parse(key),
        project_id=fcm.project_id,
        base_url=fcm.base_url,
        timeout_s=settings.http_timeout_ms / 1000,
        ca_file=settings.http_ca_file or None,
        options=_push_options(fcm),
        metrics=metrics,
        max_connections=max_connections,
        streams_per_connection=fcm.streams_per_connection,
    )


def _apns(name: str, settings: SendersSettings, metrics: Metrics, max_connections: int) -> ApnsProvider:
    apns = settings.apns
    pem = read_secret("senders.apns", apns.key_file, apns.key)
    return ApnsProvider(
        name=name,
        key=ApnsSigningKey.parse(pem, team_id=apns.team_id, key_id=apns.key_id),
        topic=apns.topic,
        base_url=apns.base_url,
        timeout_s=settings.http_timeout_ms / 1000,
        ca_file=settings.http_ca_file or None,
        options=_push_options(apns),
        metrics=metrics,
        max_connections=max_connections,
        streams_per_connection=apns.streams_per_connection,
    )
