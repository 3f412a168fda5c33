"""settings.load_settings: defaults < TOML file < DEDUP_* variables, and secrets."""

from __future__ import annotations

import json
import logging
import typing
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import SecretStr

from operators.contract import Topics
from operators.errors import ConfigError
from operators.window import DAY_MS, LatePolicy, WindowConfig
from settings import (
    DedupSettings,
    FlinkSettings,
    KafkaSettings,
    SendersSettings,
    Settings,
    load_settings,
)

PASSWORD = "hunter2-Zz9!"


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "dedup.toml"
    path.write_text(text, encoding="utf-8")
    return path


def test_defaults() -> None:
    cfg = load_settings(env={})
    assert cfg == Settings()
    assert cfg.kafka.bootstrap_servers == "127.0.0.1:9092"
    assert cfg.kafka.sasl_password is None
    assert cfg.topics == Topics()
    assert cfg.topics.requests == "notifications.requests"
    assert cfg.dedup.default_window_sec == 7 * 86_400 and cfg.dedup.max_window_sec == 30 * 86_400
    assert cfg.flink.parallelism == 1
    assert cfg.data_dir == ".data"
    # the dedup section's defaults are the window module's
    assert cfg.dedup.window_config() == WindowConfig()
    assert cfg.dedup.window_config().late_policy is LatePolicy.SIDE_OUTPUT


