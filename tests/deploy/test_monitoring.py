"""Static checks of the monitoring files: deploy/prometheus (scrape config, alert rules, the SLOs'
recording rules and burn-rate alerts, and their unit tests) and deploy/grafana (datasource,
dashboard provider, dashboard).

``promtool`` (Debian's ``prometheus`` package, or a Prometheus release) checks the config, the
PromQL of every rule and dashboard query, and runs the rules' unit tests where it is installed.
Every metric named here is one operators/metric_names.py defines, reported by the operator the
query selects, and every metric it defines is shown or alerted on (or exempt, with the reason);
that the job really exports them is checked against a running job in tests/ops/test_ops_job.py.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from operators.metric_names import API_METRICS, JOB_NAME, SENDER_METRICS, prometheus_filter, prometheus_names

REPO = Path(__file__).resolve().parents[2]
PROMETHEUS = REPO / "deploy" / "prometheus"
#: the rule files and the promtool unit tests of each
RULE_FILES = {"alerts.yml": ("alerts.test.yml",), "slos.yml": ("slos.test.yml", "slos.slow.test.yml")}
#: the promise row and its stats, on top of the dashboard (grid units)
PROMISE_ROW_HEIGHT = 4
#: a histogram's series, besides its name
HISTOGRAM_SUFFIXES = ("_bucket", "_count", "_sum")
GRAFANA = REPO / "deploy" / "grafana"
DASHBOARD = GRAFANA / "dashboards" / "notify-dedup.json"
#: Grafana's own variables, as Prometheus would see them once Grafana filled them in
GRAFANA_VARIABLES = {"$__rate_interval": "1m", "$__range": "1h", "$__interval": "15s", "$job": "notify_dedup"}
#: what the issue asks the dashboard to show, each by a metric only that subject uses
DASHBOARD_SUBJECTS = {
    "watermark lag": "currentInputWatermark",
    "checkpoint size": "lastCheckpointSize",
    "checkpoint duration": "lastCheckpointDuration",
    "state size": "rocksdb_estimate_live_data_size",
    "dedup rates": "operator_accepted",
    "late rate": "operator_late",
    "invalid rate": "operator_invalid",
    "Bloom skip rate": "state_reads_skipped",
}
FLINK_NAME = re.compile(r"^flink_(jobmanager_job|taskmanager_job_task|taskmanager_job_task_operator)_\w+$")

#: a metric and its label matchers in PromQL (``name{a="b",c="d"}`` or a bare ``name``)
SELECTOR = re.compile(r"\b((?:flink|sender|provider|api)_[A-Za-z0-9_:]+|slo:[A-Za-z0-9_:]+)\s*(?:\{([^}]*)\})?")
EQUALS = re.compile(r'\b([a-zA-Z_][a-zA-Z0-9_]*)\s*=\s*"([^"]*)"')
OPERATOR = "flink_taskmanager_job_task_operator_"
#: what operators/metric_names.py names that neither the dashboard nor an alert shows, and why
NOT_MONITORED = {
    f"{OPERATOR}bloom_bits": "the filters' size; the benchmark reports it per key held (bench/systems.py), the "
    "dashboard shows the fill ratio, which is what sets the false-positive rate",
    f"{OPERATOR}currentOutputWatermark": "the sources' watermark, in dedupctl status; the dashboard and the alerts "
    "follow the dedup operator's input watermark",
    f"{OPERATOR}bloom_segments_rocksdb_estimate_num_keys": "a handful of segments per shard: no signal",
    f"{OPERATOR}bloom_segments_rocksdb_estimate_live_data_size": "the segments' SST files are shown",
}

needs_promtool = pytest.mark.skipif(shutil.which("promtool") is None, reason="promtool not installed")


def _yaml(path: Path):
    return yaml.safe_load(path.read_text(encoding="utf-8"))


def _rules(*, recorded: bool) -> list[dict]:
    """The alerts (or the recording rules) of every rule file."""
    kind = "record" if recorded else "alert"
    return [r for f in RULE_FILES for g in _yaml(PROMETHEUS / f)["groups"] for r in g["rules"] if kind in r]


def _unit_tests() -> list[dict]:
    return [group for tests in RULE_FILES.values() for f in tests for group in _yaml(PROMETHEUS / f)["tests"]]


@pytest.fixture(scope="module")
def rules() -> list[dict]:
    return _rules(recorded=False)


@pytest.fixture(scope="module")
def dashboard() -> dict:
    return json.loads(DASHBOARD.read_text(encoding="utf-8"))


def _targets(dashboard: dict) -> list[tuple[dict, dict]]:
    return [(p, t) for p in dashboard["panels"] for t in p.get("targets", [])]


def _promtool(*args: str, cwd: Path) -> None:
    proc = subprocess.run(["promtool", *args], cwd=cwd, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr


# ----------------------------------------------------------------------------- alert rules


def test_alert_rules_are_complete(rules):
    names = [r["alert"] for r in rules]
    assert len(names) == len(set(names)), names
    asked_for = {
        "DedupWatermarkStalled", "DedupCheckpointsFailing", "DedupInvalidRateRising", "DedupLateRateRising",
    }
    assert asked_for <= set(names)
    for r in rules:
        assert r["labels"]["severity"] in ("critical", "warning"), r["alert"]
        assert r["annotations"]["summary"] and r["annotations"]["description"], r["alert"]
        assert re.fullmatch(r"\d+[smh]", r.get("for", "0s")), r["alert"]


def test_every_alert_has_unit_tests_that_fire_and_stay_quiet(rules):
    cases: dict[str, set[bool]] = {}
    for group in _unit_tests():
        for case in group.get("alert_rule_test", []):
            cases.setdefault(case["alertname"], set()).add(bool(case.get("exp_alerts")))
    for r in rules:
        assert cases.get(r["alert"]) == {True, False}, f"{r['alert']}: needs a firing and a quiet case"


@needs_promtool
@pytest.mark.parametrize("rule_file", sorted(RULE_FILES))
def test_promtool_checks_the_rules_and_runs_their_unit_tests(rule_file):
    _promtool("check", "rules", rule_file, cwd=PROMETHEUS)
    _promtool("test", "rules", *RULE_FILES[rule_file], cwd=PROMETHEUS)


@needs_promtool
def test_promtool_checks_the_scrape_config(tmp_path):
    config = _yaml(PROMETHEUS / "prometheus.yml")
    # the rule files are mounted into the container; here they are read where they are
    config["rule_files"] = [str(PROMETHEUS / Path(f).name) for f in config["rule_files"]]
    (tmp_path / "prometheus.yml").write_text(yaml.safe_dump(config), encoding="utf-8")
    _promtool("check", "config", "prometheus.yml", cwd=tmp_path)


# ------------------------------------------------------------------------------- Grafana


def test_datasource_and_dashboard_provider():
    [source] = _yaml(GRAFANA / "provisioning" / "datasources" / "prometheus.yml")["datasources"]
    assert (source["type"], source["uid"], source["access"]) == ("prometheus", "prometheus", "proxy")
    [provider] = _yaml(GRAFANA / "provisioning" / "dashboards" / "notify-dedup.yml")["providers"]
    assert provider["type"] == "file" and provider["options"]["path"]


def test_dashboard_structure(dashboard):
    [source] = _yaml(GRAFANA / "provisioning" / "datasources" / "prometheus.yml")["datasources"]
    assert dashboard["uid"] == "notify-dedup" and dashboard["title"]
    ids = [p["id"] for p in dashboard["panels"]]
    assert len(ids) == len(set(ids))
    cells: set[tuple[int, int]] = set()
    for p in dashboard["panels"]:
        g = p["gridPos"]
        assert 0 <= g["x"] and g["x"] + g["w"] <= 24, p["title"]
        area = {(x, y) for x in range(g["x"], g["x"] + g["w"]) for y in range(g["y"], g["y"] + g["h"])}
        assert not area & cells, f"panel {p['title']!r} overlaps another"
        cells |= area
        if p["type"] == "row":
            continue
        assert p["datasource"]["uid"] == source["uid"], p["title"]
        refs = [t["refId"] for t in p["targets"]]
        assert refs and len(refs) == len(set(refs)), p["title"]
        for t in p["targets"]:
            assert t["datasource"]["uid"] == source["uid"] and t["expr"].strip(), p["title"]


def test_dashboard_shows_what_operators_watch(dashboard):
    exprs = " ".join(t["expr"] for _, t in _targets(dashboard))
    missing = [subject for subject, metric in DASHBOARD_SUBJECTS.items() if metric not in exprs]
    assert not missing, missing


def _as_prometheus_sees_it(expr: str) -> str:
    for var, value in GRAFANA_VARIABLES.items():
        expr = expr.replace(var, value)
    assert "$" not in expr, f"unknown Grafana variable in {expr}"
    return expr


@needs_promtool
def test_dashboard_queries_are_valid_promql(dashboard, tmp_path):
    records = [
        {"record": f"dashboard:panel{p['id']}:{t['refId']}", "expr": _as_prometheus_sees_it(t["expr"])}
        for p, t in _targets(dashboard)
    ]
    (tmp_path / "queries.yml").write_text(
        yaml.safe_dump({"groups": [{"name": "dashboard", "rules": records}]}), encoding="utf-8"
    )
    _promtool("check", "rules", "queries.yml", cwd=tmp_path)


SENDER_NAME = re.compile(r"\bsender_[a-z_]+")


def test_sender_rules_name_metrics_the_senders_export():
    from senders.runtime import dispatch, host

    groups = {g["name"]: g["rules"] for g in _yaml(PROMETHEUS / "alerts.yml")["groups"]}
    exprs = [r["expr"] for r in groups["notify-senders"]]
    names = {n for e in exprs for n in SENDER_NAME.findall(e)}
    assert names == {"sender_provider_rejecting", "sender_cpu_idle_group_reliefs_total"}
    assert names <= set(SENDER_METRICS)
    exported = "".join(Path(m.__file__).read_text(encoding="utf-8") for m in (dispatch, host))
    assert all(f'"{n}"' in exported for n in names), names


def test_metric_names_are_flink_prometheus_names(rules, dashboard):
    flink_rules = [r for g in _yaml(PROMETHEUS / "alerts.yml")["groups"] if g["name"] != "notify-senders" for r in g["rules"]]
    # the promise row shows the SLOs (recording rules of the API's and the senders' metrics)
    panels = [t["expr"] for p, t in _targets(dashboard) if p["gridPos"]["y"] > PROMISE_ROW_HEIGHT]
    for expr in [r["expr"] for r in flink_rules] + panels:
        names = re.findall(r"\bflink_[A-Za-z0-9_:]+", expr)
        assert names, expr
        assert all(FLINK_NAME.match(n) for n in names), names


def test_the_dashboard_starts_with_the_promise(dashboard):
    """Its first row shows each SLO, by the recording rules of slos.yml."""
    row, *top = [p for p in dashboard["panels"] if p["gridPos"]["y"] <= PROMISE_ROW_HEIGHT]
    assert row["type"] == "row" and "promise" in row["title"] and row["gridPos"]["y"] == 0
    recorded = {r["record"] for r in _rules(recorded=True)}
    shown = {name for p in top for t in p["targets"] for name, _ in _selectors(t["expr"])}
    assert shown <= recorded and len(top) == 4
    slos = ("accept_errors", "one_time_code_slow", "transactional_slow", "dead_letters")
    assert all(any(f"slo:{slo}:" in name for name in shown) for slo in slos), shown


# ------------------------------------------------------------ the names, against operators/metric_names.py


def _expressions(rules: list[dict], dashboard: dict) -> list[tuple[str, str]]:
    """(where, PromQL) of every alert, panel query, dashboard variable and alert unit-test series."""
    exprs = [(f"alert {r['alert']}", r["expr"]) for r in rules]
    exprs += [(f"record {r['record']}", r["expr"]) for r in _rules(recorded=True)]
    exprs += [(f"panel {p['title']!r}", t["expr"]) for p, t in _targets(dashboard)]
    exprs += [(f"variable {v['name']}", v["definition"]) for v in dashboard["templating"]["list"]]
    for group in _unit_tests():
        exprs += [(f"unit-test series {s['series']}", s["series"]) for s in group.get("input_series", [])]
    return exprs


def _selectors(expr: str) -> list[tuple[str, dict[str, str]]]:
    return [(name, dict(EQUALS.findall(labels or ""))) for name, labels in SELECTOR.findall(expr)]


def test_every_metric_shown_or_alerted_on_is_one_the_module_names(rules, dashboard):
    """Name, operator and job as operators/metric_names.py and the Prometheus reporter say them: a
    metric of another operator (``invalid`` is the route operator's) never matches a series. The
    sender workers' metrics (SENDER_METRICS), the API's (API_METRICS) and the SLOs' recording rules
    have no operator."""
    plain = [*SENDER_METRICS, *API_METRICS, *(r["record"] for r in _rules(recorded=True))]
    plain += [name + suffix for name in [*SENDER_METRICS, *API_METRICS] for suffix in HISTOGRAM_SUFFIXES]
    known = {**prometheus_names(), **{name: frozenset() for name in plain}}
    job_label = prometheus_filter(JOB_NAME)
    problems = []
    for where, expr in _expressions(rules, dashboard):
        found = _selectors(expr)
        assert found, f"{where}: names no metric of the job or the senders: {expr}"
        for name, labels in found:
            if name not in known:
                problems.append(f"{where}: {name} is not a metric of operators/metric_names.py")
                continue
            operator = labels.get("operator_name")
            if known[name] and operator is None and not where.startswith("unit-test"):
                problems.append(f"{where}: {name} without operator_name= (it is {sorted(known[name])}'s)")
            if operator is not None and operator not in known[name]:
                reporters = sorted(known[name]) or "no operator: a job or task metric"
                problems.append(f"{where}: {name} is not reported by operator {operator!r} (by {reporters})")
            if name.startswith("flink_") and labels.get("job_name", job_label) not in (job_label, "$job"):
                problems.append(f"{where}: job_name={labels['job_name']!r}, the job reports as {job_label!r}")
    assert not problems, "\n".join(problems)


def test_every_metric_the_module_names_is_shown_or_alerted_on(rules, dashboard):
    used = {name for _, expr in _expressions(rules, dashboard) for name, _ in _selectors(expr)}
    known = prometheus_names()
    missing = sorted(n for n in known if n not in used and n not in NOT_MONITORED)
    assert not missing, "neither on the dashboard nor in an alert (show it, or exempt it with the reason):\n" + "\n".join(
        missing)
    stale = sorted(n for n in NOT_MONITORED if n in used or n not in known)
    assert not stale, f"exempt but shown, or no longer a metric: {stale}"


def test_the_selector_check_can_fail():
    """The checks above on expressions with the mistakes they are there to catch."""
    known = prometheus_names()
    assert _selectors('sum(rate(flink_taskmanager_job_task_operator_invalid{job_name="$job",operator_name="dedup"}[1m]))') == [
        ("flink_taskmanager_job_task_operator_invalid", {"job_name": "$job", "operator_name": "dedup"})]
    assert "dedup" not in known[f"{OPERATOR}invalid"] and "route" in known[f"{OPERATOR}invalid"]
    assert f"{OPERATOR}acepted" not in known
    assert known["flink_jobmanager_job_uptime"] == frozenset()
    assert f"{OPERATOR}topic_emitted" in known and f"{OPERATOR}entries_rocksdb_estimate_live_data_size" in known
    assert _selectors("max by (channel, provider) (sender_circuit_state) == 2") == [("sender_circuit_state", {})]
