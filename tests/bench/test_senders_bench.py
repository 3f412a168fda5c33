"""The delivery benchmark (bench/senders.py): its arithmetic, the messages it writes, and one
small run end to end on the test broker (real `dedupctl senders run` processes, the stubs, a
SQLite store) in which every message must arrive once."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from bench import senders_report as report
from bench.senders import main as bench_senders
from bench.senders_load import campaign_messages, code_message, profile_line
from operators.dedup_key import derive_dedup_key
from operators.records import Channel
from senders.profiles.importer import GoodLine, RawLine, parse_line


def test_delivery_window_rates() -> None:
    # 101 deliveries 10 ms apart: 100/s from the first to the last
    w = report.delivery_window([5.0 + i * 0.01 for i in range(101)])
    assert w["delivered"] == 101 and w["window_s"] == pytest.approx(1.0)
    assert w["rate"] == pytest.approx(100.0) and w["rate_10_90"] == pytest.approx(100.0)
    # a slow start (10 at 1/s) then 1,000 at 1,000/s: the 10-90% rate leaves the ramp out
    times = [float(i) for i in range(10)] + [10 + i / 1000 for i in range(1000)]
    w = report.delivery_window(times)
    assert w["rate"] == pytest.approx(1009 / 10.999)
    assert w["rate_10_90"] == pytest.approx(1000.0, rel=0.01)
    assert report.delivery_window([1.0])["rate"] is None


def test_latency_join_and_percentiles_with_missing() -> None:
    claims = {"a": 1000.0, "b": 1000.0, "c": 2000.0, "never": 0.0}
    arrivals = {"a": 1.2, "b": 1.05, "c": 2.5, "unclaimed": 9.0}
    assert report.latency_ms(claims, arrivals) == pytest.approx([50.0, 200.0, 500.0])
    values = [float(v) for v in range(1, 101)]  # 1 .. 100 ms
    s = report.latency_summary(values)
    assert (s["n"], s["p50"], s["p99"], s["max"]) == (100, 50.0, 99.0, 100.0)
    # two of 102 never arrived: slower than all, so the p99 is not reached within the run
    s = report.latency_summary(values, missing=2)
    assert (s["missing"], s["p50"], s["p99"], s["max"]) == (2, 51.0, None, None)
    assert report.latency_summary([])["p50"] is None


def test_per_message_prometheus_and_in_flight() -> None:
    text = (
        "# TYPE sender_store_transactions_total counter\n"
        'sender_store_transactions_total{channel="sms",lane="normal"} 300\n'
        'sender_store_transactions_total{channel="sms",lane="priority"} 12\n'
        'sender_deliveries_total{channel="sms",lane="normal",outcome="sent",provider="x"} 100\n'
        'sender_deliveries_total{channel="sms",lane="normal",outcome="retried",provider="x"} 7\n'
    )
    assert report.prometheus_sum(text, "sender_store_transactions_total") == 312
    assert report.prometheus_sum(text, "sender_deliveries_total", outcome="sent") == 100
    assert report.prometheus_sum(text, "sender_store_transactions") is None  # absent: n/a, not 0
    assert report.per_message(312, 100) == pytest.approx(3.12)
    assert report.per_message(None, 100) is None and report.per_message(5, 0) is None
    series = [(0.0, 0), (1.0, 400), (2.0, 390), (3.0, 410), (4.0, 0)]
    assert report.mean_in_flight(series, 0.5, 3.5) == pytest.approx(400.0)
    assert report.to_monotonic(1_000.5, 900.0) == pytest.approx(100.5)


def test_tables_say_n_a_and_the_bound() -> None:
    run = {"channel": "sms", "store": "postgresql", "processes": 2, "latency_ms": 200, "messages": 3000,
           "delivered": 1200, "complete": False, "rate": 20.0, "rate_10_90": None,
           "claim_to_provider_ms": {"p50": 3.0, "p99": 9.5}, "peak_in_flight": 2,
           "store_tx_per_message": {"pg_xact_commit": 3.25, "counter": None},
           "cpu_us_per_message": {"senders": 1400.0, "stub": 40.0}, "repeated_key_calls": 0}
    table = report.throughput_table([run])
    row = table.splitlines()[2]
    assert row.startswith("| sms | postgresql x2 | 200 ms | 1,200/3,000 (bound) | 20 | n/a | 3 / 10 ms | 2 |")
    assert "| 3.25 / n/a |" in row and "| 1,400 | 40 | 0 |" in row
    assert len(table.splitlines()[1].split("|")) == len(table.splitlines()[0].split("|"))


def test_messages_carry_the_jobs_keys_and_profiles_import() -> None:
    [m] = campaign_messages("r1", Channel.EMAIL, 1, 1_796_115_600_000)
    dedup = derive_dedup_key("u-0", "eid_sale", {"pct": "20", "campaign": "r1"})
    assert m["message_key"] == f"{dedup}:email:1796115600000" and m["dedup_key"] == dedup
    assert (m["user_id"], m["category"], m["priority"]) == ("u-0", "marketing", "normal")
    code = code_message("r1", 3, 5)
    assert code["message_key"].endswith(":sms:5") and code["priority"] == "high" and code["template_id"] == "otp"
    good = parse_line(RawLine(1, profile_line("otp-3", 3, prefix="1666").encode(), 0), 512)
    assert isinstance(good, GoodLine) and good.user_id == "otp-3" and good.profile.contacts.sms[0].address == "+16660000003"
    with pytest.raises(ValueError, match="out of range"):
        profile_line("u", 10_000_000)


@pytest.mark.integration
def test_a_small_run_delivers_every_message_once(kafka_bootstrap: str, tmp_path: Path) -> None:
    code = bench_senders([
        "--bootstrap", kafka_bootstrap, "--channels", "sms,email", "--stores", "sqlite", "--latencies", "0",
        "--users", "40", "--bound-s", "120", "--isolation-stores", "sqlite", "--campaign", "300", "--codes", "20",
        "--code-rate", "40", "--isolation-bound-s", "120", "--partitions", "2", "--out", str(tmp_path),
    ])
    [path] = tmp_path.glob("senders-*-quick.json")
    result = json.loads(path.read_text())
    assert code == 0 and result["failures"] == []
    assert [(r["channel"], r["store"]) for r in result["runs"]] == [("sms", "sqlite"), ("email", "sqlite")]
    for r in result["runs"]:
        assert (r["delivered"], r["complete"], r["repeated_key_calls"], r["unexpected_keys"]) == (40, True, 0, 0)
        assert r["statuses"] == {"sent": 40}
        assert r["claim_to_provider_ms"]["n"] == 40 and r["claim_to_provider_ms"]["p50"] >= 0
        assert r["rate"] > 0 and r["cpu_us_per_message"]["senders"] > 0
    [phase] = result["priority_lane"]
    assert phase["code_latency_ms"]["n"] == 20 and phase["code_latency_ms"]["missing"] == 0
    assert phase["repeated_key_calls"] == 0 and phase["campaign_delivered"] > 0
    assert not math.isnan(phase["code_latency_ms"]["p99"])
    assert [i["profiles"] for i in result["imports"]] == [40, 40, 320]
    assert "| sms | sqlite | 0 ms | 40/40 |" in (tmp_path / path.name.replace(".json", ".md")).read_text()