def test_defaults_ignore_the_process_environment_when_env_is_given(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DEDUP_KAFKA_PARTITIONS", "11")
    assert load_settings(env={}).kafka.partitions == 3
    assert load_settings().kafka.partitions == 11  # env=None reads os.environ


def test_toml_file(tmp_path: Path) -> None:
    path = write(
        tmp_path,
        """
data_dir = "/var/lib/dedup"

[kafka]
bootstrap_servers = "broker-1:9093,broker-2:9093"
security_protocol = "SASL_SSL"
sasl_mechanism = "SCRAM-SHA-512"
sasl_username = "dedup"
partitions = 12

[topics]
late = "late.v2"

[dedup]
default_window_sec = 3600
allowed_lateness_ms = 250
late_policy = "best-effort"
bloom_fp_rate = 0.001

[flink]
parallelism = 4
checkpoint_dir = "s3://bucket/checkpoints"
""",
    )
    cfg = load_settings(path, env={})
    assert cfg.data_dir == "/var/lib/dedup"
    assert cfg.kafka.bootstrap_servers == "broker-1:9093,broker-2:9093"
    assert cfg.kafka.sasl_mechanism == "SCRAM-SHA-512"
    assert cfg.kafka.partitions == 12
    assert cfg.kafka.replication_factor == KafkaSettings().replication_factor  # untouched
    assert cfg.topics.late == "late.v2" and cfg.topics.duplicates == Topics().duplicates
    assert cfg.dedup.bloom_fp_rate == 0.001
    assert cfg.flink.parallelism == 4
    assert cfg.flink.checkpoint_uri() == "s3://bucket/checkpoints"
    window = cfg.dedup.window_config()
    assert window == WindowConfig(
        default_window_ms=3_600_000,
        max_window_ms=30 * DAY_MS,
        allowed_lateness_ms=250,
        late_policy=LatePolicy.BEST_EFFORT,
    )
    assert window.late_policy is LatePolicy.BEST_EFFORT
    assert "late.v2" in cfg.topics.outputs() and Topics().late not in cfg.topics.outputs()


def test_dedup_config_variable_names_the_file(tmp_path: Path) -> None:
    path = write(tmp_path, "[kafka]\npartitions = 7\n")
    assert load_settings(env={"DEDUP_CONFIG": str(path)}).kafka.partitions == 7
    # an explicit file wins over the variable
    other = tmp_path / "other.toml"
    other.write_text("[kafka]\npartitions = 8\n", encoding="utf-8")
    assert load_settings(other, env={"DEDUP_CONFIG": str(path)}).kafka.partitions == 8


def test_environment_overrides_file(tmp_path: Path) -> None:
    path = write(
        tmp_path,
        'data_dir = "from-file"\n[kafka]\npartitions = 6\ngroup_id = "file"\n[dedup]\nshards = 64\n',
    )
    env = {
        "DEDUP_KAFKA_PARTITIONS": "9",
        "DEDUP_TOPICS_PUSH_PRIORITY": "push.fast",
        "DEDUP_DEDUP_LATE_POLICY": "best-effort",
        "DEDUP_DEDUP_BLOOM_FP_RATE": "0.05",
        "DEDUP_FLINK_REST_PORT": "18081",
        "DEDUP_DATA_DIR": "from-env",
    }
    cfg = load_settings(path, env=env)
    assert cfg.kafka.partitions == 9 and isinstance(cfg.kafka.partitions, int)
    assert cfg.kafka.group_id == "file"  # file value kept where env says nothing
    assert cfg.dedup.shards == 64
    assert cfg.topics.push_priority == "push.fast"
    assert cfg.dedup.late_policy == "best-effort"
    assert cfg.dedup.bloom_fp_rate == 0.05 and isinstance(cfg.dedup.bloom_fp_rate, float)
    assert cfg.flink.rest_port == 18081
    assert cfg.data_dir == "from-env"


def test_variables_that_are_not_settings_are_left_alone() -> None:
    cfg = load_settings(env={"DEDUP_SCHEMAS_DIR": "/x", "DEDUP_KAFKA": "y", "KAFKA_PARTITIONS": "5"})
    assert cfg == Settings()


def test_unknown_key_in_a_section(tmp_path: Path) -> None:
    path = write(tmp_path, '[kafka]\nbootstrap_server = "typo:9092"\n')
    with pytest.raises(ConfigError, match=r"unknown setting\(s\) in \[kafka\]: bootstrap_server"):
        load_settings(path, env={})


def test_unknown_section(tmp_path: Path) -> None:
    path = write(tmp_path, "[kafak]\npartitions = 3\n")
    with pytest.raises(ConfigError, match=r"unknown section\(s\).*kafak"):
        load_settings(path, env={})


def test_unreadable_or_malformed_file(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="cannot read config file"):
        load_settings(tmp_path / "missing.toml", env={})
    with pytest.raises(ConfigError, match="cannot read config file"):
        load_settings(write(tmp_path, "[kafka\n"), env={})


def test_unknown_key_in_overrides() -> None:
    with pytest.raises(ConfigError, match="unknown setting"):
        Settings().with_overrides(flink={"paralelism": 2})


def test_bad_values_raise_config_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="kafka.partitions"):
        load_settings(env={"DEDUP_KAFKA_PARTITIONS": "three"})
    with pytest.raises(ConfigError, match="dedup.bloom_fp_rate"):
        load_settings(write(tmp_path, '[dedup]\nbloom_fp_rate = "low"\n'), env={})


# -- coercion -------------------------------------------------------------------------------------


def starttls(value: object) -> bool:
    return Settings().with_overrides(senders={"smtp_starttls": value}).senders.smtp_starttls


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ("1", True),
        ("true", True),
        ("TRUE", True),
        (" yes ", True),
        ("on", True),
        ("0", False),
        ("false", False),
        ("no", False),
        ("off", False),
        ("", False),
        ("nope", False),
        (True, True),
        (False, False),
        (1, True),
        (0, False),
    ],
)
def test_bool_coercion(value: object, expected: bool) -> None:
    assert starttls(value) is expected
    if isinstance(value, str):
        assert load_settings(env={"DEDUP_SENDERS_SMTP_STARTTLS": value}).senders.smtp_starttls is expected


