"""The senders' section of the configuration, and providers chosen by it."""

from __future__ import annotations

from pathlib import Path

import pytest
from pydantic import SecretStr

from operators.errors import ConfigError
from operators.records import Channel
from senders.providers import FakeProvider, HttpProvider, SmtpProvider
from senders.runtime.metrics import Metrics
from senders.runtime.pool import build_dispatchers, sender_topics
from senders.statuses import Lane
from settings import load_settings


def test_defaults_file_and_environment(tmp_path: Path) -> None:
    path = tmp_path / "c.toml"
    path.write_text('[senders]\nmax_attempts = 3\nsms_primary = "https://sms-a.example/v1/send"\n')
    cfg = load_settings(
        path, env={"DEDUP_SENDERS_BASE_BACKOFF_MS": "1000", "DEDUP_SENDERS_HTTP_TOKEN": "t0k"}
    )
    s = cfg.senders
    assert (s.max_attempts, s.base_backoff_ms, s.sms_primary) == (3, 1000, "https://sms-a.example/v1/send")
    assert isinstance(s.http_token, SecretStr) and "t0k" not in repr(s)
    assert s.retry_policy().steps() == (1000, 2000)
    assert s.delay_topics("notifications.sms") == {
        1000: "notifications.sms.retry.1s",
        2000: "notifications.sms.retry.2s",
    }
    topics = sender_topics(cfg, [Channel.SMS], [Lane.PRIORITY])
    assert topics == [
        "notifications.status",
        "notifications.dlq",
        "notifications.sms.priority.retry.1s",
        "notifications.sms.priority.retry.2s",
    ]


def test_providers_are_chosen_by_configuration() -> None:
    cfg = load_settings(
        env={
            "DEDUP_SENDERS_PUSH_PRIMARY": "fake",
            "DEDUP_SENDERS_SMS_PRIMARY": "http://sms-a.example/send",
            "DEDUP_SENDERS_SMS_SECONDARY": "http://sms-b.example/send",
            "DEDUP_SENDERS_EMAIL_PRIMARY": "smtp",
        }
    )
    d = build_dispatchers(cfg, list(Channel), Metrics())
    assert isinstance(d[Channel.PUSH].primary, FakeProvider) and d[Channel.PUSH].secondary is None
    assert isinstance(d[Channel.SMS].primary, HttpProvider) and d[Channel.SMS].primary.name == "sms-a.example"
    assert isinstance(d[Channel.SMS].secondary, HttpProvider)
    assert isinstance(d[Channel.EMAIL].primary, SmtpProvider)


def test_an_unconfigured_channel_or_unknown_provider_is_a_config_error() -> None:
    with pytest.raises(ConfigError, match="no provider for sms: set senders.sms_primary"):
        build_dispatchers(load_settings(env={"DEDUP_SENDERS_SMS_PRIMARY": ""}), [Channel.SMS], Metrics())
    with pytest.raises(ConfigError, match="unknown provider"):
        build_dispatchers(
            load_settings(env={"DEDUP_SENDERS_SMS_PRIMARY": "carrier-pigeon"}), [Channel.SMS], Metrics()
        )


def test_hardening_settings_load_and_bad_values_are_refused_at_start() -> None:
    cfg = load_settings(
        env={
            "DEDUP_SENDERS_EMAIL_PRIMARY": "smtp",
            "DEDUP_SENDERS_SMTP_IMPLICIT_TLS": "true",
            "DEDUP_SENDERS_SMTP_PORT": "465",
            "DEDUP_SENDERS_HTTP_CA_FILE": "/etc/ssl/certs/ca-certificates.crt",
            "DEDUP_SENDERS_INSTANCE_TTL_MS": "9000",
        }
    )
    s = cfg.senders
    assert (s.smtp_implicit_tls, s.smtp_port, s.instance_ttl_ms) == (True, 465, 9000)
    assert isinstance(build_dispatchers(cfg, [Channel.EMAIL], Metrics())[Channel.EMAIL].primary, SmtpProvider)
    bad_rules = load_settings(env={"DEDUP_SENDERS_SMS_PRIMARY": "http://x/send", "DEDUP_SENDERS_HTTP_INVALID_RECIPIENT": "4o4"})
    with pytest.raises(ConfigError, match="invalid-recipient rule '4o4'"):
        build_dispatchers(bad_rules, [Channel.SMS], Metrics())
    no_ca = load_settings(env={"DEDUP_SENDERS_SMS_PRIMARY": "https://x/send", "DEDUP_SENDERS_HTTP_CA_FILE": "/nonexistent.pem"})
    with pytest.raises(ConfigError, match="cannot load the CA file"):
        build_dispatchers(no_ca, [Channel.SMS], Metrics())


def test_the_rules_templates_and_retention_come_from_the_senders_settings() -> None:
    cfg = load_settings(
        env={
            "DEDUP_SENDERS_MARKETING_PER_DAY": "2",
            "DEDUP_SENDERS_ONE_TIME_CODES_PER_HOUR": "7",
            "DEDUP_SENDERS_DEFAULT_LOCALE": "bn",
            "DEDUP_SENDERS_MAX_SMS_SEGMENTS": "2",
            "DEDUP_SENDERS_CONTACT_ENCRYPTION_KEYS": "k1,k2",
        }
    )
    s = cfg.senders
    rules = s.rule_options()
    assert (rules.marketing_per_day, rules.one_time_codes_per_window, rules.one_time_code_window_ms) == (2, 7, 3_600_000)
    templates = s.template_options()
    assert (templates.default_locale, templates.max_sms_segments) == ("bn", 2)
    assert templates.directory.endswith("/templates")  # the repository's by default
    assert "k1" not in repr(s) and s.contact_keys().encryption_keys is not None
    # the retention: the longest window, plus every backoff at its full jitter (or the cap), a lease each
    day30 = 30 * 86_400_000
    waits = [max(int(w * 1.2), 3_600_000) for w in (30_000, 60_000, 120_000, 240_000)]
    assert s.retention_ms(cfg.dedup.max_window_sec) == day30 + sum(waits) + 5 * 60_000
    assert cfg.with_overrides(senders={"status_retention_ms": 5}).senders.retention_ms(1) == 5
