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


# -- the providers' tables ([senders.fcm], [senders.apns]) -------------------------------------------


def test_provider_tables_from_file_and_environment_field_by_field(tmp_path: Path) -> None:
    path = tmp_path / "c.toml"
    path.write_text(
        '[senders]\npush_primary = "fcm"\n'
        '[senders.fcm]\nproject_id = "from-file"\nservice_account_file = "/keys/sa.json"\ncode_ttl_s = 300\n'
        '[senders.apns]\nteam_id = "TEAM123456"\ntopic = "com.example.app"\n'
    )
    cfg = load_settings(path, env={
        "DEDUP_SENDERS_FCM_PROJECT_ID": "from-env",
        "DEDUP_SENDERS_APNS_KEY": "-----BEGIN PRIVATE KEY-----\nsecret-p8\n-----END PRIVATE KEY-----",
        "DEDUP_SENDERS_APNS_BASE_URL": "https://api.sandbox.push.apple.com",
    })
    fcm, apns = cfg.senders.fcm, cfg.senders.apns
    # the variable replaces one field of the file's table, the others stay
    assert (fcm.project_id, fcm.service_account_file, fcm.code_ttl_s, fcm.ttl_s) == (
        "from-env", "/keys/sa.json", 300, 28 * 86_400)
    assert (apns.team_id, apns.topic, apns.base_url) == ("TEAM123456", "com.example.app",
                                                         "https://api.sandbox.push.apple.com")
    assert isinstance(apns.key, SecretStr) and "secret-p8" not in repr(cfg) and "secret-p8" not in str(cfg.senders)
    # copies keep the tables, and a table can be replaced through the overrides
    copied = cfg.with_overrides(senders={"max_attempts": 2})
    assert copied.senders.fcm == fcm and copied.senders.apns.key == apns.key
    assert cfg.with_overrides(senders={"fcm": {"project_id": "p2"}}).senders.fcm.project_id == "p2"


def test_provider_tables_refuse_unknown_keys_bad_values_and_two_keys(tmp_path: Path) -> None:
    path = tmp_path / "c.toml"
    path.write_text('[senders.fcm]\nproject = "typo"\n')
    with pytest.raises(ConfigError, match="project"):
        load_settings(path, env={})
    with pytest.raises(ConfigError, match="senders.apns.code_ttl_s"):
        load_settings(env={"DEDUP_SENDERS_APNS_CODE_TTL_S": "0"})
    with pytest.raises(ConfigError, match="not both") as err:
        load_settings(env={"DEDUP_SENDERS_FCM_SERVICE_ACCOUNT_FILE": "/k.json",
                           "DEDUP_SENDERS_FCM_SERVICE_ACCOUNT_JSON": '{"private_key": "s3cr3t"}'})
    assert "s3cr3t" not in str(err.value)
    # a variable that names no setting of a table is someone else's, as elsewhere
    assert load_settings(env={"DEDUP_SENDERS_FCM_NOPE": "x"}).senders.fcm.project_id == ""


def test_a_settings_file_written_for_a_process_keeps_the_tables(tmp_path: Path) -> None:
    from harness.settings_file import write_settings

    cfg = load_settings(env={"DEDUP_SENDERS_FCM_PROJECT_ID": "p", "DEDUP_SENDERS_FCM_SERVICE_ACCOUNT_JSON": "{}",
                             "DEDUP_SENDERS_APNS_TOPIC": "com.example.app", "DEDUP_SENDERS_PUSH_PRIMARY": "apns",
                             "DEDUP_FLINK_REST_PORT": "18081", "DEDUP_FLINK_CHECKPOINT_DIR": str(tmp_path / "cp")})
    again = load_settings(write_settings(cfg, tmp_path / "s.toml"), env={})
    assert again.senders == cfg.senders
    # the job's section too: a job started from the file takes its REST port and checkpoints
    assert again.flink == cfg.flink
    assert (again.flink.rest_port, again.flink.checkpoint_dir) == (18081, str(tmp_path / "cp"))
    assert again.senders.fcm.service_account_json is not None
    assert again.senders.fcm.service_account_json.get_secret_value() == "{}"