def test_int_float_and_optional_coercion() -> None:
    def kafka(**values: object) -> KafkaSettings:
        return Settings().with_overrides(kafka=values).kafka

    assert kafka(partitions="42").partitions == 42 and isinstance(kafka(partitions="42").partitions, int)
    assert kafka(partitions=" -7 ").partitions == -7
    assert kafka(partitions=5).partitions == 5
    dedup = Settings().with_overrides(dedup={"bloom_fp_rate": "0.25"}).dedup
    assert dedup.bloom_fp_rate == 0.25
    dedup = Settings().with_overrides(dedup={"bloom_fp_rate": 3}).dedup
    assert dedup.bloom_fp_rate == 3.0 and isinstance(dedup.bloom_fp_rate, float)
    assert kafka(sasl_mechanism="").sasl_mechanism is None
    assert kafka(sasl_mechanism="PLAIN").sasl_mechanism == "PLAIN"
    # None leaves a setting as it was
    assert kafka(sasl_mechanism=None).sasl_mechanism is None and kafka(partitions=None).partitions == 3
    for bad in ("1.5", "ten", "", 2.5):
        with pytest.raises(ConfigError, match=r"^kafka\.partitions: "):
            kafka(partitions=bad)
    with pytest.raises(ConfigError, match=r"^dedup\.bloom_fp_rate: "):
        Settings().with_overrides(dedup={"bloom_fp_rate": "fast"})


def test_values_outside_their_choices_name_the_setting() -> None:
    with pytest.raises(ConfigError, match=r"dedup\.late_policy: .*side-output, best-effort"):
        load_settings(env={"DEDUP_DEDUP_LATE_POLICY": "drop"})
    with pytest.raises(ConfigError, match=r"flink\.execution_mode"):
        Settings().with_overrides(flink={"execution_mode": "threads"})


def test_optional_setting_cleared_by_an_empty_variable(tmp_path: Path) -> None:
    path = write(tmp_path, '[kafka]\nsasl_mechanism = "PLAIN"\nssl_ca_location = "/ca.pem"\n')
    cfg = load_settings(path, env={"DEDUP_KAFKA_SASL_MECHANISM": ""})
    assert cfg.kafka.sasl_mechanism is None
    assert cfg.kafka.ssl_ca_location == "/ca.pem"


def test_coercion_through_every_int_setting() -> None:
    sections = {"kafka": KafkaSettings, "dedup": DedupSettings, "flink": FlinkSettings}
    env = {}
    for section, cls in sections.items():
        for name, info in cls.model_fields.items():
            if info.annotation is int:
                env[f"DEDUP_{section.upper()}_{name.upper()}"] = "17"
    assert len(env) >= 15
    env["DEDUP_KAFKA_LOCAL_CONTROLLER_PORT"] = "18"  # a node cannot listen twice on one port
    cfg = load_settings(env=env)
    for key, wanted in env.items():
        section, name = key.removeprefix("DEDUP_").split("_", 1)
        value = getattr(getattr(cfg, section.lower()), name.lower())
        assert value == int(wanted) and type(value) is int, key


# -- secrets --------------------------------------------------------------------------------------


def test_secret_never_shows(tmp_path: Path) -> None:
    path = write(
        tmp_path,
        f'[kafka]\nsasl_mechanism = "PLAIN"\nsasl_username = "dedup"\nsasl_password = "{PASSWORD}"\n',
    )
    for cfg in (
        load_settings(path, env={}),
        load_settings(env={"DEDUP_KAFKA_SASL_PASSWORD": PASSWORD, "DEDUP_KAFKA_SASL_MECHANISM": "PLAIN"}),
    ):
        secret = cfg.kafka.sasl_password
        assert isinstance(secret, SecretStr)
        assert secret.get_secret_value() == PASSWORD
        for shown in (
            repr(cfg),
            str(cfg),
            repr(cfg.kafka),
            str(cfg.kafka),
            repr(secret),
            str(secret),
            f"{secret}",
            "%s" % secret,  # noqa: UP031 - the ways a secret gets into logs
            "{}".format(secret),  # noqa: UP032
            f"{cfg}",
            f"{cfg.kafka!s}",
        ):
            assert PASSWORD not in shown
            assert "hunter" not in shown
        assert "******" in repr(cfg)
        # only the client configurations, which must carry it, reveal it
        assert cfg.kafka.client_config()["sasl.password"] == PASSWORD
        assert type(cfg.kafka.client_config()["sasl.password"]) is str
        assert f'password="{PASSWORD}"' in cfg.kafka.java_properties()["sasl.jaas.config"]


