"""The operations view of the real job: its metrics after a known scenario, ``dedupctl status``
and ``dedupctl trace`` on it, and the metric names the dashboard and the alert rules use.

One job for the whole module (a job start costs 10-15 s): parallelism 1, the requests topic with
two partitions, Flink's Prometheus reporter switched on as on the cluster. The scenario:

* 100 requests with 20 duplicates: 78 new ones 100 ms apart in event time, each of the first 20
  followed by a repeat, then two requests ten minutes later (one per partition), which move the
  watermark: accepted 80, duplicates 20;
* then 2 requests from before the watermark (late) and 3 records that cannot be used (invalid).
"""

from __future__ import annotations

import dataclasses
import glob
import json
import os
import re
import threading
import time
import urllib.request
import uuid
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml

from dedupctl import cli
from harness.ports import free_port
from operators import codec, metric_names
from operators.contract import Topics
from operators.records import Channel, NotificationRequest, Priority
from ops import kafka_io
from ops.flink_rest import RestClient
from ops.status import collect
from ops.status_probe import Probe, rest_name
from ops.status_view import fmt_time
from settings import Settings, flink_conf
from tests.jobs.helpers import produce, wait_for_total
from tests.ops import prometheus_names as prom
from tests.ops.helpers import prefixed_topics, write_config
from tests.ops.trace_story import invalid_bytes

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[2]
BASE = 1_796_115_600_000  # 2026-12-01T09:00:00Z
LATER = BASE + 10 * 60_000
WATERMARK = LATER - 60_000 - 1  # bounded out-of-orderness (60 s) after the two later requests
CHANNELS = (Channel.PUSH, Channel.SMS, Channel.EMAIL)


def new(i: int) -> NotificationRequest:
    return NotificationRequest(
        notification_id=f"n-{i:03d}", user_id=f"u-{i}", template_id="order_shipped",
        params={"order": str(1000 + i)}, channels=(CHANNELS[i % 3],), event_time=BASE + i * 100,
        priority=Priority.HIGH if i % 10 == 0 else Priority.NORMAL,
        dedup_key=f"order-{i}" if i < 5 else None,
    )


def repeat(i: int) -> NotificationRequest:
    original = new(i)
    return dataclasses.replace(original, notification_id=f"d-{i:03d}", event_time=original.event_time + 50)


def later(p: int) -> NotificationRequest:
    return NotificationRequest(
        notification_id=f"m-{p}", user_id=f"u-m{p}", template_id="weekly_digest", params={"week": "48"},
        channels=(Channel.PUSH,), event_time=LATER,
    )


def late(p: int) -> NotificationRequest:
    return NotificationRequest(
        notification_id=f"l-{p}", user_id=f"u-l{p}", template_id="reminder", params={},
        channels=(Channel.EMAIL,), event_time=BASE + 200_000,
    )


def _records(reqs: list[tuple[NotificationRequest, int]]) -> list[tuple[bytes | None, bytes, int | None]]:
    return [(r.user_id.encode(), codec.encode_request(r), p) for r, p in reqs]


def accepted_requests() -> list[NotificationRequest]:
    return [new(i) for i in range(78)] + [later(0), later(1)]


@dataclass(frozen=True)
class OpsRun:
    cfg: Settings
    topics: Topics
    job_id: str
    rest_url: str
    config_file: Path
    prometheus_url: str | None


def prometheus_reporter_jar() -> str | None:
    """The reporter shipped in the PyFlink wheel (plugins/metrics-prometheus)."""
    import pyflink

    plugin = os.path.join(os.path.dirname(pyflink.__file__), "plugins", "metrics-prometheus")
    found = glob.glob(os.path.join(plugin, "*.jar"))
    return found[0] if found else None


