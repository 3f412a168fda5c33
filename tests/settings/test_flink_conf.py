"""settings/flink_conf.py: one source for what Flink is told, in every environment the job runs in."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import yaml

from settings import REPO_ROOT, Settings, flink_conf, load_settings

CLUSTER_TOML = REPO_ROOT / "deploy" / "cluster.toml"
COMPOSE_CONFIG = REPO_ROOT / "flink-conf" / "config.yaml"


def custom() -> Settings:
    return Settings().with_overrides(flink={
        "parallelism": 3, "max_parallelism": 64, "checkpoint_dir": "/ck", "checkpoint_interval_ms": 1500,
        "checkpoint_timeout_ms": 90_000, "restart_attempts": 4, "restart_delay_ms": 500,
        "execution_mode": "process", "rest_port": 18081, "bundle_size": 10, "bundle_time_ms": 5,
    })


def environments(cfg: Settings) -> dict[str, flink_conf.Conf]:
    return {
        "mini-cluster": flink_conf.mini_cluster(cfg),
        "standalone": flink_conf.standalone(cfg, rest_port=1, rpc_port=2, slots=2, java_opts="-X"),
        "compose": flink_conf.flatten(flink_conf.compose(cfg, java_opts="-X")),
    }


def test_committed_compose_config_is_the_generated_one() -> None:
    assert COMPOSE_CONFIG.read_text(encoding="utf-8") == flink_conf.compose_yaml(CLUSTER_TOML), (
        "flink-conf/config.yaml is not what settings/flink_conf.py generates: run\n"
        "  python -m settings.flink_conf --write flink-conf/config.yaml"
    )


def test_check_command_fails_on_a_hand_edited_file(tmp_path: Path) -> None:
    target = tmp_path / "config.yaml"
    assert flink_conf.main(["--write", str(target)]) == 0
    assert flink_conf.main(["--check", str(target)]) == 0
    target.write_text(target.read_text().replace("num-retained: 3", "num-retained: 5"))
    assert flink_conf.main(["--check", str(target)]) == 1


def test_the_yaml_reads_back_as_the_values() -> None:
    cfg = load_settings(CLUSTER_TOML, env={})
    groups = flink_conf.compose(cfg)
    assert yaml.safe_load(flink_conf.render_yaml(groups)) == flink_conf.flatten(groups)
    for value in ("5s", "true", "3", "1.5", "a: b", "x #y", "", "file:///data", "-X", "null", " lead"):
        assert yaml.safe_load(f"k: {flink_conf.yaml_scalar(value)}") == {"k": value}, value


def test_every_environment_runs_the_job_with_the_same_settings() -> None:
    cfg = custom()
    job = flink_conf.job(cfg)
    for name, conf in environments(cfg).items():
        assert {k: conf[k] for k in job} == job, name
    assert job["execution.checkpointing.interval"] == "1500ms"
    assert job["execution.checkpointing.min-pause"] == "750ms"
    assert job["execution.checkpointing.timeout"] == "90s"
    assert job["restart-strategy.type"] == "fixed-delay"
    assert (job["restart-strategy.fixed-delay.attempts"], job["restart-strategy.fixed-delay.delay"]) == (4, "500ms")
    assert job["execution.checkpointing.dir"] == job["execution.checkpointing.savepoint-dir"] == "file:///ck"
    assert job["execution.checkpointing.mode"] == "EXACTLY_ONCE"
    assert job["execution.checkpointing.externalized-checkpoint-retention"] == "RETAIN_ON_CANCELLATION"
    assert job["state.backend.type"] == "rocksdb" and job["execution.checkpointing.incremental"] is True
    assert job["python.execution-mode"] == "process"
    assert (job["parallelism.default"], job["pipeline.max-parallelism"]) == (3, 64)
    for prop in ("estimate-num-keys", "estimate-live-data-size", "total-sst-files-size"):
        assert job[f"state.backend.rocksdb.metrics.{prop}"] is True
    # the job's settings name no cluster: no address, port, slot count or interpreter
    assert not [k for k in job if k.startswith(("rest.", "jobmanager.", "taskmanager.", "python.executable"))]


def test_mini_cluster_overlay() -> None:
    conf = flink_conf.mini_cluster(custom())
    assert (conf["rest.address"], conf["rest.bind-address"], conf["rest.port"]) == ("127.0.0.1", "127.0.0.1", 18081)
    assert conf["taskmanager.numberOfTaskSlots"] == 3
    assert conf["python.executable"] == conf["python.client.executable"] == sys.executable
    assert flink_conf.mini_cluster(Settings())["python.execution-mode"] == "thread"
    assert flink_conf.mini_cluster(Settings())["taskmanager.numberOfTaskSlots"] == 1
    # `make demo` ends without "Trying to access closed classloader" (issue 24)
    assert flink_conf.mini_cluster(Settings())["classloader.check-leaked-classloader"] is False
    no_python = flink_conf.mini_cluster(custom(), python=None)
    assert not [k for k in no_python if k.startswith("python.")]
    assert no_python["restart-strategy.fixed-delay.attempts"] == 4


def test_standalone_overlay() -> None:
    conf = flink_conf.standalone(custom(), rest_port=8123, rpc_port=6200, slots=2, java_opts="--add-opens=x",
                                 python="/venv/bin/python")
    assert (conf["rest.port"], conf["jobmanager.rpc.port"], conf["taskmanager.numberOfTaskSlots"]) == (8123, 6200, 2)
    assert all(conf[k] == "127.0.0.1" for k in ("jobmanager.rpc.address", "taskmanager.host", "rest.address"))
    assert conf["python.executable"] == "/venv/bin/python" and conf["env.java.opts.all"] == "--add-opens=x"
    assert (conf["heartbeat.timeout"], conf["heartbeat.interval"]) == (10000, 2000)
    # the distribution's --add-opens, read from the installed PyFlink
    assert "--add-opens=java.base/java.lang=ALL-UNNAMED" in flink_conf.distribution_java_opts()


def test_compose_overlay_follows_the_cluster_toml() -> None:
    cfg = load_settings(CLUSTER_TOML, env={})
    conf = flink_conf.flatten(flink_conf.compose(cfg))
    assert conf["taskmanager.numberOfTaskSlots"] == conf["parallelism.default"] == cfg.flink.parallelism
    assert conf["execution.checkpointing.dir"] == cfg.flink.checkpoint_uri() == "file:///data/checkpoints"
    assert conf["execution.checkpointing.savepoint-dir"] == "file:///data/savepoints"
    assert conf["python.executable"] == "python3" and conf["python.execution-mode"] == "thread"
    assert conf["metrics.reporter.prom.port"] == flink_conf.PROMETHEUS_PORT
    assert conf["metrics.reporter.prom.factory.class"] == flink_conf.PROMETHEUS_FACTORY
    assert conf["execution.checkpointing.tolerable-failed-checkpoints"] == 3
    # a change to the job's settings reaches the cluster's file
    more = flink_conf.flatten(flink_conf.compose(cfg.with_overrides(flink={"parallelism": 4}), java_opts=""))
    assert more["taskmanager.numberOfTaskSlots"] == more["parallelism.default"] == 4


def test_a_key_set_twice_to_different_values_is_refused() -> None:
    groups = (flink_conf.Group("a", "", {"k": 1}), flink_conf.Group("b", "", {"k": 2}))
    with pytest.raises(ValueError, match="k is set twice"):
        flink_conf.flatten(groups)


def test_strings_for_a_configuration() -> None:
    assert flink_conf.as_strings({"a": True, "b": False, "c": 3, "d": "5s"}) == {
        "a": "true", "b": "false", "c": "3", "d": "5s"}
    assert [flink_conf.duration(ms) for ms in (0, 500, 1000, 2500, 60_000, 90_000, 600_000)] == [
        "0ms", "500ms", "1s", "2500ms", "1min", "90s", "10min"]


def test_kafka_source_and_sink_properties_follow_the_settings() -> None:
    cfg = Settings().with_overrides(
        flink={"transaction_timeout_ms": 123_000},
        kafka={"sink_linger_ms": 7, "sink_retry_backoff_ms": 3, "sink_compression": "lz4", "sink_max_request_bytes": 2_000_000,
               "security_protocol": "SSL", "ssl_ca_location": "/ca.pem", "source_fetch_min_bytes": 4096,
               "source_fetch_max_wait_ms": 25},
    )
    sink = flink_conf.kafka_sink(cfg)
    assert sink["transaction.timeout.ms"] == "123000" and sink["linger.ms"] == "7" and sink["retry.backoff.ms"] == "3"
    assert sink["compression.type"] == "lz4" and sink["max.request.size"] == "2000000"
    assert sink["enable.idempotence"] == "true" and sink["security.protocol"] == "SSL"
    source = flink_conf.kafka_source(cfg)
    assert source["isolation.level"] == "read_committed" and source["ssl.truststore.location"] == "/ca.pem"
    assert source["fetch.min.bytes"] == "4096" and source["fetch.max.wait.ms"] == "25"