def test_secret_survives_copies(tmp_path: Path) -> None:
    cfg = load_settings(env={"DEDUP_KAFKA_SASL_PASSWORD": PASSWORD})
    copied = cfg.with_overrides(kafka={"partitions": 4})
    assert isinstance(copied.kafka.sasl_password, SecretStr)
    assert copied.kafka.sasl_password.get_secret_value() == PASSWORD
    assert PASSWORD not in repr(copied)
    assert PASSWORD not in repr(copied.model_dump())


def _json_or_refused(value: object, **kwargs: typing.Any) -> str:
    """json.dumps of ``value``; a TypeError (a type json cannot write) shows nothing either."""
    try:
        return json.dumps(value, **kwargs)
    except TypeError:
        return ""


def test_secret_never_serializes_to_its_value(caplog: pytest.LogCaptureFixture) -> None:
    """Dumps of the settings (for a status page, a debug log, a support bundle) never carry a
    secret; a str subclass would, since json writes any str as its characters."""
    cfg = load_settings(env={
        "DEDUP_KAFKA_SASL_PASSWORD": PASSWORD,
        "DEDUP_SENDERS_HTTP_TOKEN": PASSWORD,
        "DEDUP_SENDERS_SMTP_PASSWORD": PASSWORD,
        "DEDUP_SENDERS_STATUS_STORE_PASSWORD": PASSWORD,
    })
    secret = cfg.kafka.sasl_password
    dumps = [
        _json_or_refused(secret),
        _json_or_refused({"password": secret}),
        _json_or_refused([secret], default=str),
        json.dumps(cfg.model_dump(mode="json")),
        json.dumps(cfg.model_dump(), default=str),
        cfg.model_dump_json(),
        cfg.kafka.model_dump_json(),
        cfg.senders.model_dump_json(),
        _json_or_refused(cfg.senders.model_dump()),
    ]
    for shown in dumps:
        assert PASSWORD not in shown and "hunter" not in shown
    assert json.loads(cfg.model_dump_json())["kafka"]["sasl_password"] == "**********"
    with caplog.at_level(logging.INFO):
        logging.getLogger("test").info("settings %s %r %s", cfg, cfg.senders, secret)
    assert caplog.text and PASSWORD not in caplog.text
    # the dump of a setting that is not a secret is its value
    assert json.loads(cfg.model_dump_json())["kafka"]["bootstrap_servers"] == "127.0.0.1:9092"


# -- derived configurations -----------------------------------------------------------------------