def with_prometheus(flink_configuration, port: int, jar: str):  # type: ignore[no-untyped-def]
    """The mini-cluster's configuration plus the reporter of flink-conf/config.yaml
    (settings/flink_conf.py), on another port.

    The mini-cluster loads reporters from its classpath, not from plugins/: the jar goes into
    pipeline.jars, which PyFlink puts on the class loader the cluster starts with.
    """

    def configure(cfg, resume_from=None):  # type: ignore[no-untyped-def]
        conf = flink_configuration(cfg, resume_from)
        for key, value in flink_conf.as_strings(flink_conf.prometheus_reporter(port)).items():
            conf.set_string(key, value)
        jars = [j for j in conf.get_string("pipeline.jars", "").split(";") if j]
        conf.set_string("pipeline.jars", ";".join([*jars, Path(jar).as_uri()]))
        return conf

    return configure


def drive_scenario(bootstrap: str, topics: Topics) -> None:
    # a repeat right after its original, in its partition: always read after it, never late
    first = [(r, i % 2) for i in range(78) for r in ([new(i), repeat(i)] if i < 20 else [new(i)])]
    produce(bootstrap, topics.requests, _records(first))
    wait_for_total(bootstrap, topics, 98)
    time.sleep(1.5)
    produce(bootstrap, topics.requests, _records([(later(0), 0), (later(1), 1)]))
    wait_for_total(bootstrap, topics, 100)
    time.sleep(1.5)  # the new watermark reaches the dedup operator
    produce(bootstrap, topics.requests, _records([(late(0), 0), (late(1), 1)]))
    produce(bootstrap, topics.requests, [
        (None, b"\x00\x01not-avro", 1),
        (None, invalid_bytes(), 0),  # names n-4, user_id empty
        (b"u-bad", invalid_bytes("bad-1"), 1),
    ])
    wait_for_total(bootstrap, topics, 105)


def wait_for_counters(rest: RestClient, job_id: str, timeout_s: float = 90.0) -> None:
    """Until the REST metric store (refreshed every 10 s) has seen every record."""
    deadline = time.monotonic() + timeout_s
    while True:
        seen = rest.operator_metrics(job_id, "dedup", ["accepted", "duplicates", "late", "invalid"])
        if sum(seen.values()) >= 105 or time.monotonic() > deadline:
            return
        time.sleep(1)


