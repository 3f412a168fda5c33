"""Providers, chosen by configuration: an http(s) URL, ``smtp``, ``fcm``, ``apns``, or ``fake``.

A spec names the settings its provider reads: a URL and ``smtp`` the ``senders.http_*`` /
``senders.smtp_*`` fields, ``fcm`` the ``[senders.fcm]`` table, ``apns`` ``[senders.apns]``
(settings/providers.py; docs/senders.md, "Providers")."""

from __future__ import annotations

from urllib.parse import urlsplit

from operators.errors import ConfigError
from senders.policy.recipients import RecipientRules, rules_by_provider
from senders.providers.apns import ApnsProvider
from senders.providers.base import Provider, Receipt
from senders.providers.credentials import ApnsSigningKey, ServiceAccount, read_secret
from senders.providers.fake import Behaviour, FakeProvider, Received
from senders.providers.fcm import FcmProvider
from senders.providers.http import HttpProvider
from senders.providers.push import PushOptions
from senders.providers.smtp import SmtpProvider
from senders.runtime.metrics import Metrics
from settings import SendersSettings
from settings.providers import PushSettings

__all__ = [
    "ApnsProvider",
    "Behaviour",
    "FakeProvider",
    "FcmProvider",
    "HttpProvider",
    "Provider",
    "Receipt",
    "Received",
    "SmtpProvider",
    "build_provider",
    "provider_label",
]


def provider_label(spec: str) -> str:
    """A short name for metrics, logs and status records: the URL's host and port (never its
    ``user:password@``), ``smtp``, ``fake``."""
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
    spec: str, *, name: str, settings: SendersSettings, metrics: Metrics, max_connections: int | None = None
) -> Provider:
    """``max_connections``: the calls that may be open at once (the workers that share the
    provider times ``senders.max_in_flight``)."""
    own_rules = rules_by_provider(settings.invalid_recipient_rules).get(name)
    if spec == "fake" or spec.startswith("fake:"):
        return FakeProvider(name=name, metrics=metrics)
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
        )
    raise ConfigError(
        f"unknown provider {redacted(spec)!r}: expected an http(s):// URL, 'smtp', 'fcm', 'apns' or 'fake'"
    )


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
    )