@settings(max_examples=200, deadline=None)
@given(st.integers(1, 90 * 86_400), st.integers(1, 10**9), st.integers(1, 4_096))
def test_eviction_grain_and_bloom_sizing(default_window_sec: int, keys: int, shards: int) -> None:
    dedup = DedupSettings(default_window_sec=default_window_sec, bloom_expected_keys=keys, shards=shards)
    grain = dedup.eviction_grain_ms()
    assert grain % 1_000 == 0 and 1_000 <= grain <= 3_600_000
    bloom = dedup.bloom_config()
    assert bloom.initial_keys == max(64, keys // shards)
    assert bloom.capacity_for(10_000) == max(bloom.initial_keys, 12_000)


def test_bloom_config_defaults() -> None:
    dedup = DedupSettings()
    bloom = dedup.bloom_config()
    assert dedup.eviction_grain_ms() == 604_800 // 256 * 1000  # 39 min 22 s: 1/256 of 7 days
    assert bloom.initial_keys == 131_072 // 128
    assert bloom.fp_rate == 0.01
    assert bloom.growth == 1.2


def test_checkpoint_paths(tmp_path: Path) -> None:
    local = FlinkSettings(checkpoint_dir=str(tmp_path / "cp"))
    assert local.checkpoint_uri() == (tmp_path / "cp").resolve().as_uri()
    assert local.checkpoint_path() == (tmp_path / "cp").resolve()
    with pytest.raises(ConfigError, match="not a local path"):
        FlinkSettings(checkpoint_dir="s3://bucket/cp").checkpoint_path()


# -- every section, including ones added later ------------------------------------------------------


def _fields_of_type(*kinds: object) -> list[tuple[str, str]]:
    """(section, field) of every setting whose type is one of ``kinds`` (optional or not); a
    table's setting is ``table.field`` (``("senders", "fcm.service_account_json")``)."""
    found = []

    def scan(section: str, cls: type, prefix: str) -> None:
        for name, info in cls.model_fields.items():
            hint = info.annotation
            if isinstance(hint, type) and hasattr(hint, "model_fields"):
                scan(section, hint, f"{prefix}{name}.")
                continue
            args = set(typing.get_args(hint)) - {type(None)} or {hint}
            if args & set(kinds):
                found.append((section, prefix + name))

    for section in Settings.model_fields:
        cls = type(getattr(Settings(), section))
        if hasattr(cls, "model_fields"):  # not data_dir; topics (names, none of them secret)
            scan(section, cls, "")
    return found


def _variable(section: str, name: str) -> str:
    return f"DEDUP_{section.upper()}_{name.replace('.', '_').upper()}"


def _value_of(cfg: Settings, section: str, name: str) -> object:
    value: object = getattr(cfg, section)
    for part in name.split("."):
        value = getattr(value, part)
    return value


def test_every_secret_setting_is_hidden() -> None:
    secrets = _fields_of_type(SecretStr)
    assert ("kafka", "sasl_password") in secrets
    assert ("senders", "fcm.service_account_json") in secrets and ("senders", "apns.key") in secrets
    env = {_variable(s, f): f"{PASSWORD}-{s}-{f}" for s, f in secrets}
    cfg = load_settings(env=env)
    for section, name in secrets:
        value = _value_of(cfg, section, name)
        assert isinstance(value, SecretStr), (section, name)
        assert value.get_secret_value() == f"{PASSWORD}-{section}-{name}"
    for shown in (repr(cfg), str(cfg), f"{cfg}", cfg.model_dump_json(), json.dumps(cfg.model_dump(mode="json"))):
        assert PASSWORD not in shown


def test_every_bool_setting_is_coerced_from_the_environment() -> None:
    flags = _fields_of_type(bool)
    if not flags:
        pytest.skip("no bool setting")
    for text, expected in (("yes", True), ("off", False), ("1", True), ("false", False)):
        cfg = load_settings(env={_variable(s, f): text for s, f in flags})
        for section, name in flags:
            assert _value_of(cfg, section, name) is expected, (section, name, text)


# -- the sections as callers see them -------------------------------------------------------------


def test_topics_by_role_from_file_and_environment(tmp_path: Path) -> None:
    path = write(tmp_path, '[topics]\npush = "push.v2"\nlate = "late.v2"\n')
    cfg = load_settings(path, env={"DEDUP_TOPICS_PUSH": "push.v3", "DEDUP_TOPICS_SMS": "sms.v3"})
    assert isinstance(cfg.topics, Topics)
    assert (cfg.topics.push, cfg.topics.sms, cfg.topics.late) == ("push.v3", "sms.v3", "late.v2")
    assert cfg.topics.by_role() == {**Topics().by_role(), "push": "push.v3", "sms": "sms.v3", "late": "late.v2"}
    assert cfg.topics.channel_topic("push", "normal") == "push.v3"
    # the copy keeps the other names
    moved = cfg.with_overrides(topics={"requests": "in.v2"})
    assert (moved.topics.requests, moved.topics.push) == ("in.v2", "push.v3")
    assert json.loads(moved.model_dump_json())["topics"]["requests"] == "in.v2"


def test_a_topic_role_outside_the_contract_or_an_empty_name_is_a_config_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"unknown setting\(s\) in \[topics\]: pussh"):
        load_settings(write(tmp_path, '[topics]\npussh = "x"\n'), env={})
    with pytest.raises(ConfigError, match=r"unknown setting\(s\) in \[topics\]: pussh"):
        Settings().with_overrides(topics={"pussh": "x"})
    with pytest.raises(ConfigError, match=r"topics: push must be a non-empty topic name"):
        load_settings(env={"DEDUP_TOPICS_PUSH": ""})
    assert load_settings(env={"DEDUP_TOPICS_PUSHY": "x", "DEDUP_TOPICS": "y"}).topics == Topics()