@pytest.fixture(scope="module")
def ops_run(kafka_bootstrap: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[OpsRun]:
    import jobs.dedup_job as dedup_job
    from jobs.runner import run_job

    tmp = tmp_path_factory.mktemp("ops")
    run_id = uuid.uuid4().hex[:8]
    topics = prefixed_topics(f"t{run_id}.")
    kafka_io.create_topics({"bootstrap.servers": kafka_bootstrap}, topics.all(), 2)
    cfg = Settings(topics=topics).with_overrides(
        kafka={"bootstrap_servers": kafka_bootstrap, "group_id": f"test-{run_id}"},
        flink={
            "parallelism": 1, "checkpoint_dir": str(tmp / "checkpoints"), "checkpoint_interval_ms": 1000,
            "transactional_id_prefix": f"test-{run_id}", "rest_port": free_port(),
            "restart_attempts": 3, "restart_delay_ms": 500,
        },
        dedup={"idleness_ms": 5000},
    )
    jar = prometheus_reporter_jar()
    prom_port = free_port()
    with pytest.MonkeyPatch.context() as mp:
        if jar:
            configure = with_prometheus(dedup_job.flink_configuration, prom_port, jar)
            mp.setattr(dedup_job, "flink_configuration", configure)
        client = run_job(cfg, None, detached=True)
    try:
        job_id = str(client.get_job_id())
        rest = RestClient(f"http://127.0.0.1:{cfg.flink.rest_port}")
        drive_scenario(kafka_bootstrap, topics)
        wait_for_counters(rest, job_id)
        # a status topic that does not exist: trace must do without the senders
        config = write_config(cfg, tmp / "dedup.toml", status_topic=f"{topics.requests}.no-status")
        scrape = f"http://127.0.0.1:{prom_port}/metrics" if jar else None
        yield OpsRun(cfg, topics, job_id, rest.base, config, scrape)
    finally:
        try:
            client.cancel().result()
        except Exception:  # noqa: BLE001 - already gone
            pass


# -- the metrics ------------------------------------------------------------------------------


def test_metric_values_after_the_scenario(ops_run):
    rest = RestClient(ops_run.rest_url)
    names = ["accepted", "duplicates", "late", "state_reads", "state_reads_skipped",
             "bloom_false_positives", "evicted", "keys_held", "newest_event_time", "currentInputWatermark"]
    emitted = [f"topic.{rest_name(t)}.emitted" for t in ops_run.topics.outputs()]
    m = rest.operator_metrics(ops_run.job_id, "dedup", names)
    m |= rest.operator_metrics(ops_run.job_id, "route", ["invalid", *emitted])
    assert (m["accepted"], m["duplicates"], m["late"], m["invalid"]) == (80, 20, 2, 3)
    # every on-time request looked its key up once; each repeat had to read state
    assert m["state_reads"] + m["state_reads_skipped"] == 100
    assert m["state_reads"] == 20 + m["bloom_false_positives"]
    assert (m["keys_held"], m["evicted"]) == (80, 0)
    assert m["newest_event_time"] == LATER
    assert m["currentInputWatermark"] == WATERMARK
    t = ops_run.topics
    want = Counter(t.channel_topic(r.channels[0], r.priority) for r in accepted_requests())
    want.update({t.duplicates: 20, t.late: 2, t.invalid: 3})
    assert {topic: m[f"topic.{rest_name(topic)}.emitted"] for topic in t.outputs()} == {
        topic: want.get(topic, 0) for topic in t.outputs()
    }


# -- dedupctl status -------------------------------------------------------------------------


def test_status_json(ops_run, capsys):
    assert cli.main(["--config", str(ops_run.config_file), "status", "--json", "--sample", "20"]) == 0
    s = json.loads(capsys.readouterr().out)
    assert (s["job_id"], s["job_name"], s["state"]) == (ops_run.job_id, "notify-dedup", "RUNNING")
    assert s["restarts"] == 0
    assert s["uptime_ms"] > 0
    ops = {o["operator"]: o for o in s["operators"]}
    assert list(ops) == [
        "Source: requests", "carry-watermark", "carry-watermark-keyed", "batch", "dedup", "route", "outputs: Writer",
        "outputs: Committer",
    ]
    assert ops["dedup"]["watermark"] == WATERMARK
    assert ops["dedup"]["lag_event_ms"] == 60_001
    assert ops["dedup"]["lag_wall_ms"] == s["now"] - WATERMARK
    assert ops["carry-watermark"]["watermark"] == ops["route"]["watermark"] == ops["outputs: Writer"]["watermark"] == WATERMARK
    assert s["totals"] == {
        "accepted": 80, "duplicates": 20, "late": 2, "invalid": 3, "evicted": 0,
        "state_reads": s["totals"]["state_reads"], "state_reads_skipped": s["totals"]["state_reads_skipped"],
        "bloom_false_positives": s["totals"]["bloom_false_positives"],
    }
    # nothing arrives while status samples: every rate is 0, over one refresh of the store
    assert s["rates_per_s"] == {"accepted": 0.0, "duplicates": 0.0, "late": 0.0, "invalid": 0.0}
    assert s["rate_window_s"] >= 2
    c = s["checkpoint"]
    assert c["completed"] >= 1 and c["last_id"] >= c["completed"]
    assert c["size_bytes"] > 0 and c["full_size_bytes"] >= c["size_bytes"] and c["duration_ms"] >= 0
    assert 0 <= c["age_ms"] < 30_000
    st = s["state_size"]
    assert st["keys_held"] == 80
    assert st["rocksdb_estimated_keys"] > 0 and st["rocksdb_live_data_bytes"] > 0
    b, tot = s["bloom"], s["totals"]
    assert b["skip_rate"] == pytest.approx(tot["state_reads_skipped"] / 100)
    assert b["fp_rate"] == pytest.approx(tot["bloom_false_positives"] / (80 + tot["bloom_false_positives"]))
    assert b["fp_rate_configured"] == ops_run.cfg.dedup.bloom_fp_rate
    assert s["emitted"][ops_run.topics.duplicates] == 20 and s["emitted"][ops_run.topics.invalid] == 3


def test_status_screen(ops_run, capsys):
    assert cli.main(["--config", str(ops_run.config_file), "status", "--sample", "0"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].startswith("notify-dedup  RUNNING  up ") and ops_run.job_id in lines[0]
    dedup = next(line.split() for line in lines if line.startswith("dedup "))
    assert dedup[:3] == ["dedup", fmt_time(WATERMARK), "1m00s"]
    checkpoint = r"checkpoint  #\d+ .* ago, .* written \(full .*\), took .*; [\d,]+ completed, [\d,]+ failed"
    assert any(re.match(checkpoint, line) for line in lines)
    assert any(line.startswith("state       80 keys held (RocksDB estimate ") for line in lines)
    assert "totals      accepted 80  duplicates 20  late 2  invalid 3  evicted 0" in lines
    assert "rates       - (no second reading of the counters yet)" in lines
    bloom = r"bloom       skip rate \d+\.\d%, false positives \d+\.\d\d% \(configured 1\.00%\)"
    assert any(re.match(bloom, line) for line in lines)

    assert cli.main(["--config", str(ops_run.config_file), "status", "--watch", "0.5", "--count", "2"]) == 0
    assert capsys.readouterr().out.count("totals      accepted 80") == 2


# -- dedupctl trace --------------------------------------------------------------------------


def trace(ops_run: OpsRun, capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str]:
    code = cli.main(["--config", str(ops_run.config_file), "trace", *args])
    return code, capsys.readouterr().out


def test_trace_on_the_finished_scenario(ops_run, capsys):
    t = ops_run.topics
    code, out = trace(ops_run, capsys, "d-007")
    assert code == 0
    assert "d-007  DUPLICATE of n-007 (occurrence 2, original event time 2026-12-01T09:00:00.700Z)" in out
    assert "n-007  ACCEPTED  (same dedup key)" in out
    sms = rf"    sms       {re.escape(t.sms)}\[\d\]@\d+  message key [0-9a-f]{{32}}:sms:\d+  Kafka key u-7"
    assert re.search(sms, out)

    code, out = trace(ops_run, capsys, "--json", "n-010")
    n10 = json.loads(out)["notifications"]["n-010"]
    assert n10["verdict"] == "accepted"
    got = [(m["kafka"]["topic"], m["message_key"]) for m in n10["accepted"]]
    assert got == [(t.sms_priority, f"{n10['dedup_key']}:sms:{n10['request']['event_time']}")]

    code, out = trace(ops_run, capsys, "l-1")
    assert f"l-1  LATE: event time behind the watermark {fmt_time(WATERMARK)} by 5m39s" in out

    code, out = trace(ops_run, capsys, "bad-1")
    assert code == 0
    assert re.search(rf"INVALID  {re.escape(t.invalid)}\[\d\]@\d+: user_id is missing or empty", out)

    code, out = trace(ops_run, capsys, "order-2")  # an explicit dedup key
    assert "n-002  ACCEPTED" in out and "d-002  DUPLICATE of n-002" in out
    assert "no senders' status topic" in out

    code, out = trace(ops_run, capsys, "n-999")
    assert code == 1 and "no record in" in out


# -- the dashboard and the alerts use metrics the job exports --------------------------------


def monitoring_expressions() -> list[tuple[str, str]]:
    """(where, PromQL) of every Grafana panel target and every alert rule on the job (the
    senders' group, ``notify-senders``, names the senders' metrics, and the promise row shows the
    SLOs' recording rules of the API's and the senders' metrics: tests/deploy checks those)."""
    dashboard = json.loads((REPO / "deploy/grafana/dashboards/notify-dedup.json").read_text(encoding="utf-8"))
    exprs = [(f"panel {p['title']!r}", t["expr"]) for p in dashboard["panels"] for t in p.get("targets", [])
             if "slo:" not in t["expr"]]
    exprs += [(f"variable {v['name']}", v["definition"]) for v in dashboard["templating"]["list"]]
    rules = yaml.safe_load((REPO / "deploy/prometheus/alerts.yml").read_text(encoding="utf-8"))
    exprs += [(f"alert {r['alert']}", r["expr"]) for g in rules["groups"] if g["name"] != "notify-senders"
              for r in g["rules"]]
    return exprs


def test_dashboard_and_alert_metrics_are_exported_by_the_job(ops_run):
    names, operators = prom.exported_names(RestClient(ops_run.rest_url), ops_run.job_id)
    assert "flink_taskmanager_job_task_operator_accepted" in names  # the mapping finds ours at all
    missing = []
    for where, expr in monitoring_expressions():
        used = prom.promql_metric_names(expr)
        assert used, f"{where}: names no flink_ metric: {expr}"
        missing += [f"{where}: {n}" for n in sorted(used - names)]
        unknown = prom.promql_label_values(expr, "operator_name") - operators
        missing += [f"{where}: operator_name={v!r}" for v in sorted(unknown)]
    assert not missing, "not exported by the job:\n" + "\n".join(missing)


def test_every_metric_of_the_module_is_exported_by_its_operator(ops_run):
    """operators/metric_names.py, which the dashboard and alert checks of tests/deploy trust,
    against the running job: every name it lists is exported, by the operators it says."""
    rest = RestClient(ops_run.rest_url)
    names, _ = prom.exported_names(rest, ops_run.job_id)
    by_operator = prom.operator_metric_names(rest, ops_run.job_id)
    wrong = []
    for name, operators in metric_names.prometheus_names().items():
        if name not in names:
            wrong.append(f"{name}: not exported")
        elif operators and not operators <= by_operator.get(name, set()):
            wrong.append(f"{name}: exported by {sorted(by_operator.get(name, ()))}, not {sorted(operators)}")
    assert not wrong, "\n".join(wrong)
    assert by_operator["flink_taskmanager_job_task_operator_invalid"] == {metric_names.ROUTE_OPERATOR}


def test_rest_names_map_to_what_the_prometheus_reporter_exports(ops_run):
    """The REST-to-Prometheus mapping above, against the reporter of the running job itself."""
    if ops_run.prometheus_url is None:
        pytest.skip("no Prometheus reporter jar in this PyFlink")
    names, _ = prom.exported_names(RestClient(ops_run.rest_url), ops_run.job_id)
    text = urllib.request.urlopen(ops_run.prometheus_url, timeout=10).read().decode()
    samples = [line for line in text.splitlines() if line and not line.startswith("#")]
    scraped = {line.split("{")[0].split(" ")[0] for line in samples}
    assert names - scraped == set()
    ours = {"accepted", "duplicates", "late", "invalid", "topic_emitted", "keys_held", "bloom_fill_ratio_pct"}
    assert {f"flink_taskmanager_job_task_operator_{n}" for n in ours} <= scraped
    for _where, expr in monitoring_expressions():
        assert prom.promql_metric_names(expr) <= scraped
    assert 'topic="' + prom.prometheus_filter(ops_run.topics.sms_priority) + '"' in text


# -- rates, last: it sends more requests ----------------------------------------------------


def test_status_rates_while_requests_flow(ops_run, kafka_bootstrap):
    def send() -> None:
        prod = kafka_io.producer({"bootstrap.servers": kafka_bootstrap})
        for k in range(60):
            r = dataclasses.replace(new(200 + k), event_time=LATER + k * 1000)
            record = (r.user_id.encode(), codec.encode_request(r))
            kafka_io.produce_all(prod, ops_run.topics.requests, [record], k % 2)
            time.sleep(0.2)

    sender = threading.Thread(target=send)
    sender.start()
    try:
        time.sleep(1)
        report = collect(Probe(RestClient(ops_run.rest_url), ops_run.job_id), ops_run.cfg, sample_s=25)
    finally:
        sender.join()
    assert report.rates_per_s is not None
    assert 0 < report.rates_per_s["accepted"] <= 10  # about 5 a second were sent
    assert report.rates_per_s["duplicates"] == 0 and report.rates_per_s["invalid"] == 0
