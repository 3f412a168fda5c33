"""``dedupctl slo`` (ops/slo.py): each SLO's value and error budget left, computed from the
services' metrics; on fixed exposition text, and against a real senders metrics endpoint."""

from __future__ import annotations

import argparse
import http.server
import threading

import pytest

from dedupctl.slo_cmd import cmd_slo
from ops.slo import (
    ACCEPTS,
    API,
    DEAD_LETTERS,
    ONE_TIME_CODES,
    SENDERS,
    TRANSACTIONAL,
    Sample,
    costs,
    deltas,
    evaluate,
    parse_samples,
    render,
)
from senders.runtime.metrics import Metrics, serve_metrics
from senders.runtime.slis import ACCEPT_TO_PROVIDER_BUCKETS
from settings import Settings

#: as prometheus_client writes the API's (issue 22's api/metrics.py): HELP, TYPE, float bounds
API_TEXT = """# HELP api_accept_seconds POST /v1/notifications: from the request's arrival to its answer, by status
# TYPE api_accept_seconds histogram
api_accept_seconds_bucket{le="0.05",status="202"} 19990.0
api_accept_seconds_bucket{le="+Inf",status="202"} 19997.0
api_accept_seconds_count{status="202"} 19997.0
api_accept_seconds_sum{status="202"} 120.5
api_accept_seconds_count{status="400"} 1.0
api_accept_seconds_count{status="503"} 2.0
api_requests_total{method="POST",route="/v1/notifications",status="503"} 2.0
"""


def _senders() -> Metrics:
    m = Metrics()
    lanes = {"priority": [1.0] * 990 + [7.0] * 10, "normal": [30.0] * 95 + [90.0] * 5}  # 1% and 5% slow
    for lane, times in lanes.items():
        for t in times:
            m.observe("sender_accept_to_provider_seconds", t, ACCEPT_TO_PROVIDER_BUCKETS, channel="sms", lane=lane,
                      category="transactional")
    for _ in range(50):  # a campaign's, slow: not transactional
        m.observe("sender_accept_to_provider_seconds", 3600.0, ACCEPT_TO_PROVIDER_BUCKETS, channel="email",
                  lane="normal", category="marketing")
    m.inc("sender_deliveries_total", 1998, channel="sms", lane="normal", outcome="sent", provider="sms-a")
    m.inc("sender_deliveries_total", 7, channel="sms", lane="normal", outcome="retried", provider="sms-a")
    m.inc("sender_dead_letters_total", 2, channel="sms", lane="normal", reason="max_attempts")
    m.inc("sender_cost_units_total", 9.99, channel="sms", provider="sms-a")
    return m


def test_the_exposition_is_parsed_with_its_labels() -> None:
    samples = parse_samples(API_TEXT + 'odd{a="x\\"y",b="1"} 3 1700000000\n')
    assert samples[0] == Sample("api_accept_seconds_bucket", (("le", "0.05"), ("status", "202")), 19990.0)
    assert samples[-1] == Sample("odd", (("a", 'x"y'), ("b", "1")), 3.0)
    assert len(samples) == 8
    with pytest.raises(ValueError):
        parse_samples(API_TEXT + "not a sample\n")


def test_each_slo_from_the_services_metrics() -> None:
    results = {r.slo: r for r in evaluate({API: parse_samples(API_TEXT),
                                           SENDERS: parse_samples(_senders().render_prometheus())})}
    accepts = results[ACCEPTS]  # 2 of 20000 answers a 5xx (a 400 is the caller's)
    assert (accepts.bad, accepts.total) == (2, 20000)
    assert accepts.value == pytest.approx(0.9999) and accepts.budget_left == pytest.approx(0.0)
    assert accepts.met
    otp = results[ONE_TIME_CODES]  # 10 of 1000 over 5 s: the budget spent exactly
    assert (otp.bad, otp.total, otp.met) == (10, 1000, True) and otp.budget_left == pytest.approx(0.0)
    tx = results[TRANSACTIONAL]  # 5 of 100 over a minute: five budgets spent; marketing not counted
    assert (tx.bad, tx.total, tx.met) == (5, 100, False) and tx.budget_left == pytest.approx(-4.0)
    dlq = results[DEAD_LETTERS]  # 2 of 2000 ended in the DLQ: 0.1% allowed
    assert (dlq.bad, dlq.total) == (2, 2000) and dlq.value == pytest.approx(0.001) and dlq.met
    assert costs(parse_samples(_senders().render_prometheus())) == {("sms", "sms-a"): 9.99}


def test_over_an_interval_the_counters_differences_count() -> None:
    before = parse_samples('api_accept_seconds_count{status="202"} 100\napi_accept_seconds_count{status="503"} 5\n')
    after = parse_samples('api_accept_seconds_count{status="202"} 1100\napi_accept_seconds_count{status="503"} 5\n'
                          'api_accept_seconds_count{status="500"} 1\n')
    [r] = evaluate({API: deltas(before, after)})
    assert (r.bad, r.total) == (1, 1001)
    restarted = deltas(parse_samples("x_total 50\n"), parse_samples("x_total 3\n"))
    assert restarted == [Sample("x_total", (), 3.0)]


def test_the_report_says_what_is_unknown_and_why() -> None:
    text = render(evaluate({SENDERS: []}), {API: "did not answer at http://127.0.0.1:1/metrics (refused)"}, {},
                  over="the last 10 s")
    lines = text.splitlines()
    assert lines[0] == "SLOs over the last 10 s:"
    assert "accepts succeed" in lines[1] and "unknown: api not read" in lines[1]
    assert all("no events yet" in line for line in lines[2:5])
    assert lines[-1] == "api: did not answer at http://127.0.0.1:1/metrics (refused)"


def test_dedupctl_slo_reads_a_running_senders_endpoint(capsys: pytest.CaptureFixture[str]) -> None:
    server = serve_metrics(_senders(), 0)
    try:
        port = server.server_address[1]
        dead = Settings().with_overrides(api={"port": 9})  # nothing listens on the discard port
        args = argparse.Namespace(api=None, senders=[f"http://127.0.0.1:{port}/metrics"], interval=0.0, timeout=2.0)
        assert cmd_slo(dead, args) == 1  # the API did not answer, and the transactional SLO is missed
    finally:
        server.shutdown()
    out = capsys.readouterr().out
    lines = {line.split("  ")[1].strip() if line.startswith("  ") else line: line for line in out.splitlines()}
    assert "99.000%" in lines["one-time codes at the provider within 5 s"]
    assert "met" in lines["one-time codes at the provider within 5 s"]
    assert "MISSED" in lines["transactional at the provider within 1 minute"]
    assert "error budget left -400.000%" in lines["transactional at the provider within 1 minute"]
    assert "unknown: api not read" in lines["accepts succeed (no 5xx)"]
    assert "api: did not answer at http://127.0.0.1:9/metrics" in out
    assert "sms    sms-a" in out and "9.99" in out


def test_a_service_whose_metrics_do_not_parse_is_named(capsys: pytest.CaptureFixture[str]) -> None:
    class Garbled(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802 - the stdlib's name
            body = b"api_requests_total{route=\"/v1\" 3\n"  # a label set that never closes
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *_: object) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Garbled)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        url = f"http://127.0.0.1:{server.server_address[1]}/metrics"
        args = argparse.Namespace(api=url, senders=[url], interval=0.0, timeout=2.0)
        assert cmd_slo(Settings(), args) == 1
    finally:
        server.shutdown()
    out = capsys.readouterr().out
    assert f"api: answered at {url} with metrics that do not parse" in out
    assert f"senders: answered at {url} with metrics that do not parse" in out