def test_sections_built_in_code_are_validated_too() -> None:
    with pytest.raises(ConfigError, match=r"kafka\.partitions: "):
        Settings(kafka={"partitions": "many"})
    with pytest.raises(ConfigError, match=r"unknown setting\(s\) in \[flink\]: paralelism"):
        Settings(flink={"paralelism": 2})
    with pytest.raises(ConfigError, match=r"unknown section\(s\) in the settings: kafak"):
        Settings(kafak={})


def test_settings_are_frozen_and_copies_are_validated() -> None:
    cfg = Settings()
    for assign in (lambda: setattr(cfg, "data_dir", "x"), lambda: setattr(cfg.kafka, "partitions", 9)):
        with pytest.raises(ValueError, match="frozen"):
            assign()
    copied = cfg.with_overrides(kafka={"partitions": "9"}, flink={})
    assert copied.kafka.partitions == 9 and cfg.kafka.partitions == 3
    assert copied.flink == cfg.flink and copied != cfg
    assert cfg.with_overrides() == cfg
    with pytest.raises(ConfigError, match=r"unknown section\(s\) in the overrides: kafak"):
        cfg.with_overrides(kafak={"partitions": 1})


def test_settings_alone_are_the_defaults_whatever_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DEDUP_KAFKA_PARTITIONS", "11")
    monkeypatch.setenv("DEDUP_DATA_DIR", "/elsewhere")
    assert Settings().kafka.partitions == 3 and Settings().data_dir == ".data"
    assert Settings(kafka=KafkaSettings(partitions=5)).kafka.partitions == 5
    assert load_settings().data_dir == "/elsewhere"


def test_senders_section_from_the_environment_keeps_its_types() -> None:
    cfg = load_settings(env={"DEDUP_SENDERS_SMTP_PORT": "2525", "DEDUP_SENDERS_JITTER_RATIO": "0",
                             "DEDUP_SENDERS_SMTP_USERNAME": ""})
    assert cfg.senders.smtp_port == 2525 and cfg.senders.jitter_ratio == 0.0
    assert cfg.senders.smtp_username is None
    assert cfg.senders == SendersSettings(smtp_port=2525, jitter_ratio=0.0)


def test_savepoint_dir_defaults_to_the_checkpoint_dir(tmp_path: Path) -> None:
    f = FlinkSettings(checkpoint_dir=str(tmp_path / "cp"))
    assert f.savepoint_uri() == f.checkpoint_uri()
    assert FlinkSettings(savepoint_dir="file:///data/savepoints").savepoint_uri() == "file:///data/savepoints"


@pytest.mark.parametrize("section", ["api", "senders"])
def test_the_switch_interval_is_positive_and_bounded(section: str) -> None:
    def interval(value: object) -> float:
        return float(getattr(Settings().with_overrides(**{section: {"switch_interval_ms": value}}),
                             section).switch_interval_ms)

    assert getattr(Settings(), section).switch_interval_ms == {"api": 1.0, "senders": 5.0}[section]
    assert interval("0.5") == 0.5 and interval(100) == 100.0
    for bad in (0, -1, "fast", 100.5, 1e12):
        with pytest.raises(ConfigError, match=rf"^{section}\.switch_interval_ms: "):
            interval(bad)
