"""What the job hands Flink (jobs/dedup_job.flink_settings): the mini-cluster's settings when it
starts one itself, the job's own only when the flink CLI submits it to a cluster."""

from __future__ import annotations

import sys

import pytest

from jobs import dedup_job
from operators.metric_names import JOB_NAME
from settings import Settings, flink_conf


def test_on_the_mini_cluster_everything_it_needs() -> None:
    cfg = Settings().with_overrides(flink={"parallelism": 2, "rest_port": 18099})
    conf = dedup_job.flink_settings(cfg, "/ck/chk-7", on_cluster=False)
    assert conf["pipeline.name"] == JOB_NAME
    assert conf["execution.state-recovery.path"] == "/ck/chk-7"
    assert (conf["rest.port"], conf["rest.address"], conf["taskmanager.numberOfTaskSlots"]) == ("18099", "127.0.0.1", "2")
    assert conf["python.executable"] == sys.executable and conf["python.execution-mode"] == "thread"
    assert {k: v for k, v in conf.items() if k in flink_conf.mini_cluster(cfg)} == flink_conf.as_strings(
        flink_conf.mini_cluster(cfg))


def test_submitted_to_a_cluster_only_the_jobs_own(monkeypatch: pytest.MonkeyPatch) -> None:
    """``flink run -m jobmanager:8081 -pyexec ...``: a rest.address of 127.0.0.1 would send the
    submission nowhere, and the cluster's interpreter and slots are the cluster's."""
    cfg = Settings().with_overrides(flink={"parallelism": 2, "restart_attempts": 30})
    monkeypatch.setenv("PYFLINK_GATEWAY_PORT", "25333")
    assert dedup_job.submitted_by_cli()
    conf = dedup_job.flink_settings(cfg)
    assert not [k for k in conf if k.startswith(("rest.", "taskmanager.", "python.executable", "python.client"))]
    assert conf["restart-strategy.fixed-delay.attempts"] == "30" and conf["parallelism.default"] == "2"
    assert {k: conf[k] for k in flink_conf.job(cfg)} == flink_conf.as_strings(flink_conf.job(cfg))
    monkeypatch.delenv("PYFLINK_GATEWAY_PORT")
    assert not dedup_job.submitted_by_cli() and "rest.port" in dedup_job.flink_settings(cfg)
